"""A small discrete-event simulator that drives the same policy objects as the daemon.

Progress follows the profile curves; a launch costs `launch_s` before the
first step (interpreter, framework, restore) and a suspension costs
`suspend_s` between the request and the exit (the checkpoint), both with the
GPUs held. Time is virtual, so a job set of the paper runs in microseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from marbled.core.model import Job, JobState, Role, Start, State, Suspend
from marbled.core.policy import Policy
from marbled.core.profiles import ProfileBook
from marbled.core.spec import JobSpec, size_job


@dataclass(frozen=True)
class SimRun:
    job: int
    node: str
    gpus: tuple[int, ...]
    role: Role
    start: float
    end: float
    start_step: int
    end_step: int
    reason: str  # 'done' or 'suspended'


@dataclass
class SimResult:
    runs: list[SimRun]
    completion: dict[int, float]

    @property
    def makespan(self) -> float:
        return max(self.completion.values(), default=0.0)


@dataclass
class _Live:
    run_start: float
    progress_from: float  # when the first step starts (after the launch cost)
    start_step: float
    rate: float
    stop_at: float | None = None  # set when a suspension is under way

    def steps_at(self, t: float) -> float:
        return self.start_step + max(0.0, t - self.progress_from) * self.rate


@dataclass
class Simulator:
    book: ProfileBook
    policy: Policy
    gpus_per_node: int
    nodes: int = 1
    launch_s: float = 0.0
    suspend_s: float = 0.0
    runs: list[SimRun] = field(default_factory=list)

    def run(self, specs: list[JobSpec]) -> SimResult:
        state = State(
            nodes={
                f"node{i}": State.single_node(self.gpus_per_node, f"node{i}").nodes[f"node{i}"]
                for i in range(self.nodes)
            }
        )
        steps: dict[int, float] = {}
        models: dict[int, str] = {}
        for i, spec in enumerate(specs, start=1):
            sizing = size_job(spec, self.book, self.gpus_per_node)
            state.submit(Job(i, sizing.demand, sizing.malleable, tuple(spec.after)))
            steps[i] = float(spec.steps)
            models[i] = spec.model
        done: dict[int, float] = {i: 0.0 for i in steps}
        live: dict[int, _Live] = {}
        completion: dict[int, float] = {}
        t = 0.0

        def end_run(job_id: int, reason: str, at_step: float) -> None:
            lv = live.pop(job_id)
            job = state.jobs[job_id]
            self.runs.append(
                SimRun(job_id, job.placement.node, job.gpus, job.role, lv.run_start, t,
                       round(lv.start_step), round(at_step), reason)
            )

        for _ in range(100_000):
            for action in self.policy.decide(state):
                job = state.apply(action)
                if isinstance(action, Start):
                    rate = self.book.lookup(models[job.id]).throughput(len(action.gpus))
                    live[job.id] = _Live(t, t + self.launch_s, done[job.id], rate)
                elif isinstance(action, Suspend):
                    live[job.id].stop_at = t + self.suspend_s
                else:
                    completion[job.id] = t
            if not state.active():
                return SimResult(self.runs, completion)
            # The next event: a job reaching its last step, or a suspension ending.
            nxt, who, what = math.inf, None, None
            for job_id, lv in live.items():
                left = steps[job_id] - lv.steps_at(t)
                finish = max(t, lv.progress_from) + left / lv.rate
                if lv.stop_at is not None and lv.stop_at < finish:
                    if lv.stop_at < nxt:
                        nxt, who, what = lv.stop_at, job_id, "suspended"
                elif finish < nxt:
                    nxt, who, what = finish, job_id, "done"
            if who is None:
                raise RuntimeError("simulation is stuck: jobs wait but nothing runs")
            t = nxt
            lv = live[who]
            if what == "done":
                end_run(who, "done", steps[who])
                state.finished(who, JobState.DONE)
                completion[who] = t
            else:
                # The checkpoint holds the last whole step reached before the request.
                reached = math.floor(lv.steps_at(lv.stop_at - self.suspend_s))
                done[who] = float(reached)
                end_run(who, "suspended", reached)
                state.suspended(who)
        raise RuntimeError("simulation did not converge")
