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
* a job started on fewer GPUs than its demand is marked SECONDARY (for the
  schedule; this policy never promotes it).
"""

from __future__ import annotations

from marbled.core.model import Role, Start, State
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


class MoldablePolicy:
    name = "moldable"

    def decide(self, state: State, now: float = 0.0) -> list:
        actions: list = []
        free = {n: state.free(n) for n in state.nodes_with_free_gpus()}
        vacant = sum(len(g) for g in free.values())
        if not vacant:
            return actions
        # Read the queue only as far as it matters: once the p_min of the jobs read
        # fill the vacant GPUs, it is the congested case and nobody further gets any.
        queue, p_min = [], []
        for job in fifo_candidates(state, actions, now):
            queue.append(job)
            p_min.append(1 if job.malleable else job.demand)
            if sum(p_min) >= vacant:
                break
        p_max = [job.demand for job in queue]
        if sum(p_min) >= vacant:
            shares = p_min
        elif sum(p_max) <= vacant:
            shares = p_max
        else:
            shares = dhondt(p_min, p_max, vacant - sum(p_min))
        for job, share, low in zip(queue, shares, p_min, strict=True):
            fits = [n for n in free if len(free[n]) >= share]
            if fits:
                node = fits[0]
            else:
                node = max(free, key=lambda n: len(free[n]))
                share = len(free[node])
                if share < low:
                    break
            gpus, free[node] = free[node][:share], free[node][share:]
            role = Role.PRIMARY if share == job.demand else Role.SECONDARY
            actions.append(Start(job.id, node, tuple(gpus), role))
        return actions

    def next_decision(self, state: State, now: float) -> float | None:
        return None  # events alone drive this policy
