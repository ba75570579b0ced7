"""What a batch system gives the broker, and what its launchers share.

- Allocation: the nodes, their GPUs and CPUs, the job id and the end time.
- Launcher and RunHandle: how the broker starts, watches, signals and re-adopts runs.
- BatchSystem: one per batch system (marbled.batch.slurm, .lsf, .local), registered
  in marbled.batch.
- StepRun and StepLauncher: a run started through a batch system's step command
  (srun, jsrun), which srun and jsrun share, with the CPU rule of their steps.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from marbled.batch.step import rank_file
from marbled.batch.supervise import process_stat, read_exit, step_exit_code
from marbled.worker.protocol import atomic_write_json, read_json


def launch_file(info_file: Path) -> Path:
    """Where a step's launch records the run and the allocation it was launched in."""
    return info_file.with_name(f"{info_file.stem}.launched{info_file.suffix}")


@dataclass(frozen=True)
class Watched:
    """The allocation as read again while the broker runs (BatchSystem.watch)."""

    end_time: float | None
    unavailable: dict[str, str]  # node -> why it takes no new runs (its state, e.g. DRAIN)


class AllocationError(RuntimeError):
    """The allocation cannot be read, or leaves the broker nothing to run on."""


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: dict[str, tuple[str, ...]]  # node -> GPU device names the job has there
    cpus: dict[str, int]  # node -> CPUs of the job there
    end_time: float | None  # Unix time; None without a time limit
    batch_node: str | None = None  # where the batch script (and so the broker) runs
    # what it was read from ("slurm", "lsf"; locally, how the GPUs were found)
    source: str = field(default="", compare=False)

    @property
    def gpu_nodes(self) -> dict[str, tuple[str, ...]]:
        """The nodes with GPUs: the ones the broker places runs on."""
        return {node: devices for node, devices in self.nodes.items() if devices}


# ------------------------------------------------------------------ launchers

