"""MARBLE: Algorithm 1 of Han et al., CCGrid 2020, with promotion of secondaries.

How we read the paper where it leaves room:

* "Available GPUs" for a promotion counts the free GPUs *plus the GPUs the
  secondary already holds*. Figure 5 needs this reading: when ResNet-50 (3 GPUs)
  ends, only 3 GPUs are free, yet Inception-v3 (optimal 4, secondary on 3) is
  resumed on 4 and VGG-16 gets the 2 left over. The same reading gives the job
  set 2 walk-through (ResNet-101 on 2 -> 3 when Inception-v3 ends).
* A secondary is promoted only when it can reach its optimal count (a primary
  is by definition on its optimal count); it keeps its own GPUs and takes the
  lowest free ones. When several secondaries could be promoted, the oldest goes
  first. The GPUs of the promotion are reserved at once, so the FIFO walk that
  follows in the same decision (line 10 of Algorithm 1) only sees what is left.
* Promotion is checked at every decision, not only when a job ends: any event
  that frees GPUs (an exit, a failure, a cancel) is "a job is finished" here.
* run_multiple_jobs() walks the FIFO, skipping jobs whose dependencies are not
  met. A job that fits its optimal count on some node starts there as primary;
  otherwise a malleable job starts as secondary on all the free GPUs of the
  node with most free GPUs. A rigid job (explicit GPU count) that does not fit
  blocks the queue: we do not backfill past the head, to keep the FIFO order.
* A job that asks for K nodes starts as a primary when K nodes each have its
  GPU count free (the first such nodes); it never runs as a secondary, and
  waiting for its nodes it blocks the queue like a rigid job.
* A suspended job without a reservation (suspended at shutdown or after a
  broker restart) waits at its original FIFO position like a queued one; one
  suspended for a promotion is resumed on its reserved GPUs (`Policy.decide`).

On several nodes (the paper's broker had one), GPUs the FIFO walk leaves idle
also promote: a secondary that cannot reach its optimal count on its own node
moves to another node where it gets more GPUs (its optimum, or as many as that
node has free), or grows on its own node to a better count short of the
optimum, whenever its curve says the time its remaining steps save exceeds its
suspend and resume cost. These promotions only use GPUs no waiting job can
take, and only with several nodes: on one node the schedule is the paper's.
"""

from __future__ import annotations

from marbled.core.model import Job, Placement, Role, Start, State, Suspend
from marbled.core.policy.base import (
    Policy,
    fifo_candidates,
    reshape_pays,
    settled,
    start_on,
)
from marbled.core.policy.spread import take_spread


class MarblePolicy(Policy):
    name = "marble"
    summary = "optimal GPU counts + secondaries + promotion (Algorithm 1)"
    promotes = True  # the daemon may prestart the next runs of secondaries
    shrinks = True  # a job whose runs measured fewer GPUs faster (see _shrink)

    def shrinks_now(self, job: Job, now: float) -> bool:
        return len(job.gpus) > job.demand and shrinkable(job, now)
    multi_node = True  # places jobs that ask for several nodes (as primaries)

    def choose(self, state: State, now: float) -> list:
        actions: list = []
        # Only nodes with free GPUs can promote or start anything.
        free = {n: state.free(n) for n in state.nodes_with_free_gpus()}

        # Algorithm 1, lines 5-9: promote running secondaries that can now reach optimal.
        promoted: set[int] = set()
        for node in free:
            for job in state.running_secondaries(node):
                extra = job.demand - len(job.gpus)
                if 0 < extra <= len(free[node]):
                    taken, free[node] = free[node][:extra], free[node][extra:]
                    target = Placement(node, tuple(sorted(job.gpus + tuple(taken))))
                    actions.append(Suspend(job.id, target, job.move or "promote"))
                    promoted.add(job.id)

        # run_multiple_jobs(), lines 14-21.
        for job in fifo_candidates(state, now):
            parts = take_spread(free, job)
            if parts:
                actions.append(start_on(job, parts, Role.PRIMARY))
            elif job.malleable and job.nodes == 1 and any(free.values()) and \
                    job.fit(max(len(g) for g in free.values())):
                node = max(free, key=lambda n: len(free[n]))
                count = job.fit(len(free[node]))  # all of them, unless its curve rules that out
                gpus, free[node] = free[node][:count], free[node][count:]
                actions.append(Start(job.id, node, tuple(gpus), Role.SECONDARY))
            else:
                break
        if len(state.nodes) > 1:  # one node: exactly the paper's promotions
            actions += self._promote_into_idle(state, free, promoted, now)
        return actions + self._shrink(state, now)

    @staticmethod
    def _shrink(state: State, now: float) -> list:
        """Running jobs above their demand (their runs measured fewer GPUs faster) back down
        to it, keeping their lowest GPUs, when the move pays; a profile's demand is never
        below the GPUs a job holds, so without learning this does nothing."""
        actions = []
        for job in state.above_demand():
            if shrinkable(job, now):
                gpus = job.gpus[:job.fit(job.demand) or job.demand]
                actions.append(Suspend(job.id, Placement(job.placement.node, gpus),
                                       job.move or "learned optimum"))
        return actions

    @staticmethod
    def _promote_into_idle(state: State, free: dict[str, list[int]], promoted: set[int],
                           now: float) -> list:
        """Secondaries to more GPUs that nothing else takes: on another node, or short of
        their optimum on their own, where that pays."""
        actions = []
        secondaries = sorted((j for n in state.nodes for j in state.running_secondaries(n)
                              if j.id not in promoted and j.placement.share == 1
                              and settled(j, now)), key=lambda j: j.id)
        for job in secondaries:
            own = job.placement.node
            options = [(job.fit(min(job.demand, len(job.gpus) + len(free.get(own, ())))), 0,
                        own)]
            options += [(job.fit(min(job.demand, len(gpus))), 1, n) for n, gpus in free.items()
                        if n != own]
            count, _, node = max(options, key=lambda o: (o[0] or 0, -o[1]))
            if count is None:
                continue
            if count <= len(job.gpus) or not _pays(job, count, now):
                continue
            if node == own:
                extra = count - len(job.gpus)
                taken, free[own] = free[own][:extra], free[own][extra:]
                gpus = tuple(sorted(job.gpus + tuple(taken)))
            else:
                gpus, free[node] = tuple(free[node][:count]), free[node][count:]
            actions.append(Suspend(job.id, Placement(node, gpus), job.move or "promote"))
        return actions


def shrinkable(job: Job, now: float) -> bool:
    """A job above its demand that a move down to it pays for now (see `_shrink`)."""
    return job.malleable and job.nodes == 1 and settled(job, now) \
        and _pays(job, job.demand, now)


def _pays(job: Job, count: int, now: float) -> bool:
    """A move to `count` GPUs pays if the curve says so; without one, only to the optimum."""
    pays = reshape_pays(job, count, now)
    return count == job.demand if pays is None else pays
