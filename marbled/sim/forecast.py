"""When a broker's queue should end: its unfinished jobs played forward in the simulator.

The jobs left (running ones first, then the FIFO) are simulated from now under the
broker's policy and curves, each with the steps it has left, so the forecast is what
`marble simulate` would say of the same queue. Running jobs are simulated as if started
again now (their GPUs may differ from the ones they hold), so it is a forecast, not a
promise; it is re-made on every request. A job the simulator cannot play (no model or
step count: a command with a fixed GPU count; a model with no curve yet) is
left out, with why, and so is every job that waits for one left out: the forecast is
then of the others alone.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from marbled.core.policy.base import Policy
from marbled.core.profiles import ProfileBook
from marbled.core.spec import JobSpec
from marbled.sim.engine import Simulator, WorkloadError
from marbled.sim.workloads import Arrival

MAX_JOBS = 2000  # more would make a status request take seconds
BUDGET_S = 2.0  # CPU time a forecast may take before it gives up


class _OverBudget(Exception):
    pass


class _Budgeted:
    """The policy, but a decision after the deadline ends the simulation."""

    def __init__(self, policy: Policy, deadline: float):
        self._policy, self._deadline = policy, deadline

    def __getattr__(self, name: str):
        return getattr(self._policy, name)

    def decide(self, state, now: float) -> list:
        if time.monotonic() > self._deadline:
            raise _OverBudget
        return self._policy.decide(state, now)


class Left(NamedTuple):
    """An unfinished job as the forecast sees it (a tuple: a broker's forecast makes one for
    each job queued, 0.5 us each against a frozen dataclass's 1.2)."""

    id: int
    spec: JobSpec
    steps_left: int
    running: bool
    after: tuple[int, ...] = ()  # the jobs it waits for (resolved ids)


@dataclass(frozen=True)
class Forecast:
    finish_at: float | None  # when the last job should end (None: cannot say)
    reason: str | None  # why not
    ends: dict[int, tuple[float, float]]  # job id -> (expected start, expected end)
    left_out: dict[int, str] = field(default_factory=dict)  # job id -> why it is not in it


def forecast(jobs: list[Left], book: ProfileBook, policy: Policy, node_sizes: list[int],
             now: float, scale: float = 1.0, budget_s: float = BUDGET_S,
             unfit: Mapping[int, str] | None = None) -> Forecast:
    """`scale`: broker seconds per profiled second (--time-scale for emulated jobs); a
    simulation that needs more than `budget_s` gives up and says so. `unfit`: the jobs the
    nodes can never hold (`State.unfit`), left out with why."""
    unfit = unfit or {}
    left_out = {**{i: f"it cannot run in this allocation: {why}" for i, why in unfit.items()},
                **unplayable([j for j in jobs if j.id not in unfit], book)}
    jobs = [j for j in jobs if j.id not in left_out]
    if not jobs:  # nothing left, or nothing it can play (then it cannot say when it ends)
        return Forecast(None, "it can simulate none of the jobs left", {}, left_out) \
            if left_out else Forecast(now, None, {})
    if len(jobs) > MAX_JOBS:
        return Forecast(None, f"{len(jobs)} jobs left; forecasts stop at {MAX_JOBS}", {})
    if len(set(node_sizes)) != 1:
        return Forecast(None, "the simulator models nodes of one size", {})
    order = sorted(jobs, key=lambda j: (not j.running, j.id))
    position = {j.id: i for i, j in enumerate(order, start=1)}
    arrivals = [Arrival(0.0, JobSpec(
        emulate=True, model=j.spec.model, steps=max(j.steps_left, 1), gpus=j.spec.gpus,
        nodes=j.spec.nodes, nodes_min=j.spec.nodes_min,
        after=tuple(position[a] for a in j.after if a in position)), where=f"job {j.id}")
        for j in order]
    budgeted = _Budgeted(policy.fresh(), time.monotonic() + budget_s)
    try:
        result = Simulator(book, budgeted, node_sizes[0], len(node_sizes)).run(arrivals)
    except _OverBudget:
        return Forecast(None, f"{len(jobs)} jobs left under {policy.name}: the forecast "
                              f"would take more than {budget_s:g} s", {}, left_out)
    except (WorkloadError, RuntimeError) as exc:
        return Forecast(None, f"cannot simulate the queue: {exc}", {}, left_out)
    ends = {j.id: (now + result.jobs[position[j.id]].first_start * scale,
                   now + result.jobs[position[j.id]].completion * scale) for j in order}
    return Forecast(max(end for _, end in ends.values()), None, ends, left_out)


def unplayable(jobs: list[Left], book: ProfileBook) -> dict[int, str]:
    """The jobs the simulator cannot play, and why: those it has no model, steps or curve
    for, and those that wait for one of them (their start depends
    on an end no one can forecast)."""
    out: dict[int, str] = {}
    for job in sorted(jobs, key=lambda j: j.id):  # a job waits only for earlier ones
        spec = job.spec
        waits = next((a for a in job.after if a in out), None)
        if not spec.model or not spec.steps:
            out[job.id] = "it has no model and step count to simulate"
        elif book.lookup(spec.model) is None:
            out[job.id] = f"model '{spec.model}' has no curve yet"
        elif waits is not None:
            out[job.id] = f"it waits for job {waits}, which is left out"
    return out
