"""Malleable Equipartition (Fujiwara et al.): share out all GPUs again at every event.

At each decision the queued jobs *and* the running malleable jobs are shared
out anew, over the vacant GPUs plus the GPUs those running jobs hold, by the
same Equipartition as the moldable policy (p_min, p_max, D'Hondt). A running
job whose share changes is suspended at its next step and started again on its
new count from its checkpoint; that preemption is the cost `t_pm` of the paper
(the simulator's launch and suspend overheads, the real cost in the daemon).

Choices where the paper leaves room or does not fit a node-level broker:

* the guard: a running job is preempted only when its run is expected to end
  more than `guard_s` (300 s, the paper's) from now; rigid jobs, jobs without
  an estimate (`Job.expected_end`, set by the driver from the profile) and
  multi-node runs keep their GPUs;
* sticky placement: a running job is placed on its own node first, and one
  left there on its count keeps its GPUs (the paper's reallocation is
  "unrestricted"; moving it would cost t_pm for nothing);
* reshape, then start: if the new shares need suspensions, a decision asks for
  those alone, and the starts follow once every suspension is done, on the
  GPUs they left (a start never waits for GPUs someone still holds);
* a job lives on one node (its own node first, then first fit, else the node
  with most room if that holds p_min); strict FIFO as in the other policies;
* no fractional GPUs, as for the moldable policy.
"""

from __future__ import annotations

import heapq

from marbled.core.model import Job, JobState, State, Suspend
from marbled.core.policy.base import fifo_candidates
from marbled.core.policy.moldable import equipartition, first_jobs, fit, p_min, start_share

GUARD_S = 300.0  # Fujiwara et al.: preempt only tasks with more than 300 s to go


class MalleablePolicy:
    name = "malleable"

    def __init__(self, guard_s: float = GUARD_S):
        if guard_s < 0:
            raise ValueError("the preemption guard cannot be negative")
        self.guard_s = guard_s

    def movable(self, job: Job, now: float) -> bool:
        """May this running job be reshaped now?"""
        return (job.state is JobState.RUNNING and job.malleable and job.nodes == 1
                and job.expected_end is not None and job.expected_end - now > self.guard_s)

    def decide(self, state: State, now: float = 0.0) -> list:
        actions: list = []
        engaged = state.engaged()
        if any(j.state is JobState.SUSPENDING for j in engaged):
            return actions  # a reshape is under way: decide on the GPUs it leaves
        movable = [j for j in engaged if self.movable(j, now)]
        free = {n: state.free(n) for n in state.nodes}
        room = {n: len(g) for n, g in free.items()}
        for job in movable:
            room[job.placement.node] += len(job.gpus)
        vacant = sum(room.values())
        if not vacant:
            return actions
        jobs = first_jobs(heapq.merge(fifo_candidates(state, actions, now), movable,
                                      key=lambda j: j.id), vacant)
        # First the counts: which node and how many GPUs each job gets.
        plan: dict[int, tuple[str, int]] = {}
        for job, share in zip(jobs, equipartition(jobs, vacant), strict=True):
            home = job.placement.node if job.placement else None
            spot = fit(room, share, p_min(job), home)
            if spot is None:
                break  # strict FIFO: the jobs behind it get nothing this time
            plan[job.id] = spot
            room[spot[0]] -= spot[1]
        reshaped = [Suspend(j.id, None, "equipartition") for j in movable
                    if plan.get(j.id) != (j.placement.node, len(j.gpus))]
        if reshaped:
            return actions + reshaped
        # Nobody moves: the waiting jobs of the plan start on the free GPUs.
        for job in jobs:
            if job.placement is None and job.id in plan:
                actions.append(start_share(job, free, *plan[job.id]))
        return actions

    def next_decision(self, state: State, now: float) -> float | None:
        return None  # events alone drive this policy
