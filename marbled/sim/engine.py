"""A discrete-event simulator that drives the same policy objects as the daemon.

Progress follows the profile curves; a launch costs its model's `startup_s`
before the first step (interpreter, framework, restore) and a suspension its
`suspend_s` between the request and the exit (the checkpoint), both with the
GPUs held; `launch_s` and `suspend_s`, when given, override every model's.
As in the daemon (lifecycle I6), a policy's suspension of a run before its first step
(while its start-up lasts) is not taken: the policy decides again at that first step
(`core.decision.starting_up`). With `learning`, a run tells its model's start-up and
suspension costs as it tells its throughput, and the curves the policy reads carry them.
Time is virtual: a job set of the paper runs in microseconds, ten
thousand jobs on 64 nodes in seconds (`benchmarks/simulator_speed.py`).

A job on several nodes (a count, or a range placed by `core/policy/spread.py`) holds its
GPUs on every node of a run and trains at its curve's speed at its count on each node, as
the broker forecasts it and an emulated job trains: profiles are per node (docs/slurm.md).

Where the profile is wrong about a run's speed (`truth`), the policy reads the profile's
end until the run has trained `MEASURED_AFTER_S`, and the run's own end after it, as the
broker corrects a run's expected end from the speed it measures (`daemon/broker.py`).

A simulation may start from a live state (the what-if planner's, `core/policy/whatif.py`):
`running` names the jobs of the workload (submitted at or before 0) whose runs are under way at 0,
each with its placement, when its run started and when it trains from; the rest wait.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field, replace

from marbled.core.decision import RunawayPolicy, settle, starting_up
from marbled.core.learning import LearnedBook, Learning
from marbled.core.model import Job, JobState, Node, Placement, Role, Start, State, Suspend
from marbled.core.policy.base import Policy
from marbled.core.profiles import ProfileBook, ThroughputCurve
from marbled.core.shapes import shapes
from marbled.core.spec import JobSpec, SpecError, size_job
from marbled.sim.workloads import Arrival

# When the broker has measured a run's speed: its learner's tick (`learn_interval`) after
# the run's first step; policies then read the run's end at that speed.
MEASURED_AFTER_S = 30.0


class WorkloadError(SpecError):
    """A job of a workload that cannot be simulated; the message names where it was read."""

    def __init__(self, where: str, field: str, message: str):
        super().__init__(field, message)
        self.where = where

    def __reduce__(self):  # whole through pickle: a worker process's refusal reaches its pool
        return type(self), (self.where, self.field, self.message)

    def __str__(self) -> str:
        return f"{self.where}: {self.field}: {self.message}"


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
    share: int = 1  # n > 1: on 1/n of its one GPU
    others: tuple[tuple[str, tuple[int, ...]], ...] = ()  # a multi-node run's further nodes

    def parts(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """(node, GPU slots) for every node of the run, the first node first."""
        return Placement(self.node, self.gpus, self.others).parts()

    @property
    def gpu_fraction(self) -> float:
        """The GPUs it held on all its nodes: a count, or 1/n of one."""
        return _held(Placement(self.node, self.gpus, self.others, self.share))


@dataclass(frozen=True)
class JobStats:
    id: int
    model: str
    steps: int
    arrival: float
    first_start: float
    completion: float
    suspensions: int

    @property
    def wait(self) -> float:
        return self.first_start - self.arrival

    @property
    def jct(self) -> float:
        """Job completion time: from arrival to the end."""
        return self.completion - self.arrival


@dataclass
class SimResult:
    policy: str
    runs: list[SimRun]
    jobs: dict[int, JobStats]
    total_gpus: int
    overhead_gpu_seconds: float  # GPUs held while launching or checkpointing
    lower_bound: float

    @property
    def makespan(self) -> float:
        return max((j.completion for j in self.jobs.values()), default=0.0)

    @property
    def total_jct(self) -> float:
        return sum(j.jct for j in self.jobs.values())

    @property
    def average_jct(self) -> float:
        return self.total_jct / len(self.jobs) if self.jobs else 0.0

    @property
    def average_wait(self) -> float:
        return sum(j.wait for j in self.jobs.values()) / len(self.jobs) if self.jobs else 0.0

    @property
    def busy_gpu_seconds(self) -> float:
        return sum(r.gpu_fraction * (r.end - r.start) for r in self.runs)

    @property
    def utilization(self) -> float:
        """Share of the GPU-time up to the makespan that some job held."""
        span = self.makespan * self.total_gpus
        return self.busy_gpu_seconds / span if span else 0.0

    @property
    def overhead_share(self) -> float:
        busy = self.busy_gpu_seconds
        return self.overhead_gpu_seconds / busy if busy else 0.0

    @property
    def suspensions(self) -> int:
        return sum(j.suspensions for j in self.jobs.values())

    def busy_timeline(self) -> list[tuple[float, float]]:
        """(time, GPUs held from then on), one point per change."""
        deltas: dict[float, int] = {}
        for r in self.runs:
            deltas[r.start] = deltas.get(r.start, 0) + r.gpu_fraction
            deltas[r.end] = deltas.get(r.end, 0) - r.gpu_fraction
        out, busy = [], 0
        for t in sorted(deltas):
            busy += deltas[t]
            out.append((t, busy))
        return out

    def summary(self) -> dict:
        return {
            "policy": self.policy, "jobs": len(self.jobs), "makespan_s": self.makespan,
            "total_jct_s": self.total_jct, "average_jct_s": self.average_jct,
            "average_wait_s": self.average_wait, "utilization": self.utilization,
            "suspensions": self.suspensions, "overhead_share": self.overhead_share,
            "lower_bound_s": self.lower_bound,
        }


def lower_bound(book: ProfileBook, arrivals: list[Arrival], gpus_per_node: int,
                nodes: int) -> float:
    """No schedule finishes before this: the larger of (a) the latest arrival plus that job's
    best time on one node and (b) the first arrival plus all jobs' least GPU-time spread
    over every GPU."""
    longest, gpu_time = 0.0, 0.0
    for a in arrivals:
        curve, spec = book.lookup(a.spec.model), a.spec
        # (GPUs held, steps/s) of every way it may run: whole GPUs, or a share of one; on
        # several nodes, at least its count on each of its fewest nodes, at that count's speed
        if spec.nodes > 1:
            each = [per for _, per in shapes(spec.gpus, spec.nodes, spec.nodes_min,
                                             gpus_per_node)] if spec.gpus else \
                range(1, gpus_per_node + 1)
            ways = [(per * spec.fewest_nodes, curve.throughput(per)) for per in each
                    if curve.possible(per)]
        elif spec.gpus:
            ways = [(spec.gpus, curve.throughput(spec.gpus))]
        else:
            ways = [(g, curve.throughput(g)) for g in range(1, gpus_per_node + 1)
                    if curve.possible(g)] + [(1 / n, v) for n, v in curve.shared]
        longest = max(longest, a.at + min(a.spec.steps / v for _, v in ways))
        gpu_time += min(held * a.spec.steps / v for held, v in ways)
    start = min((a.at for a in arrivals), default=0.0)
    return max(longest, start + gpu_time / (gpus_per_node * nodes))


def _next_at(heap: list, live: dict) -> float | None:
    """When the next event that still counts happens (stale ones are skipped)."""
    while heap and heap[0][3] != "tick" and (
            heap[0][2] not in live or heap[0][1] != live[heap[0][2]].version):
        heapq.heappop(heap)
    return heap[0][0] if heap and heap[0][3] != "tick" else None


def _correct(measured: dict, live: dict, state: State, t: float) -> None:
    """The expected ends of the runs whose speed the broker has measured by `t`."""
    for job_id, (at, version, end) in list(measured.items()):
        lv = live.get(job_id)
        if lv is None or lv.version != version:
            del measured[job_id]  # the run ended, or is being suspended
        elif at <= t:
            state.expect(job_id, end)
            del measured[job_id]


def _as_run(spec: JobSpec) -> JobSpec:
    """A workload's job as the simulator runs it: its training is simulated, not emulated,
    so a model the policy's profile lacks is sized as the daemon sizes it."""
    return replace(spec, emulate=False, command=spec.command or ("simulated",))


