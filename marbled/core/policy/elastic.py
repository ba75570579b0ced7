"""Elastic sizing in the manner of ONES (Bian et al., 2021), in GPU counts.

ONES grows and shrinks each job's batch size and GPU count online. Its rules,
expressed in what this broker can do (suspend at a step, resume on another
count from the checkpoint):

* a new job starts small: on one GPU (a rigid job: its count), in FIFO order;
* when a job waits and no GPU is free, the running job with most GPUs gives
  half of them up (ONES takes GPUs from the largest jobs until every new job
  has one): it is suspended and resumed on the first half of its GPUs;
* free GPUs go to running jobs that have run stably for `grow_after` (ONES: a
  few epochs), smallest remaining GPU-time first (ONES's SRUF objective:
  GPUs held times the time left, from the driver's `expected_end`): each such
  job doubles its count, up to its demand (the profile's fastest count), on
  its own node, by suspend and resume on its GPUs plus free ones; when its node
  is full, on another node that has the doubled count free (unless its curve
  says the move costs more than it saves).

What ONES has and this does not: batch-size scaling and its learning-rate
rule, the evolutionary search over placements, a progress predictor, and
resizing in about a second without a checkpoint (here each resize costs a
suspend and a resume).
"""

from __future__ import annotations

from marbled.core.model import Job, JobState, Placement, State, Suspend
from marbled.core.policy.base import (
    Option,
    Policy,
    fifo_candidates,
    reshape_pays,
    resizing,
    role_for,
    start_on,
    take_nodes,
)

STABLE_S = 300.0


class ElasticPolicy(Policy):
    name = "elastic"
    reshapes = True
    summary = "start on 1 GPU, double when stable, halve the largest for a newcomer (after ONES)"
    options = (Option("grow_after", STABLE_S,
                      "seconds a run lasts before its GPUs may double"),)
    grow_after: float

    def choose(self, state: State, now: float) -> list:
        engaged = state.engaged()
        if state.resumable() or resizing(engaged):
            return []  # a resize is under way: decide on what it leaves
        actions: list = []
        free = {n: state.free(n) for n in state.nodes_with_free_gpus()}
        for job in fifo_candidates(state, now):
            count = job.fewest  # one GPU, unless its curve rules that out
            parts = take_nodes(free, 1, lambda _node, count=count: count)
            if parts is None:
                return actions + self._make_room(engaged)
            actions.append(start_on(job, parts, role_for(job, count)))
        return actions + self._grow(engaged, free, now)

    @staticmethod
    def _make_room(engaged: list[Job]) -> list:
        """Halve the running job with most GPUs (oldest first on ties), if any has two."""
        # Cheapest test first: under load nearly every job holds one GPU.
        big = [j for j in engaged if len(j.gpus) > 1 and j.malleable
               and j.state is JobState.RUNNING and j.nodes == 1 and j.placement.share == 1
               and j.fit(len(j.gpus) // 2)]
        if not big:
            return []
        job = max(big, key=lambda j: (len(j.gpus), -j.id))
        keep = job.gpus[: job.fit(len(job.gpus) // 2)]
        return [Suspend(job.id, Placement(job.placement.node, keep), "elastic: make room")]

    def _grow(self, engaged: list[Job], free: dict[str, list[int]], now: float) -> list:
        """Double stable jobs into the free GPUs, smallest remaining GPU-time first."""
        stable = [j for j in engaged if j.state is JobState.RUNNING and j.malleable
                  and j.nodes == 1 and j.placement.share == 1 and len(j.gpus) < j.demand
                  and j.expected_end is not None and j.expected_end - now > self.grow_after
                  and j.run_started is not None and now - j.run_started >= self.grow_after]
        actions = []
        for job in sorted(stable, key=lambda j: (len(j.gpus) * (j.expected_end - now), j.id)):
            node = job.placement.node
            count = job.fit(min(2 * len(job.gpus), job.demand))
            if count <= len(job.gpus):
                continue
            extra = count - len(job.gpus)
            if len(free.get(node, ())) >= extra:
                taken, free[node] = free[node][:extra], free[node][extra:]
                target = Placement(node, tuple(sorted(job.gpus + tuple(taken))))
                actions.append(Suspend(job.id, target, "elastic: grow"))
                continue
            # Its node is full: grow onto another node that has the doubled count free.
            other = next((n for n, gpus in free.items() if n != node and len(gpus) >= count),
                         None)
            if other is not None and reshape_pays(job, count, now) is not False:
                gpus, free[other] = tuple(free[other][:count]), free[other][count:]
                actions.append(Suspend(job.id, Placement(other, gpus), "elastic: grow"))
        return actions

    def next_decision(self, state: State, now: float) -> float | None:
        """When the next running job becomes stable enough to grow, while GPUs are free."""
        if not state.nodes_with_free_gpus():
            return None
        due = [(j.run_started or 0.0) + self.grow_after for j in state.engaged()
               if j.state is JobState.RUNNING and j.malleable and len(j.gpus) < j.demand
               and (j.run_started or 0.0) + self.grow_after > now]
        return min(due, default=None)
