"""No batch system: runs as processes on this host, each in its own session and group.

The GPUs are this host's: `--gpus N` emulated ones, else CUDA_VISIBLE_DEVICES,
else NVML's (marbled.batch.gpus). The process helpers here (start a run, find
or signal it) serve the batch launchers too, whose step commands are local
processes.

The own session keeps a Ctrl-Z in the broker's terminal away from the jobs and
makes the group an orphaned one, where a default-action SIGTSTP is discarded:
a wrapper such as `sh -c` is not stopped by the broker's SIGTSTP, while the
training process, which catches it, checkpoints and exits.

A plain run's process is its command, the leader of that session and group, started
by the broker's shared supervisor (marbled.batch.spawner; where the host has no pidfds,
by a supervisor of its own, marbled.batch.supervise, which leads the group); a per-GPU
run's is marbled.batch.ranks. Each records the command's exit status in the run's exit
file, so that a broker that adopts the run after a restart knows how it ended
(AdoptedRun).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from marbled.batch.base import (
    Allocation,
    AllocationError,
    BatchSystem,
    LaunchRequest,
    process_start_time,
)
from marbled.batch.gpus import GpuDiscoveryError, discover_gpus
from marbled.batch.ranks import descendants, local_rank_envs
from marbled.batch.spawner import Spawner, can_share
from marbled.batch.supervise import STEP_FLAG, launch_lock, process_stat, read_exit

SUPERVISOR = str(Path(__file__).with_name("supervise.py"))


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a run's process group; False if the group is gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def descendant_groups(pid: int) -> list[int]:
    """The process groups of `pid`'s descendants other than its own group: those of
    processes that left it, as torchrun's workers do (each in its own session)."""
    groups: list[int] = []
    for child in descendants(pid):
        with contextlib.suppress(OSError):
            pgid = os.getpgid(child)
            if pgid != pid and pgid not in groups:
                groups.append(pgid)
    return groups


def signal_run(pgid: int, sig: int) -> bool:
    """Send `sig` to a run's process group and to every group its descendants made (found
    first: a SIGKILL to the leader would orphan them); False if the run's group is gone.

    torchrun starts each worker in its own session: a SIGTSTP to the agent's group never
    reaches them, and a SIGKILL to it leaves them training (docs/distributed.md)."""
    others = descendant_groups(pgid)
    alive = signal_group(pgid, sig)
    for group in others:
        signal_group(group, sig)
    return alive


def find_run_process(run_dir: str, run_id: int) -> int | None:
    """The pid of the process a broker launched for run `run_id` of the job in `run_dir`.

    For a broker that crashed between launching a run and recording its pid: the
    run's process is the leader of its own session, and its environment (as it
    was at exec) names the job directory and the run -- or, for a prestarted
    process, the go file, whose contents name the run.
    """
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.getsid(pid) != pid:
                continue
            raw = _environ(pid)
        except OSError:
            continue
        env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0")
                   if "=" in item)
        if env.get("MARBLE_RUN_DIR") != run_dir:
            continue
        if env.get("MARBLE_RUN_ID") == str(run_id):
            return pid
        go = env.get("MARBLE_STANDBY_FILE")
        if go and _go_run_id(go) == run_id:
            return pid
    return None


def _environ(pid: int, tries: int = 50) -> bytes:
    """/proc/PID/environ, read again (1 ms apart) while it is empty: a process in the midst
    of its exec has its new memory and no environment yet, after the exec has already
    closed the pipe that told its parent it succeeded (the kernel sets the environment's
    bounds when it lays out the new stack): a run looked for at once after its launch
    was missed so, once in a CI run."""
    for _ in range(tries):
        with open(f"/proc/{pid}/environ", "rb") as f:
            if raw := f.read():
                return raw
        time.sleep(0.001)
    return b""


def find_launched_process(run_dir: str, run_id: int) -> int | None:
    """find_run_process under the job's launch lock (supervise.launch_lock): a shared
    supervisor still starting the run is waited for, and one that has not started it by
    then never will (its broker is gone)."""
    try:
        lock = launch_lock(run_dir)
    except OSError:  # no directory to lock in: nothing was launched there
        lock = -1
    try:
        return find_run_process(run_dir, run_id)
    finally:
        if lock >= 0:
            os.close(lock)


