"""Malleable Equipartition (Fujiwara et al.): share out all GPUs again at every event.

At each decision the queued jobs *and* the running malleable jobs are shared
out anew, over the vacant GPUs plus the GPUs those running jobs hold, by the
same Equipartition as the moldable policy (`equipartition.py`: p_min, p_max,
D'Hondt, shares of a GPU where the profile allows them). A running
job whose share changes is suspended at its next step and started again on its
new count from its checkpoint; that preemption is the cost `t_pm` of the paper
(the simulator's launch and suspend overheads, the real cost in the daemon).

Choices where the paper leaves room or does not fit a node-level broker:

* the guard: a running job is preempted only when its run is expected to end
  more than `preempt_guard` (300 s, the paper's) from now; rigid jobs, jobs without
  an estimate (`Job.expected_end`, set by the driver from the profile) and
  multi-node runs keep their GPUs;
* sticky placement: a running job is placed on its own node and GPUs first,
  and one left there on its count keeps running (the paper's reallocation is
  "unrestricted"; moving it would cost t_pm for nothing); but a node left
  with no job and vacant GPUs takes a job, running or waiting, that gets more
  GPUs there (no node idles beside a crowded one, nor beside a job short of
  GPUs that others hold);
* a run is not reshaped at the instant it started (with no cost, plans
  remade at one instant once a job may change node moved jobs forever);
* reshape, then start: if the new shares need suspensions, a decision asks for
  those alone, and the starts follow once every suspension is done, on the
  GPUs they left (a start never waits for GPUs someone still holds);
* a job lives on one node; strict FIFO as in the other policies.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from marbled.core.model import Job, JobState, State, Suspend
from marbled.core.policy.base import Option, Policy, fifo_candidates, resizing
from marbled.core.policy.equipartition import UNITS, free_units, in_node_order, plan

GUARD_S = 300.0  # Fujiwara et al.: preempt only tasks with more than 300 s to go


class MalleableEquipartition(Policy):
    name = "malleable"
    reshapes = True
    summary = ("Equipartition of all GPUs at every event, running jobs reshaped by "
               "suspend/resume (Fujiwara et al.)")
    options = (Option("preempt_guard", GUARD_S, "a running job is reshaped only if its "
                      "profile says it has more than this many seconds left"),)
    preempt_guard: float

    def movable(self, job: Job, now: float) -> bool:
        """May this running job be reshaped now?"""
        return (job.state is JobState.RUNNING and job.malleable and job.nodes == 1
                and job.expected_end is not None
                and job.expected_end - now > self.preempt_guard
                and job.run_started is not None and now > job.run_started)

    def choose(self, state: State, now: float) -> list:
        engaged = state.engaged()
        if resizing(engaged):
            return []  # a reshape is under way: decide on the GPUs it leaves
        movable = [j for j in engaged if self.movable(j, now)]
        free = free_units(state)
        for job in movable:  # their GPUs count as free, for the plan
            p = job.placement
            for g in p.gpus:
                gpus = free.setdefault(p.node, {})
                gpus[g] = gpus.get(g, 0) + UNITS // p.share
        everything = in_node_order(state, free)
        free = {n: dict(gpus) for n, gpus in everything.items()}
        waiting = _Replay(fifo_candidates(state, now))  # read only as far as a plan goes
        kept: set[int] = set()  # running jobs a reshape would give back their own count
        for _ in range(len(movable) + 1):
            running = [j for j in movable if j.id not in kept]
            grants = self._plan(waiting, running, free, running)
            reshaped = [j for j in running
                        if j.id not in grants or not grants[j.id].same_as(j.placement)]
            if not reshaped:
                # Nobody moves: the waiting jobs of the plan start on the free GPUs.
                return [grants[i].start(state.jobs[i]) for i in sorted(grants)
                        if state.jobs[i].placement is None]
            # Once they are suspended, the next decision plans them as waiting jobs (and
            # every other movable job as running): one it would give its count back to is
            # left running instead.
            after = self._plan(waiting, movable, everything,
                               [j for j in movable if j not in reshaped])
            back = {j.id for j in reshaped if _count(after.get(j.id)) == _count(j.placement)}
            if not back:
                return [Suspend(j.id, None, "equipartition") for j in reshaped]
            kept |= back
            for job in movable:  # a kept job's GPUs are not the plan's to share
                if job.id in back:
                    for g in job.placement.gpus:
                        free[job.placement.node][g] -= UNITS // job.placement.share
        return []

    @staticmethod
    def _plan(waiting: Iterable[Job], running: list[Job], free: dict[str, dict[int, int]],
              staying: list[Job]) -> dict:
        """The Equipartition plan for the waiting and running jobs in FIFO order; `staying`
        are those that run now (the others count as waiting)."""
        room = {n: {g: u for g, u in gpus.items() if u > 0} for n, gpus in free.items()}
        return plan(heapq.merge(waiting, running, key=lambda j: j.id),
                    {n: gpus for n, gpus in room.items() if gpus},
                    {j.id: j.placement for j in staying})


class _Replay:
    """The waiting jobs, read lazily and kept: each plan of a decision reads them from the
    front again, but only as far as it needs (a plan stops once the queue fills the GPUs),
    so a decision costs what the head of a long queue costs, not the whole queue."""

    def __init__(self, jobs: Iterator[Job]):
        self._jobs, self._read = jobs, []

    def __iter__(self) -> Iterator[Job]:
        i = 0
        while True:
            if i == len(self._read):
                job = next(self._jobs, None)
                if job is None:
                    return
                self._read.append(job)
            yield self._read[i]
            i += 1


def _count(p) -> tuple[int, int] | None:
    return (len(p.gpus), p.share) if p is not None else None
