"""The in-job side of MARBLE's suspend/resume protocol. Standard library only.

The broker starts every run with:

  MARBLE_JOB_ID, MARBLE_RUN_ID   which job and which launch segment this is
  MARBLE_RUN_DIR                 where the protocol files below live
  MARBLE_CHECKPOINT_DIR          where the job keeps its checkpoints (kept across runs)
  MARBLE_BROKER_PID              the broker, on this node, for SIGUSR1
  MARBLE_TARGET_STEPS            the step count the job should end at (if known)
  MARBLE_LAUNCH_TIME             when the broker launched this run (Unix time)
  CUDA_VISIBLE_DEVICES, MARBLE_GPUS   the GPUs of this run, and how many
  MARBLE_GPU_SHARE               n > 1: the run has 1/n of its one GPU (shared with others)
  MARBLE_REPORT_INTERVAL         seconds between progress reports (marble profile: short)

Suspension: the broker writes `suspend.json` (naming the run) and sends SIGTSTP
to the job's process group. The handler only sets a flag. At the next step
boundary the job writes its checkpoint (atomically), calls `acknowledge(step)`
-- which writes the ack marker and sends SIGUSR1 to the broker (if it runs on
this node) -- and exits. The marker alone is enough for the broker (it also
polls for it), so a lost signal costs latency, not correctness.

Install the handler in the first lines of the job's entry point, before heavy
imports: a SIGTSTP that arrives before it is dropped (the job runs in its own
session, an orphaned process group, or under Slurm with SIGTSTP ignored); the
job then finds `suspend.json` at its next check (install, restore, or a
progress report) instead.

Framework helpers (`marbled.worker.keras`, `.tf`, `.torch`) build on
`step_finished()` and `checkpoint_and_exit()`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

ACK_FILE = "ack.json"
# where launchers put a process's rank in a multi-node job (Slurm, Open MPI, PMIx, torchrun, jsrun)
RANK_VARS = ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK", "JSM_NAMESPACE_RANK")
SUSPEND_FILE = "suspend.json"  # the broker's request, for a SIGTSTP that came too early
PROGRESS_FILE = "progress.json"
STANDBY_VAR = "MARBLE_STANDBY_FILE"  # a prestarted process's go file, where it waits
# ... and its broker: "LOCK:PID", the state directory's lock file and the pid it holds
STANDBY_BROKER_VAR = "MARBLE_STANDBY_BROKER"
LOCK_CHECK_S = 1.0  # how often a prestarted process reads its broker's lock file
# A report names the newest earlier report at least this old (`since`): the broker's
# speed and ETA follow the last second of training, or the last report interval if longer
RATE_WINDOW_S = 1.0
_current: JobProtocol | None = None  # the protocol installed in this process


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable, durable: bool = True, binary: bool = False) -> None:
    """Write through `write(file)` so readers see the old or the new file, never a torn one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb" if binary else "w") as f:
        write(f)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def atomic_write_json(path: Path, payload: dict, durable: bool = True) -> None:
    atomic_write(path, lambda f: json.dump(payload, f), durable)


def read_json(path: Path) -> dict | None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return _int(value) or (isinstance(value, float) and math.isfinite(value))


def _step(value) -> bool:
    return _int(value) and value >= 0


# The fields of a progress report or an acknowledgement (what `report` and `acknowledge`
# write), each with the test its value must pass when present.
REPORT_FIELDS: dict[str, Callable[[object], bool]] = {
    "run_id": _int,
    "step": _step,
    "start_step": lambda v: v is None or _step(v),
    "time": _number,
    "phases": lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and _number(t) for k, t in v.items()),
    "prestart": lambda v: isinstance(v, bool),
    "since": lambda v: isinstance(v, dict) and _step(v.get("step")) and _number(v.get("time")),
    "signalled_at": lambda v: v is None or _number(v),
    "save_seconds": lambda v: v is None or _number(v),
}


