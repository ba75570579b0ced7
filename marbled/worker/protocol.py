"""The in-job side of MARBLE's suspend/resume protocol. Standard library only.

The broker starts every run with:

  MARBLE_JOB_ID, MARBLE_RUN_ID   which job and which launch segment this is
  MARBLE_RUN_DIR                 where the protocol files below live
  MARBLE_CHECKPOINT_DIR          where the job keeps its checkpoints (kept across runs)
  MARBLE_BROKER_PID              the broker, on this node, for SIGUSR1
  MARBLE_TARGET_STEPS            the step count the job should end at (if known)
  CUDA_VISIBLE_DEVICES, MARBLE_GPUS   the GPUs of this run, and how many

Suspension: the broker sends SIGTSTP to the job's process group. The handler
only sets a flag. At the next step boundary the job writes its checkpoint
(atomically), calls `acknowledge(step)` -- which writes the ack marker and sends
SIGUSR1 to the broker -- and exits. The marker alone is enough for the broker
(it also polls for it), so a lost signal costs latency, not correctness.

Install the handler in the first lines of the job's entry point, before heavy
imports: a SIGTSTP that arrives before it is silently dropped (the job runs in
its own session, an orphaned process group).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

ACK_FILE = "ack.json"
PROGRESS_FILE = "progress.json"


def atomic_write_json(path: Path, payload: dict, durable: bool = True) -> None:
    """Write `payload` to `path` so readers see the old or the new file, never a torn one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(payload, f)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _int_env(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.strip().isdigit() else None


@dataclass
class JobProtocol:
    job_id: int | None = None
    run_id: int | None = None
    run_dir: Path | None = None
    checkpoint_dir: Path | None = None
    broker_pid: int | None = None
    target_steps: int | None = None
    gpus: int = 0
    start_step: int | None = None  # where this run began (after restoring its checkpoint)
    suspend_requested: bool = False
    signalled_at: float | None = None
    _last_report: float = field(default=0.0, repr=False)

    @classmethod
    def from_env(cls) -> JobProtocol:
        env = os.environ
        devices = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        return cls(
            job_id=_int_env("MARBLE_JOB_ID"),
            run_id=_int_env("MARBLE_RUN_ID"),
            run_dir=Path(env["MARBLE_RUN_DIR"]) if env.get("MARBLE_RUN_DIR") else None,
            checkpoint_dir=Path(env.get("MARBLE_CHECKPOINT_DIR") or "marble-checkpoint"),
            broker_pid=_int_env("MARBLE_BROKER_PID"),
            target_steps=_int_env("MARBLE_TARGET_STEPS"),
            gpus=_int_env("MARBLE_GPUS") or len(devices),
        )

    @property
    def managed(self) -> bool:
        """True when a broker started this process."""
        return self.run_dir is not None

    def install(self) -> JobProtocol:
        """Catch SIGTSTP (flag only), keep syscalls restarting, and unblock it."""
        signal.signal(signal.SIGTSTP, self._on_tstp)
        signal.siginterrupt(signal.SIGTSTP, False)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTSTP])
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        return self

    def _on_tstp(self, signum, frame) -> None:
        if not self.suspend_requested:
            self.signalled_at = time.time()
        self.suspend_requested = True

    def report(self, step: int, *, start_step: int | None = None, force: bool = False,
               every: float = 1.0) -> None:
        """Tell the broker how far the job is (at most once per `every` seconds)."""
        now = time.time()
        if self.run_dir is None or (not force and now - self._last_report < every):
            return
        self._last_report = now
        if start_step is not None:
            self.start_step = start_step
        payload = {"run_id": self.run_id, "step": step, "start_step": self.start_step,
                   "time": now}
        atomic_write_json(self.run_dir / PROGRESS_FILE, payload, durable=False)

    def acknowledge(self, step: int) -> None:
        """The checkpoint at `step` is on disk: tell the broker, by marker and by SIGUSR1."""
        if self.run_dir is not None:
            atomic_write_json(
                self.run_dir / ACK_FILE,
                {"run_id": self.run_id, "step": step, "time": time.time(),
                 "signalled_at": self.signalled_at},
            )
        if self.broker_pid:
            # If the broker is gone, the marker is read when the next one comes up.
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.broker_pid, signal.SIGUSR1)