@dataclass(frozen=True)
class LaunchRequest:
    argv: tuple[str, ...]
    env: dict[str, str]  # added to the broker's environment
    node: str
    devices: tuple[str, ...]  # device names for CUDA_VISIBLE_DEVICES
    run_dir: Path  # the job's own directory (state directory): the launcher's files go there
    stdout: Path
    stderr: Path
    # A multi-node run's further nodes and their devices (the same count on each)
    others: tuple[tuple[str, tuple[str, ...]], ...] = ()
    cwd: Path | None = None  # where the process runs (the job's chdir); None: `run_dir`
    per_gpu: bool = False  # one process (rank) per GPU of every node (marbled.batch.ranks)
    standby_ranks: int = 0  # a prestarted per-GPU run: the ranks to start waiting for the go
    # The variables the run starts from, before `env`: the job's environment as its submitter
    # exported it (core/environment.py); None: the broker's
    base_env: Mapping[str, str] | None = None

    def environment(self, leave_out: Collection[str] = ()) -> dict[str, str]:
        """The run's environment: its base (the job's, or the broker's) but `leave_out`,
        with `env` added."""
        base = os.environ if self.base_env is None else self.base_env
        return {**{k: v for k, v in base.items() if k not in leave_out}, **self.env}

    @property
    def workdir(self) -> Path:
        return self.cwd or self.run_dir

    @property
    def parts(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(node, devices) of every node of the run, its first node first."""
        return ((self.node, self.devices), *self.others)


class RunHandle(Protocol):
    pid: int
    pid_start: int | None  # process start time, to tell a live process from a reused pid

    async def wait(self) -> int:
        """The exit code; minus the signal number if a signal ended the run."""
        ...

    def signal(self, sig: int) -> bool:
        """Send `sig` to the whole run (its process group); False if it is gone."""
        ...


class Launcher(Protocol):
    name: str

    async def launch(self, request: LaunchRequest) -> RunHandle: ...

    def adopt(self, pid: int, pid_start: int | None, run_dir: Path, run_id: int) -> RunHandle:
        """A handle on a run an earlier broker launched (process `pid`, started at `pid_start`)."""
        ...

    def close(self) -> None:
        """The broker stops: let go of what launches runs (the runs themselves live on)."""
        ...


# ------------------------------------------------------------------ batch systems

class BatchSystem(ABC):
    """A batch system marbled runs under: Slurm, LSF, or none (processes on this host).

    detect() says whether this process is inside one of its allocations,
    allocation() reads what the broker may use, launcher() starts runs on it, and
    broker_node() is the node the broker runs on (a signal from the broker reaches
    a run on that node only; it may be on none of the allocation's nodes).

    The allocation's end comes two ways, both draining the broker (every job
    suspended to its checkpoint, exit 75): Allocation.end_time, drained
    --drain-before seconds ahead, and SIGUSR2, a warning the batch script asks for
    and forwards to marbled (jobscripts/marble.sbatch, contrib/lsf/marble.bsub).

    `prestart` is False for a batch system: a step's GPUs are fixed when it starts,
    so a process started ahead could not take over its next run's GPUs.
    """

    name: ClassVar[str]  # as messages name it: "Slurm"
    launcher_name: ClassVar[str]  # what --launcher calls it: "slurm"
    allocation_var: ClassVar[str | None]  # the variable naming the allocation: "SLURM_JOB_ID"
    command: ClassVar[str | None]  # what starts its steps, needed on PATH: "srun"
    prestart: ClassVar[bool] = False

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        """Inside one of its allocations (per `env`), with its step command on env's PATH."""
        return bool(cls.allocation_var and env.get(cls.allocation_var) and cls.command
                    and shutil.which(cls.command, path=env.get("PATH", "")))

    def allocation(self) -> Allocation:
        """The allocation this process runs in, with at least one GPU."""
        allocation = self.read_allocation()
        if not allocation.gpu_nodes:
            raise AllocationError(f"{self.name} job {allocation.job_id} has no GPUs; "
                                  "ask for GPUs in the batch script")
        return allocation

    @abstractmethod
    def read_allocation(self) -> Allocation:
        """The allocation as the batch system describes it; AllocationError outside one."""

    @abstractmethod
    def launcher(self, allocation: Allocation, step_args: tuple[str, ...] = ()) -> Launcher:
        """What starts runs in `allocation`; `step_args` are added to every step command."""

    def broker_node(self, allocation: Allocation, env: Mapping[str, str]) -> str | None:
        """The node the broker runs on; None if it is on none of the allocation's."""
        return allocation.batch_node

    def notes(self) -> list[str]:
        """What the log says once at start-up about how the allocation was read."""
        return []

    def watch(self, allocation: Allocation) -> Callable[[], Watched] | None:
        """What reads the allocation again while the broker runs: its end (a limit moved by
        staff or the user: `scontrol update TimeLimit=`) and its nodes that take no new runs
        (DOWN, DRAIN); None where neither can change."""
        return None

    def gpu_source(self, allocation: Allocation) -> str:
        """Where the GPUs came from, for the log and the store."""
        return f"{self.name} job {allocation.job_id}"

    def warnings(self, allocation: Allocation) -> list[str]:
        """What would keep runs from sharing a node: fewer CPUs than GPUs (see cpus_for)."""
        return [f"node {node}: {allocation.cpus.get(node, 0)} CPUs for {len(devices)} GPUs; "
                "steps need one CPU per GPU to run side by side (ask for more with "
                "--cpus-per-task)"
                for node, devices in allocation.gpu_nodes.items()
                if allocation.cpus.get(node, 0) < len(devices)]


# ------------------------------------------------------------------ runs as job steps

def process_start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat); None if
    it has exited, a zombie included (an orphan's, until init reaps it)."""
    stat = process_stat(pid)
    return None if stat is None or stat[0] in ("Z", "X") else stat[1]


@dataclass
class StepRun(ABC):
    """One run started through a step command (srun, jsrun), a child of the broker.

    Its exit is the step command's; what only the inside of the step knows (step
    id, node, GPUs) comes from the info file the step shim (marbled.batch.step)
    writes, one per task.
    """

    pid: int
    pid_start: int | None
    info_file: Path
    run_id: str
    job_id: str  # the allocation's
    nodes: tuple[str, ...] = ()  # several for a multi-node run, in the broker's order
    process: asyncio.subprocess.Process | None = None  # None when adopted after a restart
    tasks: int = 0  # a per-GPU run's tasks (one per GPU); 0: one per node

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.returncode is None
        return self.pid > 0 and process_start_time(self.pid) == self.pid_start

    async def wait(self) -> int | None:
        if self.process is not None:
            return step_exit_code(await self.process.wait())
        while self.alive():
            await asyncio.sleep(0.2)
        # an adopted step command is not our child: its supervisor recorded its exit
        return read_exit(self.info_file.parent, self.run_id)

    @abstractmethod
    def signal(self, sig: int) -> bool:
        """Deliver `sig` to the run's task(s); False if the run has ended."""

    def ended_by(self, stderr: str) -> dict | None:
        """After the exit: how the batch system itself ended the step ({"state", "detail"}),
        from its record in the step's `stderr`; None if it did not."""
        return None

    def allocation_of_its_own(self) -> str | None:
        """The allocation the step ran in where it is not the broker's (a run an earlier
        broker launched in an earlier allocation, adopted on a node of the same name):
        when that allocation ends, so does the step, and not by the job's doing. None where
        it is the broker's, or neither the step nor its launch says."""
        # the step's own word; else its launch's (a step killed before its shim could say)
        for path in (rank_file(self.info_file, 0), launch_file(self.info_file)):
            info = read_json(path)
            if info and info.get("run_id") == self.run_id and info.get("job_id"):
                return None if str(info["job_id"]) == str(self.job_id) else str(info["job_id"])
        return None

    async def placement(self, timeout: float = 3600.0) -> dict | None:
        """What the step reported about itself (step id, node, GPUs); None if it never did.

        For a multi-node or per-GPU step: every task's node and GPUs, joined in the run's
        node order ("n1,n2" and "0,1;2,3"), once every task has reported.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            infos = [read_json(rank_file(self.info_file, r))
                     for r in range(self.tasks or len(self.nodes) or 1)]
            if all(i and i.get("run_id") == self.run_id for i in infos):
                if len(infos) == 1:
                    return infos[0]
                by_node: dict[str, list[str]] = {}
                for i in infos:  # the GPUs of a node's tasks, each once
                    gpus = by_node.setdefault(i["node"], [])
                    gpus += [g for g in i["gpus"].split(",") if g and g not in gpus]
                order = [n for n in self.nodes if n in by_node] or sorted(by_node)
                return {**infos[0], "node": ",".join(order),
                        "gpus": ";".join(",".join(by_node[n]) for n in order)}
            if not self.alive() or loop.time() > deadline:
                return None
            await asyncio.sleep(0.02)


class StepLauncher:
    """What the srun and jsrun launchers share: the allocation, the extra step options,
    the CPUs of a step, its info file and the adoption of a step after a restart."""

    name: ClassVar[str]
    info_name: ClassVar[str]  # the step's info file in its run directory
    step_class: ClassVar[type[StepRun]]

    def __init__(self, allocation: Allocation, extra_args: tuple[str, ...] = ()):
        self.allocation = allocation
        self.extra_args = tuple(extra_args)

    def cpus_for(self, node: str, gpus: int) -> int:
        """The node's CPUs shared in proportion to GPUs (at least one per step)."""
        per_gpu = self.allocation.cpus.get(node, 1) // max(1, len(self.allocation.nodes[node]))
        return max(1, per_gpu * gpus)

    def fresh_info_file(self, request: LaunchRequest, ranks: int) -> Path:
        """The run's info file, with what an earlier run in its directory left removed, and
        its launch file: the allocation the step is launched in, for a broker that adopts
        the run in a later allocation if the step ends before it can say (its info file)."""
        info_file = request.run_dir / self.info_name
        for rank in range(ranks):
            rank_file(info_file, rank).unlink(missing_ok=True)
        atomic_write_json(launch_file(info_file), {
            "run_id": request.env["MARBLE_RUN_ID"], "job_id": self.allocation.job_id},
            durable=False)
        return info_file

    def close(self) -> None:
        pass  # every step is a child of the broker: nothing shared to let go of

    def adopt(self, pid: int, pid_start: int | None, run_dir: Path, run_id: int) -> StepRun:
        return self.step_class(pid, pid_start, run_dir / self.info_name, str(run_id),
                               self.allocation.job_id)