def malformed(doc: dict) -> str | None:
    """What is wrong with a report the broker read (a job that writes its files itself, or
    a byte gone wrong that still parses: a step as a string, a negative step), or None.
    The broker takes such a report for none, as it takes a file that does not parse."""
    for name, ok in REPORT_FIELDS.items():
        if name in doc and not ok(doc[name]):
            return f"{name}: {doc[name]!r}"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _int_env(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.strip().isdigit() else None


def broker_replaced(standby_broker: str | None) -> bool:
    """Whether the broker that prestarted this process has left its state directory:
    another holds its lock file (`standby_broker`: "LOCK:PID", as STANDBY_BROKER_VAR). On a
    node other than the broker's, where its pid means nothing, the lock file (on the
    filesystem the nodes share) is how a waiting process learns it."""
    if not standby_broker:
        return False
    lock, _, pid = standby_broker.rpartition(":")
    try:
        with open(lock) as f:
            return f.read(32).strip() != pid
    except OSError:  # unreadable for now: no reason to give up
        return False


def wait_for_go(go_file: Path, broker_pid: int | None,
                standby_broker: str | None = None) -> dict | None:
    """The broker's go for a prestarted process, once written; None if the go cancels it or
    the broker is gone (no go will come: the next broker starts the job afresh): its pid on
    this node, or its lock file (`broker_replaced`) read every LOCK_CHECK_S."""
    checked = time.monotonic()
    while (go := read_json(go_file)) is None:
        if broker_pid and not _alive(broker_pid):
            return None
        if standby_broker and time.monotonic() - checked >= LOCK_CHECK_S:
            if broker_replaced(standby_broker):
                return None
            checked = time.monotonic()
        time.sleep(0.01)
    return None if go.get("cancel") else go


def _env_rank() -> int:
    """This process's rank in its job, as its launcher set it (0 if none did)."""
    return next((int(os.environ[v]) for v in RANK_VARS if os.environ.get(v, "").isdigit()), 0)


@dataclass
class JobProtocol:
    job_id: int | None = None
    run_id: int | None = None
    run_dir: Path | None = None
    checkpoint_dir: Path = Path("marble-checkpoint")
    broker_pid: int | None = None
    target_steps: int | None = None
    gpus: int = 0
    share: int = 1  # n > 1: 1/n of the one GPU
    start_step: int | None = None  # where this run began (after restoring its checkpoint)
    suspend_requested: bool = False
    signalled_at: float | None = None
    phases: dict[str, float] = field(default_factory=dict)  # start-up timeline of this run
    report_interval: float = 1.0  # seconds between progress reports
    waits_for_go: bool = False  # the job calls ready(): the broker may prestart its next run
    rank: int = 0  # in a multi-node job, this process's rank; only rank 0 speaks for the job
    _last_report: float = field(default=0.0, repr=False)
    # (step, time) of recent reports: the broker measures the speed since the oldest
    _recent: deque = field(default_factory=deque, repr=False)

    @classmethod
    def from_env(cls) -> JobProtocol:
        env = os.environ
        devices = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        proto = cls(
            job_id=_int_env("MARBLE_JOB_ID"),
            run_id=_int_env("MARBLE_RUN_ID"),
            run_dir=Path(env["MARBLE_RUN_DIR"]) if env.get("MARBLE_RUN_DIR") else None,
            checkpoint_dir=Path(env.get("MARBLE_CHECKPOINT_DIR") or "marble-checkpoint"),
            broker_pid=_int_env("MARBLE_BROKER_PID"),
            target_steps=_int_env("MARBLE_TARGET_STEPS"),
            gpus=_int_env("MARBLE_GPUS") or len(devices),
            share=_int_env("MARBLE_GPU_SHARE") or 1,
            rank=_env_rank(),
        )
        with contextlib.suppress(ValueError):
            proto.phases["launch"] = float(env.get("MARBLE_LAUNCH_TIME", ""))
        with contextlib.suppress(KeyError, ValueError):  # marble profile: frequent reports
            proto.report_interval = float(env["MARBLE_REPORT_INTERVAL"])
        proto.mark("python")
        return proto

    def install(self) -> JobProtocol:
        """Catch SIGTSTP (flag only), keep syscalls restarting, and unblock it; this becomes
        the process's protocol (`current()`)."""
        global _current
        signal.signal(signal.SIGTSTP, self._on_tstp)
        signal.siginterrupt(signal.SIGTSTP, False)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTSTP])
        _current = self
        self._check_request()
        return self

    @classmethod
    def current(cls) -> JobProtocol:
        """The process's protocol: the one installed, else one made from the environment and
        installed now. Installing late is safe: a SIGTSTP sent before it is discarded (a
        local run is an orphaned process group; a Slurm or LSF step starts with SIGTSTP
        ignored) and the broker's request file is read at install, at the restore and with
        every progress report."""
        return _current or cls.from_env().install()

    def _check_request(self) -> None:
        """A SIGTSTP sent before the handler was installed is lost; the broker's request
        file is not. Checked at start-up, after the restore and with every progress report."""
        if self.run_dir is None or self.suspend_requested:
            return
        request = read_json(self.run_dir / SUSPEND_FILE)
        if request is not None and request.get("run_id") == self.run_id:
            self.signalled_at = request.get("at")
            self.suspend_requested = True

    def _on_tstp(self, signum, frame) -> None:
        if not self.suspend_requested:
            self.signalled_at = time.time()
        self.suspend_requested = True

    def mark(self, phase: str) -> None:
        """Note when a start-up phase ended (python, imported, built, restored, first_step)."""
        self.phases.setdefault(phase, time.time())

    def report(self, step: int, *, start_step: int | None = None, force: bool = False) -> None:
        """Tell the broker how far the job is (at most once per `report_interval`)."""
        now = time.time()
        if self.run_dir is None or (not force and now - self._last_report < self.report_interval):
            return
        if self.rank != 0:  # one process reports for a multi-node job
            self._last_report = now
            self._check_request()
            return
        self._last_report = now
        if start_step is not None:
            self.start_step = start_step
        self._recent.append((step, now))
        while len(self._recent) > 1 and now - self._recent[1][1] >= RATE_WINDOW_S:
            self._recent.popleft()
        since_step, since_time = self._recent[0]
        payload = {"run_id": self.run_id, "step": step, "start_step": self.start_step,
                   "time": now, "phases": self.phases, "prestart": self.waits_for_go,
                   "since": {"step": since_step, "time": since_time}}
        atomic_write_json(self.run_dir / PROGRESS_FILE, payload, durable=False)
        self._check_request()

    def acknowledge(self, step: int, **detail) -> None:
        """The checkpoint at `step` is on disk: tell the broker, by marker and by SIGUSR1."""
        if self.rank != 0:
            return
        if self.run_dir is not None:
            atomic_write_json(
                self.run_dir / ACK_FILE,
                {"run_id": self.run_id, "step": step, "time": time.time(),
                 "signalled_at": self.signalled_at, **detail},
            )
        if self.broker_pid:
            # If the broker is gone, the marker is read when the next one comes up.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.broker_pid, signal.SIGUSR1)

    def ready(self) -> None:
        """Call once the heavy imports are done, before the job touches a GPU.

        Usually this returns at once. When the broker *prestarted* this process
        (it launches the next run of a job while the old run is still writing its
        checkpoint, so that the imports are done by the time the GPUs are free),
        it waits here for the broker's go, then takes its run id and GPUs from it.
        Calling it tells the broker that this job may be prestarted.
        """
        self.waits_for_go = True
        self.mark("imported")
        go_file = os.environ.pop(STANDBY_VAR, None)
        if go_file is None:
            return
        go = wait_for_go(Path(go_file), self.broker_pid, os.environ.get(STANDBY_BROKER_VAR))
        if go is None:
            os._exit(0)
        os.environ.update({k: str(v) for k, v in go.items()})
        self.run_id = int(go["MARBLE_RUN_ID"])
        self.gpus = int(go["MARBLE_GPUS"])
        self.share = int(go.get("MARBLE_GPU_SHARE", 1))
        self.rank = _env_rank()  # a prestarted rank of a per-GPU run learns its rank here
        self.phases["go"] = time.time()

    # -- step boundaries, shared by the framework helpers

    def restored(self, step: int) -> None:
        """The job restored its checkpoint at `step` (0 for a fresh start)."""
        self.mark("restored")
        self.report(step, start_step=step, force=True)

    def step_finished(self, step: int, save: Callable[[int], object],
                      saved_step: int | None = None, fast_exit: bool = True) -> None:
        """Call after every step: reports progress, and suspends if the broker asked."""
        self.mark("first_step")
        self.report(step)
        if self.suspend_requested:
            self.checkpoint_and_exit(step, save, saved_step, fast_exit)

    def checkpoint_and_exit(self, step: int, save: Callable[[int], object],
                            saved_step: int | None = None, fast_exit: bool = True) -> NoReturn:
        """Save `step` (unless it is saved already), acknowledge, and exit.

        In a multi-node job only rank 0 saves and acknowledges; the other ranks exit.

        With `fast_exit` the process ends with os._exit(0) right after the
        acknowledgement: interpreter teardown with a framework loaded takes about a
        second, and the broker waits for the exit before it reuses the GPUs.
        """
        t0 = time.time()
        if saved_step != step and self.rank == 0:
            save(step)
        self.acknowledge(step, save_seconds=time.time() - t0)
        sys.stdout.flush()
        sys.stderr.flush()
        if fast_exit:
            os._exit(0)
        sys.exit(0)
