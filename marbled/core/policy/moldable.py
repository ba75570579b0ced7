"""Moldable Equipartition (Fujiwara et al.): share the vacant GPUs out when jobs start.

Each waiting job may get between p_min and p_max GPUs: p_max is its demand
(the profile's optimal count), p_min is 1 for a malleable job and its demand for
a rigid one. At each decision, with Q the eligible waiting jobs and A the vacant
GPUs:

1. congested, sum(p_min) >= |A|: every job gets p_min;
2. light, sum(p_max) <= |A|: every job gets p_max;
3. otherwise every job gets p_min and the spare GPUs go out one at a time by
   D'Hondt, votes = p_max (the next GPU to the job with the largest
   p_max / (s + 1); ties to the older job).

Running jobs are never touched (that is the *malleable* variant, not built
yet). Choices where the paper leaves room or does not fit a node-level broker:

* no fractional GPUs: the paper's case 4 (1/n of a GPU) needs a profile that
  says a model tolerates sharing, which ours do not; congestion gives p_min;
* a job lives on one node: it takes the first node with its share free, else
  the node with most free GPUs if that holds at least p_min;
* strict FIFO, as for the other policies: a job that fits nowhere blocks those
  behind it;
* a job started on fewer GPUs than its demand is marked SECONDARY.
"""

from __future__ import annotations

from marbled.core.model import Job, Role, Start, State
from marbled.core.policy.base import fifo_candidates


def dhondt(minimum: list[int], votes: list[int], seats: int) -> list[int]:
    """Add `seats` to `minimum`, each to the largest votes/(share+1) below its vote."""
    shares = list(minimum)
    for _ in range(seats):
        open_ = [k for k in range(len(shares)) if shares[k] < votes[k]]
        if not open_:
            break
        best = max(open_, key=lambda k: (votes[k] / (shares[k] + 1), -k))
        shares[best] += 1
    return shares


def p_min(job: Job) -> int:
    return 1 if job.malleable else job.demand


def equipartition(jobs: list[Job], vacant: int) -> list[int]:
    """Each job's GPU share of `vacant` GPUs, in the order given (the three cases above)."""
    low = [p_min(job) for job in jobs]
    high = [job.demand for job in jobs]
    if sum(low) >= vacant:
        return low
    if sum(high) <= vacant:
        return high
    return dhondt(low, high, vacant - sum(low))


def first_jobs(jobs, vacant: int) -> list[Job]:
    """The jobs, read only as far as it matters: once the p_min of those read fill the
    vacant GPUs, it is the congested case and nobody further gets any."""
    out, need = [], 0
    for job in jobs:
        out.append(job)
        need += p_min(job)
        if need >= vacant:
            break
    return out


def fit(room: dict[str, int], share: int, low: int,
        prefer: str | None = None) -> tuple[str, int] | None:
    """(node, GPU count) for a job of `share` GPUs that accepts `low`, given the free GPUs
    per node: the preferred node if its share fits there, else the first node it fits on,
    else the node with most room if that holds `low`; None if no node does."""
    if prefer is not None and room.get(prefer, 0) >= share:
        return prefer, share
    fits = [n for n in room if room[n] >= share]
    if fits:
        return fits[0], share
    node = max(room, key=room.__getitem__)
    return (node, room[node]) if room[node] >= low else None


def start_share(job: Job, free: dict[str, list[int]], node: str, count: int) -> Start:
    """Start `job` on the lowest `count` free GPUs of `node`, taken out of `free`; a job
    below its demand is marked SECONDARY (for the schedule; it is never promoted)."""
    gpus, free[node] = free[node][:count], free[node][count:]
    role = Role.PRIMARY if count == job.demand else Role.SECONDARY
    return Start(job.id, node, tuple(gpus), role)


class MoldablePolicy:
    name = "moldable"

    def decide(self, state: State, now: float = 0.0) -> list:
        actions: list = []
        free = {n: state.free(n) for n in state.nodes_with_free_gpus()}
        vacant = sum(len(g) for g in free.values())
        if not vacant:
            return actions
        queue = first_jobs(fifo_candidates(state, actions, now), vacant)
        for job, share in zip(queue, equipartition(queue, vacant), strict=True):
            spot = fit({n: len(g) for n, g in free.items()}, share, p_min(job))
            if spot is None:
                break
            actions.append(start_share(job, free, *spot))
        return actions

    def next_decision(self, state: State, now: float) -> float | None:
        return None  # events alone drive this policy