def _cost(override: float | None, own: float | None) -> float:
    return float(override if override is not None else own or 0.0)


def _held(p: Placement) -> float:
    """The GPUs a run holds on all its nodes: a count, or 1/n of one."""
    return sum(len(gpus) for _, gpus in p.parts()) / p.share


@dataclass(frozen=True)
class Underway:
    """A run under way when the simulation starts: where it runs, as what, when it started
    (at or before 0) and when its training started or starts (after its start-up); the job's
    steps are what it has left at 0, or at that start if later."""

    placement: Placement
    role: Role
    started: float = 0.0
    trains_from: float = 0.0


@dataclass
class _Live:
    run_start: float
    progress_from: float  # when the first step starts (after the launch cost)
    start_step: float
    rate: float
    version: int
    suspend_s: float  # what its suspension costs
    stop_at: float | None = None  # set when a suspension is under way

    def steps_at(self, t: float) -> float:
        return self.start_step + max(0.0, t - self.progress_from) * self.rate


@dataclass
class Simulator:
    """`book` is what the policy is told; `truth` (default: the same) how fast runs really
    train and what they really cost; with `learning`, decisions learn from the runs as the
    daemon does (a run tells its model's throughput at its count when it ends)."""

    book: ProfileBook
    policy: Policy
    gpus_per_node: int
    nodes: int = 1
    launch_s: float | None = None  # None: each model's startup_s (0 if its profile has none)
    suspend_s: float | None = None
    runs: list[SimRun] = field(default_factory=list)
    truth: ProfileBook | None = None
    learning: Learning | None = None

    def _costed(self, curve: ThroughputCurve | None) -> ThroughputCurve | None:
        """The curve with the costs this simulation charges its runs."""
        return curve and replace(curve, startup_s=_cost(self.launch_s, curve.startup_s),
                                 suspend_s=_cost(self.suspend_s, curve.suspend_s))

    def _job(self, job_id: int, a: Arrival, told: ProfileBook | LearnedBook) -> Job:
        """The job as the state takes it at its arrival, sized as the daemon sizes it."""
        sizing = size_job(_as_run(a.spec), told, self.gpus_per_node, self.nodes)
        return Job(job_id, sizing.demand, sizing.malleable,
                   tuple(x for x in a.spec.after if isinstance(x, int)), a.spec.nodes,
                   max_share=sizing.max_share, curve=self._costed(told.lookup(a.spec.model)),
                   steps_left=float(a.spec.steps), submitted=a.at, nodes_min=a.spec.nodes_min)

    def _check(self, job_id: int, a: Arrival, where: str, truth: ProfileBook,
               told: ProfileBook | LearnedBook, state: State) -> None:
        """Refuse, naming the job's place in its file, what the simulator cannot run: what
        the daemon would refuse at its submission under this policy on these nodes."""
        if a.spec.model is None or a.spec.steps is None:
            raise WorkloadError(where, "model" if a.spec.model is None else "steps",
                                "the simulator needs a profiled model and a step count "
                                "for every job")
        if truth.lookup(a.spec.model) is None:
            raise WorkloadError(where, "model", f"'{a.spec.model}' is not in profile "
                                f"'{truth.system}', which has {', '.join(truth.models)}")
        try:
            never = self.policy.feasible(self._job(job_id, a, told), state)
        except SpecError as exc:
            raise WorkloadError(where, exc.field, exc.message) from None
        if never:
            raise WorkloadError(where, *never)

    def run(self, workload: list[JobSpec] | list[Arrival],
            running: dict[int, Underway] | None = None) -> SimResult:
        """`running`: the runs under way at 0, by job (1-based place in the workload, whose
        steps are then what the job has left)."""
        arrivals = sorted(
            (w if isinstance(w, Arrival) else Arrival(0.0, w) for w in workload),
            key=lambda a: a.at)
        truth = self.truth or self.book
        told = LearnedBook(self.book, self.learning, self.gpus_per_node) if self.learning \
            else self.book
        names = [f"node{i}" for i in range(self.nodes)]
        state = State(nodes={n: Node(n, tuple(range(self.gpus_per_node))) for n in names})
        for i, a in enumerate(arrivals, start=1):
            self._check(i, a, a.where or f"job {i}", truth, told, state)
        self.runs = []
        done: dict[int, float] = {}  # steps checkpointed so far
        first_start: dict[int, float] = {}
        completion: dict[int, float] = {}
        live: dict[int, _Live] = {}
        # runs whose profile is wrong: job -> (when measured, the run's version, its real end)
        measured: dict[int, tuple[float, int, float]] = {}
        heap: list[tuple[float, int, int, str]] = []  # (time, version, job, 'done'|'suspended')
        version = 0
        overhead = 0.0
        pending_tick: float | None = None
        t = 0.0
        next_arrival = 0

        of_model: dict[str, list[int]] = {}  # model -> its jobs, for what is learned

        def end_run(job_id: int, reason: str, at_step: float) -> None:
            lv = live.pop(job_id)
            job = state.jobs[job_id]
            self.runs.append(SimRun(job_id, job.placement.node, job.gpus, job.role,
                                    lv.run_start, t, round(lv.start_step), round(at_step),
                                    reason, job.placement.share, job.placement.others))
            # (the daemon's learner skips multi-node runs too: their speed is no count's)
            if self.learning and job.nodes == 1 and t >= lv.progress_from:
                model = arrivals[job_id - 1].spec.model
                told.record(model, "startup", lv.progress_from - lv.run_start)
                if reason == "suspended":
                    told.record(model, "suspend", lv.suspend_s)
                if t > lv.progress_from and job.placement.share == 1:
                    told.record(model, "throughput", lv.rate, len(job.gpus))
                aim = told.target(model, self.gpus_per_node)
                for other in of_model[model]:
                    state.resize(other, aim.count, self._costed(told.lookup(model)), aim.move)

        together = False
        # A livelock guard: a job reshaped twice at one instant, or more events at one instant
        # than the jobs can make (each arrives, starts, is suspended once, resumes and ends).
        reshaped: dict[int, float] = {}
        waits: set[float] = set()  # the first steps of runs whose reshape waits for them

        def first_step(job_id: int) -> float:
            """When a run has trained its first step (a worker reports it then)."""
            return live[job_id].progress_from + 1.0 / live[job_id].rate

        def starts_up(action) -> bool:
            """A policy's suspension of a run before its first step: not taken, and decided
            again at that step (lifecycle I6, as the daemon does)."""
            if not starting_up(action, state, lambda j: t >= first_step(j)):
                return False
            at = first_step(action.job)
            if at not in waits:
                waits.add(at)
                heapq.heappush(heap, (at, -1, 0, "tick"))
            return True

        def launch(job: Job, started: float, trains_from: float | None) -> float:
            """A run of `job` (just started in the state) from `started`; its first step at
            `trains_from` (None: after its start-up). The GPU-seconds its start-up holds."""
            nonlocal version
            spec = arrivals[job.id - 1].spec
            real = self._costed(truth.lookup(spec.model))
            p = job.placement
            # on several nodes: the speed at its count on each (the module's doc)
            rate = real.throughput(len(p.gpus), p.share)
            version += 1
            if trains_from is None:
                trains_from, at_step = started + real.startup_s, done[job.id]
            else:  # under way at 0: the steps it has left count from 0 (or its first step)
                at_step = done[job.id] + min(trains_from, 0.0) * rate
            lv = _Live(started, trains_from, at_step, rate, version, real.suspend_s)
            live[job.id] = lv
            first_start.setdefault(job.id, started)
            left = spec.steps - lv.start_step
            end = lv.progress_from + left / rate
            heapq.heappush(heap, (end, version, job.id, "done"))
            # what the policy expects: the curve it was told (the truth, unless a profile is
            # wrong)
            told_rate = job.curve.throughput(len(p.gpus), p.share) \
                if job.curve and job.curve.possible(len(p.gpus)) else rate
            state.expect(job.id, lv.progress_from + left / told_rate)
            if told_rate != rate:
                measured[job.id] = (lv.progress_from + MEASURED_AFTER_S, version, end)
            return (lv.progress_from - started) * _held(p)

        underway = dict(running or {})
        if any(arrivals[i - 1].at > 0.0 for i in underway):
            raise ValueError("a run under way at 0 must be of a job submitted at or before 0")
        at_once, most_at_once, last_job = 0, 4 * len(arrivals) + 16, 0
        while True:
            while next_arrival < len(arrivals) and arrivals[next_arrival].at <= t:
                a = arrivals[next_arrival]
                next_arrival += 1
                state.submit(self._job(next_arrival, a, told))
                of_model.setdefault(a.spec.model, []).append(next_arrival)
                done[next_arrival] = 0.0
            if underway:  # the runs under way at the start (t = 0)
                for job_id, run in sorted(underway.items()):
                    p = run.placement
                    job = state.apply(Start(job_id, p.node, p.gpus, run.role, p.others,
                                            p.share), run.started)
                    launch(job, run.started, run.trains_from)
                underway = {}
            if measured:
                _correct(measured, live, state, t)
            # Ends at one instant are taken together before the policy decides, as the daemon
            # sees the exits that come together in one wake.
            for action, job in (() if together else settle(self.policy, state, t, starts_up)):
                if isinstance(action, Start):
                    overhead += launch(job, t, None)
                elif isinstance(action, Suspend):
                    if reshaped.get(job.id) == t:
                        raise RunawayPolicy(
                            f"policy {self.policy.name} reshaped job {job.id} twice at "
                            f"t = {t:.3f} s, with no progress in between (a livelock): "
                            f"{action.reason}")
                    reshaped[job.id] = t
                    lv = live[job.id]
                    lv.stop_at = t + lv.suspend_s
                    lv.version = version = version + 1
                    left = arrivals[job.id - 1].spec.steps - lv.steps_at(t)
                    finish = max(t, lv.progress_from) + left / lv.rate
                    if finish <= lv.stop_at:  # it ends before it could checkpoint
                        heapq.heappush(heap, (finish, version, job.id, "done"))
                    else:
                        heapq.heappush(heap, (lv.stop_at, version, job.id, "suspended"))
                else:
                    completion[job.id] = t
            if not state.unfinished and next_arrival == len(arrivals):
                break
            tick = self.policy.next_decision(state, t)
            if tick is not None and tick > t and tick != pending_tick:
                heapq.heappush(heap, (tick, -1, 0, "tick"))  # decide again then
                pending_tick = tick
            _next_at(heap, live)  # drop stale events: runs suspended or replaced since
            arrive_at = arrivals[next_arrival].at if next_arrival < len(arrivals) else math.inf
            if heap and heap[0][0] <= arrive_at:
                at, _, who, what = heapq.heappop(heap)
                at_once, t = (at_once + 1 if at == t else 0), at
                last_job = who or last_job
                if at_once > most_at_once:
                    raise RunawayPolicy(
                        f"policy {self.policy.name} makes no progress: {at_once} events at "
                        f"t = {t:.3f} s without time advancing (the last one of job "
                        f"{last_job})")
                if what == "tick":
                    continue
            elif arrive_at < math.inf:
                t = arrive_at
                continue
            else:
                raise RuntimeError("simulation is stuck: jobs wait but nothing runs")
            lv = live[who]
            if what == "done":
                end_run(who, "done", arrivals[who - 1].spec.steps)
                state.finished(who, JobState.DONE)
                completion[who] = t
            else:
                # The checkpoint holds the last whole step reached before the request.
                # (a step ended at the request counts: float error must not lose it)
                reached = math.floor(lv.steps_at(lv.stop_at - lv.suspend_s) + 1e-9)
                done[who] = float(reached)
                overhead += lv.suspend_s * _held(state.jobs[who].placement)
                end_run(who, "suspended", reached)
                state.suspended(who, steps_left=arrivals[who - 1].spec.steps - reached)
            together = _next_at(heap, live) == t  # the daemon would see them in one wake

        stats = {
            i: JobStats(i, a.spec.model, a.spec.steps, a.at, first_start.get(i, a.at),
                        completion[i], state.jobs[i].suspensions)
            for i, a in enumerate(arrivals, start=1)
        }
        return SimResult(self.policy.name, self.runs, stats, self.gpus_per_node * self.nodes,
                         overhead, lower_bound(truth, arrivals, self.gpus_per_node,
                                               self.nodes))