def _go_run_id(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(json.load(f).get("MARBLE_RUN_ID"))
    except (OSError, ValueError, TypeError):
        return None


@dataclass
class LocalRun:
    """A run started here: our child, watched through a pidfd (no thread per child)."""

    process: subprocess.Popen
    pid: int
    pid_start: int | None
    _exit: asyncio.Future | None = field(default=None, repr=False)

    async def wait(self) -> int:
        if self._exit is None:
            self._exit = watch_exit(self.process)
        return await asyncio.shield(self._exit)

    def signal(self, sig: int) -> bool:
        return signal_run(self.pid, sig)


def watch_exit(process: subprocess.Popen) -> asyncio.Future:
    """A future of the child's exit code (negative: the signal that ended it), set by the
    loop when the child's pidfd becomes readable: no thread and no SIGCHLD handler."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    if process.poll() is not None:
        done.set_result(process.returncode)
        return done
    try:
        fd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): a thread waits
        task = loop.run_in_executor(None, process.wait)
        task.add_done_callback(lambda t: done.done() or done.set_result(t.result()))
        return done

    def exited() -> None:
        if process.poll() is None:  # spurious: the child still runs
            return
        loop.remove_reader(fd)
        os.close(fd)
        if not done.done():
            done.set_result(process.returncode)

    loop.add_reader(fd, exited)
    return done


@dataclass
class AdoptedRun:
    """A run started by an earlier broker: not our child, so it is watched through /proc,
    and its exit code is the one its supervisor recorded in `run_dir` (None: none was)."""

    pid: int
    pid_start: int | None
    run_dir: Path | None = None
    run_id: int | None = None

    def alive(self) -> bool:
        return self.pid > 0 and process_start_time(self.pid) == self.pid_start

    async def wait(self) -> int | None:
        while self.alive():
            await asyncio.sleep(0.2)
        code = self.exit_code()
        # A shared supervisor records the exit just before it reaps the process: while the
        # process is its zombie, the record is on its way (bounded: an orphan's zombie may
        # wait for an init that reaps late)
        for _ in range(100):
            if code is not None or process_stat(self.pid) != ("Z", self.pid_start):
                break
            await asyncio.sleep(0.05)
            code = self.exit_code()
        return code

    def exit_code(self) -> int | None:
        """What the run's supervisor recorded as it exited (it writes before it exits)."""
        if self.run_dir is None or self.run_id is None:
            return None
        return read_exit(self.run_dir, self.run_id)

    def signal(self, sig: int) -> bool:
        return self.alive() and signal_run(self.pid, sig)


class LocalLauncher:
    name = "local"

    def __init__(self, shared: bool | None = None):
        """`shared`: every plain run under one shared supervisor (marbled.batch.spawner),
        else each under its own; None: shared where the host has pidfds."""
        self.spawner = Spawner() if (can_share() if shared is None else shared) else None

    def close(self) -> None:
        """The broker ends: the shared supervisor records its runs to their ends, then exits."""
        if self.spawner is not None:
            self.spawner.close()

    def adopt(self, pid: int, pid_start: int | None, run_dir: Path, run_id: int) -> AdoptedRun:
        return AdoptedRun(pid, pid_start, run_dir, run_id)

    async def launch(self, request: LaunchRequest) -> LocalRun:
        """Start the run's process. The fork and exec (milliseconds for a broker of some
        size) and the opening of its logs happen in a worker thread, off the event loop.

        A per-GPU run's process is marbled.batch.ranks, which starts one rank per GPU of
        every node (all on this host, node 0's GPUs first), with MASTER_PORT free here; a
        prestarted one starts `standby_ranks` ranks, given their GPUs by the go; it records
        the run's exit itself. Any other run's process is its command, started by the
        broker's shared supervisor (marbled.batch.spawner), or else under its own
        (marbled.batch.supervise), which records its exit: launch() returns once the
        command runs, and raises the OSError of a command that cannot start, as a direct
        start would."""
        env = {**request.environment(), "CUDA_VISIBLE_DEVICES": ",".join(request.devices)}
        argv = request.argv
        if request.per_gpu:
            ranks = request.standby_ranks or local_rank_envs(request.parts)
            argv = (sys.executable, "-m", "marbled.batch.ranks", json.dumps(ranks), *argv)
            spawn = _spawn
        elif self.spawner is not None:
            return await self.spawner.launch(request, env)
        else:
            spawn = _spawn_supervised
        proc, start = await asyncio.get_running_loop().run_in_executor(
            None, spawn, argv, request, env)
        return LocalRun(proc, proc.pid, start)


def _spawn(argv, request: LaunchRequest, env: dict[str, str],
           pass_fds: tuple[int, ...] = ()) -> tuple[subprocess.Popen, int | None]:
    """Start `argv` for a run (in a worker thread); the process and its start time."""
    with private_log(request.stdout) as out, private_log(request.stderr) as err:
        proc = subprocess.Popen(argv, cwd=request.workdir, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=err, start_new_session=True,
                                pass_fds=pass_fds)
    return proc, process_start_time(proc.pid)


def _spawn_supervised(argv, request: LaunchRequest,
                      env: dict[str, str]) -> tuple[subprocess.Popen, int | None]:
    """Start `argv` under its supervisor (in a worker thread), and wait until it runs: the
    supervisor closes its end of a pipe once `argv` runs, or first writes the errno that
    kept it from starting (raised here, as Popen would)."""
    status_r, status_w = os.pipe()
    try:
        proc, start = _spawn((*supervisor_argv(status_w), *argv), request, env,
                             pass_fds=(status_w,))
    finally:
        os.close(status_w)
    failed = _start_status(status_r)
    if failed:
        proc.wait()
        raise OSError(failed.errno, failed.strerror, argv[0])
    return proc, start


def supervisor_argv(status_fd: int, step: bool = False) -> tuple[str, ...]:
    """What starts a command under marbled.batch.supervise, which tells `status_fd` once it
    runs; `step`: the command is a step command (srun, jsrun), whose exit it translates."""
    return (sys.executable, "-I", "-S", SUPERVISOR, str(status_fd),
            *((STEP_FLAG,) if step else ()))


def _start_status(status_r: int) -> OSError | None:
    """Read the supervisor's pipe to its end: None once its command runs, else the OSError
    that kept the command from starting."""
    with os.fdopen(status_r, "rb") as status:
        failed = status.read()
    if not failed:
        return None
    errno = int(failed)
    return OSError(errno, os.strerror(errno))


async def start_process(argv, request: LaunchRequest,
                        env: dict[str, str]) -> asyncio.subprocess.Process:
    """Start a step command `argv` for a run: under its supervisor, which records the step's
    exit in the run's exit file (lifecycle I2: srun's status outlives the broker), in its
    own session, output to the run's logs, no stdin; returns once `argv` runs."""
    status_r, status_w = os.pipe()
    try:
        with private_log(request.stdout) as out, private_log(request.stderr) as err:
            proc = await asyncio.create_subprocess_exec(
                *supervisor_argv(status_w, step=True), *argv, cwd=request.workdir, env=env,
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True, pass_fds=(status_w,))
    except BaseException:
        os.close(status_r)
        raise
    finally:
        os.close(status_w)
    failed = await asyncio.to_thread(_start_status, status_r)
    if failed:
        await proc.wait()
        raise OSError(failed.errno, failed.strerror, argv[0])
    return proc


def private_log(path) -> BinaryIO:
    """A run's log, opened to append; created readable by its owner alone (lifecycle I8)."""
    return open(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")


def host_name() -> str:
    """This host's short name: the one node of a local broker."""
    return socket.gethostname().split(".")[0] or "localhost"


class LocalSystem(BatchSystem):
    """This host alone, on its own GPUs or `emulated_gpus` emulated ones; no end time.

    With `emulated_nodes` > 1 the emulated GPUs are that many nodes' worth (node0,
    node1, ...), every run still a process here: the broker is on node0, so runs on the
    other nodes acknowledge through their marker file only, as on a real cluster."""

    name = "local"
    launcher_name = "local"
    allocation_var = None
    command = None
    prestart = True  # a local process can take over any GPU of this host

    def __init__(self, emulated_gpus: int | None = None, emulated_nodes: int = 1):
        self.emulated_gpus = emulated_gpus
        self.emulated_nodes = emulated_nodes

    @classmethod
    def detect(cls, env: Mapping[str, str]) -> bool:
        return True  # every host runs processes: the fallback

    def read_allocation(self) -> Allocation:
        try:
            devices, source = discover_gpus(self.emulated_gpus)
        except GpuDiscoveryError as exc:
            raise AllocationError(str(exc)) from None
        cpus = os.cpu_count() or 1
        # no job id: "local", as marbled.paths names the state directory outside an allocation
        if self.emulated_nodes > 1:
            names = [f"node{i}" for i in range(self.emulated_nodes)]
            return Allocation("local", dict.fromkeys(names, devices), dict.fromkeys(names, cpus),
                              None, names[0], source=f"{source} x {self.emulated_nodes} nodes")
        host = host_name()
        return Allocation("local", {host: devices}, {host: cpus}, None, host, source=source)

    def launcher(self, allocation: Allocation, step_args: tuple[str, ...] = ()) -> LocalLauncher:
        return LocalLauncher()  # no step command for `step_args` to go to

    def gpu_source(self, allocation: Allocation) -> str:
        return allocation.source  # "emulated (6)", "CUDA_VISIBLE_DEVICES" or "NVML"

    def warnings(self, allocation: Allocation) -> list[str]:
        return []  # local runs are not confined to a share of the CPUs
