"""Decide and apply: the step the daemon and the simulator share.

A driver feeds an event into the `State`, then takes every action the policy
wants at that moment from `settle()`: each decision is applied to the state and
handed to the driver one action at a time, and the policy decides again (on the
state the driver has updated meanwhile, e.g. with a run's expected end) until it
has nothing more to do.

Lifecycle I6 (moves pay): a policy's `Suspend` of a run that has not reported its
first step is not taken (`starting_up()`); both drivers refuse it through `settle()`'s
`refuse`, each with its own word on whether the run trains (the daemon: the run's
progress report; the simulator: its start-up cost has passed), and decide again
when it may (the daemon: each monitor interval; the simulator: at its first step).
Cancels and drains are not the policy's Suspends and are never held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from marbled.core.model import Action, Job, JobState, State, Suspend
from marbled.core.policy.base import Policy

MAX_ROUNDS = 10_000  # a policy that acts this often with no event in between is broken


class RunawayPolicy(RuntimeError):
    """The policy keeps acting at one instant: it would never let time advance."""


def starting_up(action: Action, state: State, trains: Callable[[int], bool]) -> bool:
    """Is `action` a policy's reshape of a run still starting up: a `Suspend` of a running
    job whose current run has not reported its first step (`trains(job_id)`: the driver's
    word)? Such a move is not taken (lifecycle I6): the run has trained nothing yet, and
    stopping it now throws its start-up away (10 s of imports, for torch) for nothing."""
    return isinstance(action, Suspend) and \
        state.jobs[action.job].state is JobState.RUNNING and not trains(action.job)


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
