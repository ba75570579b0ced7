"""The broker's side of the file protocol with its jobs (`marbled.worker.protocol`).

Each job has a directory under the state directory, kept across its runs: its
logs, its checkpoints, and the small JSON files the two sides exchange. A file
counts only if it names the run it is about: a marker left by an earlier run of
the same job is not this run's answer.
"""

from __future__ import annotations

from pathlib import Path

from marbled.core.failures import TAIL_BYTES, tail
from marbled.worker.protocol import (
    ACK_FILE,
    GO_FILE,
    PROGRESS_FILE,
    SUSPEND_FILE,
    atomic_write_json,
    read_json,
)


class JobFiles:
    def __init__(self, state_dir: Path):
        self.root = Path(state_dir) / "jobs"

    def dir(self, job_id: int) -> Path:
        return self.root / str(job_id)

    def stdout(self, job_id: int) -> Path:
        return self.dir(job_id) / "stdout.log"

    def stderr(self, job_id: int) -> Path:
        return self.dir(job_id) / "stderr.log"

    def checkpoints(self, job_id: int) -> Path:
        return self.dir(job_id) / "checkpoint"

    def go_file(self, job_id: int) -> Path:
        return self.dir(job_id) / GO_FILE

    def prepare_run(self, job_id: int) -> None:
        """Before a launch: the directories exist, and no answer of an earlier run is left."""
        self.checkpoints(job_id).mkdir(parents=True, exist_ok=True)
        for stale in (ACK_FILE, PROGRESS_FILE, SUSPEND_FILE):
            (self.dir(job_id) / stale).unlink(missing_ok=True)

    def ask_to_suspend(self, job_id: int, run_id: int, at: float) -> None:
        """The request a job finds even if its SIGTSTP came before its handler."""
        atomic_write_json(self.dir(job_id) / SUSPEND_FILE, {"run_id": run_id, "at": at},
                          durable=False)

    def ack(self, job_id: int, run_id: int) -> dict | None:
        """The run's acknowledgement of a suspension (its checkpoint is on disk), if any."""
        return self._of_run(ACK_FILE, job_id, run_id)

    def progress(self, job_id: int, run_id: int) -> dict:
        """The run's last progress report (step, start step, start-up phases), or {}."""
        return self._of_run(PROGRESS_FILE, job_id, run_id) or {}

    def _of_run(self, name: str, job_id: int, run_id: int) -> dict | None:
        doc = read_json(self.dir(job_id) / name)
        return doc if doc is not None and doc.get("run_id") == run_id else None

    def waits_for_go(self, job_id: int, once_training: bool) -> bool:
        """May the job's next run be prestarted? Only if its worker said it waits for a go
        file (a script that ignored it would train twice); with `once_training`, only once
        the current run trains, so the new process's imports do not slow down a run that
        has just resumed."""
        progress = read_json(self.dir(job_id) / PROGRESS_FILE) or {}
        if not progress.get("prestart"):
            return False
        return not once_training or "first_step" in progress.get("phases", {})

    def stderr_tail(self, job_id: int) -> str:
        path = self.stderr(job_id)
        try:
            with open(path, "rb") as f:
                f.seek(max(0, path.stat().st_size - TAIL_BYTES))
                return tail(f.read())
        except OSError:
            return ""
