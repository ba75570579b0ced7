"""Decide and apply: the step the daemon and the simulator share.

A driver feeds an event into the `State`, then takes every action the policy
wants at that moment from `settle()`: each decision is applied to the state and
handed to the driver one action at a time, and the policy decides again (on the
state the driver has updated meanwhile, e.g. with a run's expected end) until it
has nothing more to do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from marbled.core.model import Action, Job, State
from marbled.core.policy.base import Policy

MAX_ROUNDS = 10_000  # a policy that acts this often with no event in between is broken


class RunawayPolicy(RuntimeError):
    """The policy keeps acting at one instant: it would never let time advance."""


def settle(policy: Policy, state: State, now: float,
           refuse: Callable[[Action], bool] | None = None) -> Iterator[tuple[Action, Job]]:
    """Every action `policy` takes at `now`, applied; with the job as it is after it. An
    action `refuse` answers true for is dropped (the driver's guard against a livelock)."""
    for _ in range(MAX_ROUNDS):
        actions = policy.decide(state, now)
        if refuse is not None:
            actions = [a for a in actions if not refuse(a)]
        if not actions:
            return
        applied = [(action, state.apply(action, now)) for action in actions]
        yield from applied
    raise RunawayPolicy(f"policy {policy.name} keeps acting without any event")
