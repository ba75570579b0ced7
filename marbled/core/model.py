"""The broker's domain: jobs, nodes, GPU sets and the state that policies read.

Everything here is pure: no clocks, no processes, no storage. Drivers (the
daemon, the simulator) feed events in through the transition methods of
`State` and carry out the `Action`s a policy returns.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from marbled.core.evolve import evolve
from marbled.core.shapes import gpus_text, shape_text, shapes

if TYPE_CHECKING:
    from marbled.core.profiles import ThroughputCurve


class JobState(StrEnum):
    QUEUED = "queued"  # never started
    RUNNING = "running"
    SUSPENDING = "suspending"  # SIGTSTP sent, waiting for the checkpoint and the exit
    SUSPENDED = "suspended"  # checkpointed, waiting to be resumed
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)

    @property
    def holds_gpus(self) -> bool:
        return self in (JobState.RUNNING, JobState.SUSPENDING)


class Role(StrEnum):
    PRIMARY = "primary"  # runs on its optimal (or requested) GPU count
    SECONDARY = "secondary"  # runs on the leftover GPUs, fewer than optimal


@dataclass(frozen=True)
class Node:
    name: str
    gpus: tuple[int, ...]  # GPU slots 0..n-1; the launcher maps them to devices

    @property
    def size(self) -> int:
        return len(self.gpus)


# A GPU shared by n runs gives each 1/n of it; MAX_SHARE is the most runs on one GPU.
MAX_SHARE = 4


@dataclass(frozen=True)
class Placement:
    node: str
    gpus: tuple[int, ...]
    others: tuple[tuple[str, tuple[int, ...]], ...] = ()  # further nodes of a multi-node run
    share: int = 1  # > 1: the run has 1/share of its one GPU, beside other such runs

    def parts(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """(node, GPU slots) for every node of the run, the first node first."""
        return ((self.node, self.gpus), *self.others)


@dataclass(frozen=True)
class Job:
    """A job as the scheduler sees it.

    `demand` is the GPU count the job runs best on (from its profile) or the
    count it asked for. A *malleable* job speaks the worker protocol: it may
    start as a secondary on fewer GPUs and be suspended; a rigid job (explicit
    `--gpus K`) runs on exactly its count and is never suspended by a policy (a
    stop the broker makes still checkpoints it: docs/lifecycle.md). A job on
    `nodes` > 1 runs `demand` GPUs on each of that many nodes, only as a primary
    (with `nodes_min`, the same GPUs in all on fewer nodes, more on each).
    `max_share` > 1: its profile says it trains usefully on 1/max_share of a GPU.
    `curve` (its model's throughput, with start-up and suspend costs) and `steps_left`
    (the steps it still has to train when it is not running) are for policies that
    weigh speed-ups and costs; None when the driver does not know them.
    """

    id: int
    demand: int
    malleable: bool
    after: tuple[int, ...] = ()
    nodes: int = 1
    state: JobState = JobState.QUEUED
    role: Role | None = None
    placement: Placement | None = None  # GPUs held while running/suspending
    resume_on: Placement | None = None  # GPUs reserved for the resume after a promotion
    suspensions: int = 0
    run_started: float | None = None  # when its current (or last) run started
    not_before: float | None = None  # after a failure: waits out its retry back-off
    expected_end: float | None = None  # the driver's estimate for the current run (None: unknown)
    max_share: int = 1  # the most runs it may share one GPU with (itself included)
    curve: ThroughputCurve | None = None
    steps_left: float | None = None  # at its submission or its last suspension
    move: str | None = None  # why a running job is off its demand by what was learned (the
    # reason of the policy's move: 'explore', 'learned optimum'); None: a secondary's promotion
    submitted: float | None = None  # when it was submitted, on the driver's clock (None: unknown)
    # a node range (`nodes_min` to `nodes`): its demand x nodes GPUs run on any count in it
    # that divides them (core/policy/spread.py); None: exactly `nodes`
    nodes_min: int | None = None

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.placement.gpus if self.placement else ()

    @property
    def next_run_gpus(self) -> int:
        """The GPU count its next run is expected to get, on all its nodes together (the ranks
        a prestart starts for a per-GPU job): those reserved for its resume after a
        promotion, else its demand on each of its nodes."""
        if self.resume_on is not None:
            return sum(len(gpus) for _, gpus in self.resume_on.parts())
        return self.demand * self.nodes

    def fit(self, gpus: int) -> int | None:
        """The most GPUs, at most `gpus`, the job can run on (its curve may rule some counts
        out); None if none."""
        return (gpus if gpus >= 1 else None) if self.curve is None else self.curve.largest(gpus)

    @property
    def fewest(self) -> int:
        """The fewest GPUs it can run on: 1 for a resizable job, unless its curve rules it out."""
        if not self.malleable:
            return self.demand
        return (self.curve.smallest() or self.demand) if self.curve else 1

    @property
    def engaged(self) -> bool:
        """Holds GPUs or has some reserved."""
        return self.placement is not None or self.resume_on is not None

    @property
    def waiting(self) -> bool:
        """Waits in the FIFO for GPUs (new, or suspended without a reservation)."""
        return self.state is JobState.QUEUED or (
            self.state is JobState.SUSPENDED and self.resume_on is None
        )


def misfit(job: Job, sizes: list[int]) -> str | None:
    """Why `job` can never run on nodes of `sizes` GPUs, or None if it can. Only a job that a
    larger allocation took can ask for more (submission sizes a job to its broker's nodes):
    the next allocation of a chain of batch jobs may be smaller. A job on `auto` takes what
    a node has (the broker sizes it again: `Intake.add`), so only its fewest nodes count."""
    fewest = job.nodes_min or job.nodes
    if fewest <= len(sizes) and (job.malleable or any(
            sum(size >= per for size in sizes) >= k
            for k, per in shapes(job.demand, job.nodes, job.nodes_min))):
        return None
    have = gpus_text(sizes[0]) if len(set(sizes)) == 1 else f"{min(sizes)}-{max(sizes)} GPUs"
    where = "" if job.nodes > 1 else " on one node"
    return (f"it asks for {shape_text(job.demand, job.nodes, job.nodes_min)}{where}, and "
            f"this allocation has {len(sizes)} node{'s' if len(sizes) != 1 else ''} of {have}")


# ---------------------------------------------------------------- actions


@dataclass(frozen=True)
class Start:
    """Launch (or resume from its checkpoint) `job` on `gpus` of `node` (and `others`)."""

    job: int
    node: str
    gpus: tuple[int, ...]
    role: Role
    others: tuple[tuple[str, tuple[int, ...]], ...] = ()  # a multi-node job's further nodes
    share: int = 1  # > 1: on 1/share of its one GPU, beside other such runs


@dataclass(frozen=True)
class Suspend:
    """Checkpoint and stop `job`; if `resume_on` is set, those GPUs are kept for it."""

    job: int
    resume_on: Placement | None
    reason: str


@dataclass(frozen=True)
class Cancel:
    job: int
    reason: str


Action = Start | Suspend | Cancel


def dependency_status(job: Job, state: State) -> str:
    """'ready', 'wait' (a dependency is still to finish) or 'broken' (one failed, was
    cancelled or does not exist). A dependency the state no longer holds (it ended and was
    forgotten) is answered by `State.outcome`."""
    status = "ready"
    for dep in job.after:
        other = state.outcome(dep)
        if other is None or other in (JobState.FAILED, JobState.CANCELLED):
            return "broken"
        if other is not JobState.DONE:
            status = "wait"
    return status


def _movable(job: Job) -> bool:
    return not job.state.finished and (job.malleable or job.nodes_min is not None)


def _no_job(job_id: int) -> JobState | None:
    """`State.ended` of a state that forgets no job: a job it does not hold does not exist."""
    return None


class TransitionError(ValueError):
    """An event that does not fit the job's current state (a driver bug)."""


# ---------------------------------------------------------------- state


@dataclass
class State:
    """Nodes and jobs; `jobs` keeps submission order, which is the FIFO order.

    Change jobs only through the transition methods: they keep the indexes that
    make a decision cost what the running and the head of the queue cost, not
    what the whole history costs (the simulator replays tens of thousands of jobs).

    A driver that keeps its records elsewhere (the daemon: its store) may `forget` an
    ended job, so that what the state holds grows with the live jobs, not with every job
    ever; `ended` then answers a job the state does not hold: its final state, or None if
    there is no such job (a plain callable: the daemon's reads its store). The tallies
    (`counts`) and `overtaken` still count a forgotten job.
    """

    nodes: dict[str, Node]
    jobs: dict[int, Job] = field(default_factory=dict)
    ended: Callable[[int], JobState | None] = field(default=_no_job, repr=False)

    def __post_init__(self) -> None:
        # node -> why it takes no new runs (the batch system's state: DOWN, DRAIN); its runs
        # go on, but none of its GPUs is free to a policy
        self.unavailable: dict[str, str] = {}
        self._taken: dict[str, set[int]] = {name: set() for name in self.nodes}
        self._shared: dict[tuple[str, int], dict[int, int]] = {}  # GPU -> {job: its share}
        self._waiting: list[int] = []  # ids of waiting jobs, ascending: the FIFO
        # ids of every job, ascending (see `overtaken`), less the forgotten ones older than
        # every job held (no `overtaken` can count them): 8 bytes an id
        self._ids = array("q")
        self._engaged: set[int] = set()  # ids of jobs holding or reserving GPUs
        self._secondaries: dict[str, set[int]] = {name: set() for name in self.nodes}
        self._resumable: set[int] = set()  # suspended with GPUs reserved for the resume
        self._above: set[int] = set()  # running on more whole GPUs than their demand
        self._with_deps: set[int] = set()  # never started and waiting for dependencies
        # Where each job stands with its dependencies, kept up to date as jobs change, so a
        # decision reads only the jobs that can start (a queue of thousands of jobs waiting
        # for others was read whole at every decision): jobs that depend on each job (by
        # id, whether it exists yet or not); the queued jobs whose dependency can never be
        # met; the ids of waiting jobs that are ready, ascending.
        self._dependents: dict[int, set[int]] = {}
        self._broken: set[int] = set()
        self._ready: list[int] = []
        self._is_ready: set[int] = set()
        # waiting jobs these nodes can never hold (`misfit`), with why: not ready, so the
        # FIFO passes over them instead of waiting behind them until the allocation ends
        self._sizes = [node.size for node in self.nodes.values()]
        self._largest = max(self._sizes, default=0)
        self._smallest = min(self._sizes, default=0)
        self._unfit: dict[int, str] = {}
        self._unfinished = 0
        self._movable = 0  # unfinished jobs a policy may resize, suspend or place on a range
        # Read by what the API shows (`status`, the metrics, the forecast) at a cost of the
        # live jobs, not of every job ever: jobs by state, and the ids of the unfinished ones.
        self._counts: dict[JobState, int] = dict.fromkeys(JobState, 0)
        self._open: set[int] = set()
        jobs, self.jobs = self.jobs, {}
        for job in jobs.values():
            self._put(job)

    @classmethod
    def single_node(cls, gpus: int, name: str = "node0") -> State:
        return cls(nodes={name: Node(name, tuple(range(gpus)))})

    # -- queries

    def free(self, node: str) -> list[int]:
        if node in self.unavailable:
            return []
        taken = self._taken[node]
        return [g for g in self.nodes[node].gpus if g not in taken]

    def set_unavailable(self, node: str, why: str | None) -> None:
        """Take `node` out of service (`why`), or back (None)."""
        if why:
            self.unavailable[node] = why
        else:
            self.unavailable.pop(node, None)

    def waiting(self) -> Iterator[Job]:
        """Jobs waiting for GPUs, in FIFO order."""
        return (self.jobs[i] for i in self._waiting)

    def ready(self) -> Iterator[Job]:
        """The waiting jobs whose dependencies are all done, in FIFO order: those of
        `waiting()` whose `dependency_status()` is "ready"."""
        return (self.jobs[i] for i in self._ready)

    def engaged(self) -> list[Job]:
        """Jobs that hold or have reserved GPUs, oldest first."""
        return [self.jobs[i] for i in sorted(self._engaged)]

    def sharing(self) -> dict[tuple[str, int], dict[int, int]]:
        """GPUs shared by runs: (node, GPU) -> {job id: share}; a run with share n has 1/n."""
        return {key: dict(runs) for key, runs in self._shared.items()}

    def nodes_with_free_gpus(self) -> list[str]:
        return [n for n, node in self.nodes.items() if len(self._taken[n]) < node.size]

    def running_secondaries(self, node: str) -> list[Job]:
        """Secondaries running (not suspending) on `node`, oldest first."""
        return [self.jobs[i] for i in sorted(self._secondaries[node])]

    def above_demand(self) -> list[Job]:
        """Jobs running on more whole GPUs than their demand (after what was learned of
        their model lowered it), oldest first."""
        return [self.jobs[i] for i in sorted(self._above)]

    def resumable(self) -> list[Job]:
        """Suspended jobs whose resume has GPUs reserved, oldest first."""
        return [self.jobs[i] for i in sorted(self._resumable)]

    def broken(self) -> list[int]:
        """Queued jobs whose dependency failed, was cancelled or does not exist, oldest first:
        they can never start."""
        return sorted(self._broken)

    def unfit(self) -> dict[int, str]:
        """The waiting jobs these nodes can never hold, and why (`misfit`), in FIFO order."""
        return {i: self._unfit[i] for i in sorted(self._unfit)}

    def misfit_of(self, job_id: int) -> str | None:
        return self._unfit.get(job_id)

    @property
    def unfit_count(self) -> int:
        return len(self._unfit)

    @property
    def ready_count(self) -> int:
        """How many jobs `ready()` gives, without reading them."""
        return len(self._ready)

    def outcome(self, job_id: int) -> JobState | None:
        """The job's state, whether the state holds it or it ended and was forgotten
        (`ended`); None if there is no such job."""
        job = self.jobs.get(job_id)
        return job.state if job is not None else self.ended(job_id)

    def overtaken(self, job_id: int) -> int:
        """Jobs submitted after `job_id` that no longer wait (started, or ended): for a job
        that has waited since its submission, how many later jobs went before it."""
        later = len(self._ids) - bisect_right(self._ids, job_id)
        return later - (len(self._waiting) - bisect_right(self._waiting, job_id))

    @property
    def unfinished(self) -> int:
        return self._unfinished

    @property
    def movable(self) -> int:
        """How many unfinished jobs a policy may resize or suspend (`malleable`) or place on
        a count of nodes of its choosing (`nodes_min`): with none, every job runs on its
        own count and is never resized, suspended or moved by a policy."""
        return self._movable

    def active(self) -> list[Job]:
        """The unfinished jobs, in FIFO (id) order; what they cost, not every job ever."""
        return [self.jobs[i] for i in sorted(self._open)]

    def counts(self) -> dict[JobState, int]:
        """How many jobs are in each state (every state, 0 included), without reading them."""
        return dict(self._counts)

    def holding(self) -> list[int]:
        """Ids of the jobs that hold GPUs (running or suspending), ascending."""
        return [i for i in sorted(self._engaged) if self.jobs[i].state.holds_gpus]

    @property
    def max_node_size(self) -> int:
        return self._largest

    # -- transitions (the only way a driver changes a job)

    def submit(self, job: Job) -> None:
        if job.id in self.jobs:
            raise TransitionError(f"job {job.id} already exists")
        self._put(job)

    def apply(self, action: Action, at: float = 0.0) -> Job:
        """Carry out `action` in the state; `at` is the time (for a Start: the run's start)."""
        job = self.jobs[action.job]
        match action:
            case Start(node=node, gpus=gpus, role=role, others=others, share=share):
                if job.state not in (JobState.QUEUED, JobState.SUSPENDED):
                    raise TransitionError(f"cannot start job {job.id} in state {job.state}")
                if share > 1 and (len(gpus) != 1 or others or share > job.max_share):
                    raise TransitionError(f"job {job.id} cannot run on 1/{share} of {gpus}")
                new = evolve(
                    job,
                    state=JobState.RUNNING,
                    role=role,
                    placement=Placement(node, tuple(gpus), others, share),
                    resume_on=None,
                    run_started=at,
                    not_before=None,
                    expected_end=None,
                    move=None,
                )
            case Suspend(resume_on=resume_on):
                if job.state is not JobState.RUNNING:
                    raise TransitionError(f"cannot suspend job {job.id} in state {job.state}")
                new = evolve(job, state=JobState.SUSPENDING, resume_on=resume_on)
            case Cancel():
                new = self._finish(job, JobState.CANCELLED)
        return self._put(new)

    def suspended(self, job_id: int, not_before: float | None = None,
                  steps_left: float | None = None) -> Job:
        """The job checkpointed and exited after a Suspend (or was stopped by force); with
        `not_before`, it failed and is retried from its checkpoint after that time;
        `steps_left`: what its checkpoint leaves to train, if the driver knows."""
        job = self.jobs[job_id]
        if job.state not in (JobState.SUSPENDING, JobState.RUNNING):
            raise TransitionError(f"job {job_id} is {job.state}, not running")
        return self._put(evolve(
            job, state=JobState.SUSPENDED, placement=None, role=None,
            suspensions=job.suspensions + 1, not_before=not_before, expected_end=None,
            steps_left=job.steps_left if steps_left is None else steps_left,
        ))

    def finished(self, job_id: int, state: JobState) -> Job:
        """The job ended for good: DONE, FAILED or CANCELLED."""
        return self._put(self._finish(self.jobs[job_id], state))

    def withdraw(self, job_id: int) -> None:
        """Forget a queued job that was never accepted (the store refused its submission):
        no count, queue or dependency keeps it."""
        job = self._put(self._finish(self.jobs[job_id], JobState.CANCELLED))
        del self.jobs[job_id]
        self._counts[JobState.CANCELLED] -= 1
        del self._ids[bisect_left(self._ids, job_id)]
        for dep in job.after:
            self._dependents.get(dep, set()).discard(job_id)
        self._broken.discard(job_id)

    def forget(self, job_id: int) -> None:
        """An ended job leaves the state (its driver keeps its record, and `ended` answers its
        final state from now on): no index keeps it, but the tallies (`counts`) and
        `overtaken` still count it."""
        job = self.jobs[job_id]
        if not job.state.finished:
            raise TransitionError(f"job {job_id} is {job.state}: only an ended job is forgotten")
        del self.jobs[job_id]
        # Its own dependents were classified at its end, which no later change can undo.
        self._dependents.pop(job_id, None)
        for dep in job.after:
            dependents = self._dependents.get(dep)
            if dependents is not None:
                dependents.discard(job_id)
                if not dependents:
                    del self._dependents[dep]
        oldest = 0  # forgotten ids before every job held: `overtaken` never counts them
        while oldest < len(self._ids) and self._ids[oldest] not in self.jobs:
            oldest += 1
        del self._ids[:oldest]

    def ended_before(self, counts: Mapping[JobState, int], ids: Iterable[int] = ()) -> None:
        """Jobs that ended before this state was built and that it does not hold (a driver
        that rebuilds only the unfinished jobs): `counts` of them by state join the tallies;
        `ids`, those submitted after its oldest unfinished job, count in `overtaken`."""
        for state, count in counts.items():
            if not state.finished:
                raise TransitionError(f"{state} is not a final state")
            self._counts[state] += count
        self._ids = array("q", sorted(set(self._ids).union(ids)))

    def expect(self, job_id: int, end: float | None) -> Job:
        """The driver's estimate of when the job's current run ends (policies that weigh the
        remaining time read it): the profile curve's, then the run's measured speed's."""
        return self._put(evolve(self.jobs[job_id], expected_end=end))

    def resize(self, job_id: int, demand: int | None, curve: ThroughputCurve | None,
               move: str | None = None) -> Job:
        """What was learned of a resizable job's model: its count to aim for and its curve,
        and `move`, what a policy's move of a running job to that count is called.
        A waiting job takes both. A running one below its new count becomes a secondary
        (a policy that promotes may then give it more); one on its count or above it is a
        primary (a policy may bring it down: its runs measured fewer GPUs faster). A job
        suspending to GPUs reserved for its resume never aims below them."""
        job = self.jobs[job_id]
        if job.state.finished or not job.malleable or job.nodes > 1 or demand is None:
            return job
        demand = max(demand, len(job.resume_on.gpus) if job.resume_on else 0)
        role, moving = job.role, None
        if job.state is JobState.RUNNING:
            on = len(job.gpus) if job.placement.share == 1 else 0
            role = Role.PRIMARY if on >= demand else Role.SECONDARY
            if on != demand:  # a secondary that stays below keeps its promotion's name
                moving = move if job.role is Role.PRIMARY or on > demand else job.move
        return self._put(evolve(job, demand=demand, curve=curve, role=role, move=moving))

    def drop_reservation(self, job_id: int) -> Job:
        """Forget the GPUs kept for a job's resume (it will wait in the FIFO instead)."""
        return self._put(evolve(self.jobs[job_id], resume_on=None))

    @staticmethod
    def _finish(job: Job, state: JobState) -> Job:
        if not state.finished:
            raise TransitionError(f"{state} is not a final state")
        if job.state.finished:
            raise TransitionError(f"job {job.id} already ended ({job.state})")
        return evolve(job, state=state, placement=None, resume_on=None, expected_end=None)

    def _hold(self, job_id: int, p: Placement) -> None:
        if p.share > 1:
            self._shared.setdefault((p.node, p.gpus[0]), {})[job_id] = p.share
            self._taken[p.node].add(p.gpus[0])
            return
        for node, gpus in p.parts():
            self._taken[node].update(gpus)

    def _release(self, job_id: int, p: Placement) -> None:
        if p.share > 1:
            key = (p.node, p.gpus[0])
            del self._shared[key][job_id]
            if not self._shared[key]:
                del self._shared[key]
                self._taken[p.node].discard(p.gpus[0])
            return
        for node, gpus in p.parts():
            self._taken[node].difference_update(gpus)

    def _put(self, new: Job) -> Job:
        """Store `new` in place of the job's old version and update the indexes."""
        old = self.jobs.get(new.id)
        if old is not None:
            for p in (old.placement, old.resume_on):
                if p is not None:
                    self._release(old.id, p)
        for p in (new.placement, new.resume_on):
            if p is not None:
                self._hold(new.id, p)
        was_waiting = old is not None and old.waiting
        if was_waiting != new.waiting:
            if new.waiting:
                insort(self._waiting, new.id)
            else:
                del self._waiting[bisect_left(self._waiting, new.id)]
        if new.placement or new.resume_on:
            self._engaged.add(new.id)
        else:
            self._engaged.discard(new.id)
        if old is not None and old.placement is not None:
            self._secondaries[old.placement.node].discard(new.id)
        if new.state is JobState.RUNNING and new.role is Role.SECONDARY:
            self._secondaries[new.placement.node].add(new.id)
        if new.state is JobState.SUSPENDED and new.resume_on is not None:
            self._resumable.add(new.id)
        else:
            self._resumable.discard(new.id)
        if new.state is JobState.RUNNING and new.placement.share == 1 and new.nodes == 1 \
                and len(new.gpus) > new.demand:  # (a node range's run on fewer nodes is not)
            self._above.add(new.id)
        else:
            self._above.discard(new.id)
        if new.after and new.state is JobState.QUEUED:
            self._with_deps.add(new.id)
        else:
            self._with_deps.discard(new.id)
        self._unfinished += (not new.state.finished) - (old is not None and not old.state.finished)
        self._movable += _movable(new) - (old is not None and _movable(old))
        if old is None or old.state is not new.state:
            if old is not None:
                self._counts[old.state] -= 1
            self._counts[new.state] += 1
            if new.state.finished:
                self._open.discard(new.id)
            else:
                self._open.add(new.id)
        if old is None:
            insort(self._ids, new.id)
        self.jobs[new.id] = new
        if new.after and old is None:
            for dep in new.after:
                self._dependents.setdefault(dep, set()).add(new.id)
        unfit_changed = self._classify(new.id)
        if new.id in self._dependents and (old is None or unfit_changed or
                                           _outcome(old) != _outcome(new)):
            for other in self._dependents[new.id]:
                if other in self.jobs:
                    self._classify(other)
        return new

    def _classify(self, job_id: int) -> bool:
        """Update where the job stands with its dependencies (in `ready()`, `broken()`) and
        with the nodes (`unfit()`: a job waiting for one that cannot run here cannot either);
        whether it entered or left `unfit()`."""
        job = self.jobs[job_id]
        status = dependency_status(job, self) if job.after else "ready"
        if status == "broken" and job.state is JobState.QUEUED:
            self._broken.add(job_id)
        else:
            self._broken.discard(job_id)
        why = None  # (no nodes: a stopped broker's records that do not say them)
        if self._sizes and job.waiting and not (  # what surely fits, cheaply (most jobs)
                (job.nodes_min or job.nodes) <= len(self._sizes) if job.malleable else
                job.nodes <= len(self._sizes) and job.demand <= self._smallest):
            why = misfit(job, self._sizes)
        if not why and self._unfit and job.waiting and status == "wait":
            held = next((d for d in job.after if d in self._unfit), None)
            why = held and f"it waits for job {held}, which this allocation cannot hold"
        was = job_id in self._unfit
        if why:
            self._unfit[job_id] = why
        elif was:
            del self._unfit[job_id]
        ready = job.waiting and status == "ready" and not why
        if ready != (job_id in self._is_ready):
            if ready:
                self._is_ready.add(job_id)
                insort(self._ready, job_id)
            else:
                self._is_ready.discard(job_id)
                del self._ready[bisect_left(self._ready, job_id)]
        return was != bool(why)


def _outcome(job: Job) -> str:
    """What a job's state means to the jobs that depend on it (`dependency_status`)."""
    if job.state is JobState.DONE:
        return "done"
    return "broken" if job.state in (JobState.FAILED, JobState.CANCELLED) else "open"
