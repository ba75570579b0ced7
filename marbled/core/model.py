"""The broker's domain: jobs, nodes, GPU sets and the state that policies read.

Everything here is pure: no clocks, no processes, no storage. Drivers (the
daemon, the simulator) feed events in through the transition methods of
`State` and carry out the `Action`s a policy returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum


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


@dataclass(frozen=True)
class Placement:
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class Job:
    """A job as the scheduler sees it.

    `demand` is the GPU count the job runs best on (from its profile) or the
    count it asked for. A *malleable* job speaks the worker protocol: it may
    start as a secondary on fewer GPUs and be suspended; a rigid job (explicit
    `--gpus K`) runs on exactly its count and is never suspended.
    """

    id: int
    demand: int
    malleable: bool
    after: tuple[int, ...] = ()
    state: JobState = JobState.QUEUED
    role: Role | None = None
    placement: Placement | None = None  # GPUs held while running/suspending
    resume_on: Placement | None = None  # GPUs reserved for the resume after a promotion
    suspensions: int = 0

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.placement.gpus if self.placement else ()

    @property
    def waiting(self) -> bool:
        """Waits in the FIFO for GPUs (new, or suspended without a reservation)."""
        return self.state is JobState.QUEUED or (
            self.state is JobState.SUSPENDED and self.resume_on is None
        )


# ---------------------------------------------------------------- actions


@dataclass(frozen=True)
class Start:
    """Launch (or resume from its checkpoint) `job` on `gpus` of `node`."""

    job: int
    node: str
    gpus: tuple[int, ...]
    role: Role


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


class TransitionError(ValueError):
    """An event that does not fit the job's current state (a driver bug)."""


# ---------------------------------------------------------------- state


@dataclass
class State:
    """Nodes and jobs; `jobs` keeps submission order, which is the FIFO order."""

    nodes: dict[str, Node]
    jobs: dict[int, Job] = field(default_factory=dict)

    @classmethod
    def single_node(cls, gpus: int, name: str = "node0") -> State:
        return cls(nodes={name: Node(name, tuple(range(gpus)))})

    # -- queries

    def taken(self, node: str) -> set[int]:
        """GPUs of `node` held by a running job or reserved for a resume."""
        out: set[int] = set()
        for job in self.jobs.values():
            for p in (job.placement, job.resume_on):
                if p is not None and p.node == node:
                    out.update(p.gpus)
        return out

    def free(self, node: str) -> list[int]:
        taken = self.taken(node)
        return [g for g in self.nodes[node].gpus if g not in taken]

    def active(self) -> list[Job]:
        return [j for j in self.jobs.values() if not j.state.finished]

    @property
    def max_node_size(self) -> int:
        return max(n.size for n in self.nodes.values())

    # -- transitions (the only way a driver changes a job)

    def submit(self, job: Job) -> None:
        if job.id in self.jobs:
            raise TransitionError(f"job {job.id} already exists")
        self.jobs[job.id] = job

    def apply(self, action: Action) -> Job:
        job = self.jobs[action.job]
        match action:
            case Start(node=node, gpus=gpus, role=role):
                if job.state not in (JobState.QUEUED, JobState.SUSPENDED):
                    raise TransitionError(f"cannot start job {job.id} in state {job.state}")
                new = replace(
                    job,
                    state=JobState.RUNNING,
                    role=role,
                    placement=Placement(node, tuple(gpus)),
                    resume_on=None,
                )
            case Suspend(resume_on=resume_on):
                if job.state is not JobState.RUNNING:
                    raise TransitionError(f"cannot suspend job {job.id} in state {job.state}")
                new = replace(job, state=JobState.SUSPENDING, resume_on=resume_on)
            case Cancel():
                new = self._finish(job, JobState.CANCELLED)
        self.jobs[job.id] = new
        return new

    def suspended(self, job_id: int) -> Job:
        """The job checkpointed and exited after a Suspend (or was stopped by force)."""
        job = self.jobs[job_id]
        if job.state not in (JobState.SUSPENDING, JobState.RUNNING):
            raise TransitionError(f"job {job_id} is {job.state}, not running")
        new = replace(
            job, state=JobState.SUSPENDED, placement=None, role=None,
            suspensions=job.suspensions + 1,
        )
        self.jobs[job_id] = new
        return new

    def finished(self, job_id: int, state: JobState) -> Job:
        """The job ended for good: DONE, FAILED or CANCELLED."""
        new = self._finish(self.jobs[job_id], state)
        self.jobs[job_id] = new
        return new

    @staticmethod
    def _finish(job: Job, state: JobState) -> Job:
        if not state.finished:
            raise TransitionError(f"{state} is not a final state")
        if job.state.finished:
            raise TransitionError(f"job {job.id} already ended ({job.state})")
        return replace(job, state=state, placement=None, resume_on=None)
