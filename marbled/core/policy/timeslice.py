"""Time slicing in the style of Gandiva (Xiao et al., OSDI 2018) for an over-subscribed node.

Every job runs on its demand (the profile's optimal count). When jobs wait and
no node has room for the next one, running jobs whose run has lasted a full
slice are suspended -- oldest run first, only as many as the next waiting job
needs -- and the waiting jobs start, the least recently run first: round robin
over the queue. A job that never ran goes before every job that has. Rigid jobs
(explicit GPU count) are never suspended. With no one waiting, nothing is
suspended: time slicing only pays when the node is over-subscribed.

Gandiva also packs and migrates jobs and grows them when the cluster is idle;
those are not part of this policy.
"""

from __future__ import annotations

from collections.abc import Iterator

from marbled.core.model import Job, JobState, Role, Start, State, Suspend
from marbled.core.policy.base import Option, Policy, fifo_candidates


class TimeslicePolicy(Policy):
    name = "timeslice"
    reshapes = True
    summary = "round robin of time slices when over-subscribed (Gandiva)"
    options = (Option("time_slice", 600.0, "seconds a job runs before it may be suspended "
                      "for a waiting one", positive=True),)
    time_slice: float

    def _queue(self, state: State, now: float) -> Iterator[Job]:
        """Eligible waiting jobs, those that never ran first (FIFO), then least recently run.

        Lazy: a decision stops at the first job that does not fit, so on a long queue
        of new jobs it reads only the front (sorting all of it made this policy slow)."""
        ran = []
        for job in fifo_candidates(state, now):
            if job.run_started is None:
                yield job
            else:
                ran.append(job)
        yield from sorted(ran, key=lambda j: (j.run_started, j.id))

    def _expired(self, state: State, now: float) -> list:
        return sorted(
            (j for j in state.engaged()
             if j.state is JobState.RUNNING and j.malleable
             and (j.run_started or 0.0) + self.time_slice <= now),
            key=lambda j: (j.run_started or 0.0, j.id))

    def choose(self, state: State, now: float) -> list:
        actions: list = []
        free = {n: state.free(n) for n in state.nodes}
        queue = self._queue(state, now)
        head = None
        most = max(map(len, free.values()), default=0)  # no node has more free GPUs
        for job in queue:
            node = next((n for n in free if len(free[n]) >= job.demand), None) \
                if job.demand <= most else None
            if node is None:
                head = job
                break
            gpus, free[node] = free[node][: job.demand], free[node][job.demand:]
            actions.append(Start(job.id, node, tuple(gpus), Role.PRIMARY))
        if head is None:
            return actions
        # Someone waits: make room for the next in line from runs whose slice is over.
        expired = self._expired(state, now)
        for node in state.nodes:
            room, chosen = len(free[node]), []
            for job in (j for j in expired if j.placement.node == node):
                if room >= head.demand:
                    break
                chosen.append(job)
                room += len(job.gpus)
            if room >= head.demand and chosen:
                actions += [Suspend(j.id, None, "time slice") for j in chosen]
                break
        return actions

    def next_decision(self, state: State, now: float) -> float | None:
        """The end of the next slice, while anyone waits."""
        if next(state.waiting(), None) is None:
            return None
        ends = [(j.run_started or 0.0) + self.time_slice for j in state.engaged()
                if j.state is JobState.RUNNING and j.malleable]
        return min(ends, default=None)
