"""The broker's side of the file protocol with its jobs (`marbled.worker.protocol`).

Each job has a directory under the state directory, kept across its runs: its
logs, its checkpoints, and the small JSON files the two sides exchange. A file
counts only if it names the run it is about: a marker left by an earlier run of
the same job is not this run's answer.
"""

from __future__ import annotations

import os
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
        # Each job's last progress report as read, by what stat() says of its file: the
        # monitor and the API look often, a job reports every few seconds at most.
        self._progress: dict[int, tuple[tuple[int, int, int], dict | None]] = {}

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
        """Before a launch: the directories exist, and no answer of an earlier run is left
        (a new job's directory has none: two system calls then, not seven)."""
        jdir = self.dir(job_id)
        self._progress.pop(job_id, None)
        try:
            os.mkdir(jdir)
        except FileNotFoundError:
            self.root.mkdir(parents=True, exist_ok=True)
            os.mkdir(jdir)
        except FileExistsError:
            for stale in (ACK_FILE, PROGRESS_FILE, SUSPEND_FILE):
                (jdir / stale).unlink(missing_ok=True)
            self.checkpoints(job_id).mkdir(exist_ok=True)
            return
        os.mkdir(self.checkpoints(job_id))

    def forget(self, job_id: int) -> None:
        """The job has ended: its last report need not be kept."""
        self._progress.pop(job_id, None)

    def ask_to_suspend(self, job_id: int, run_id: int, at: float) -> None:
        """The request a job finds even if its SIGTSTP came before its handler."""
        atomic_write_json(self.dir(job_id) / SUSPEND_FILE, {"run_id": run_id, "at": at},
                          durable=False)

    def ack(self, job_id: int, run_id: int) -> dict | None:
        """The run's acknowledgement of a suspension (its checkpoint is on disk), if any."""
        return self._of_run(ACK_FILE, job_id, run_id)

    def progress(self, job_id: int, run_id: int) -> dict:
        """The run's last progress report (step, start step, start-up phases), or {}. The
        same dict while the file is unchanged: read it, do not change it."""
        doc = self._last_progress(job_id)
        return doc if doc is not None and doc.get("run_id") == run_id else {}

    def _last_progress(self, job_id: int) -> dict | None:
        """The job's progress file, parsed again only when stat() shows a new one (a job
        replaces it atomically: a new inode, mtime and size) -- a tick of the monitor costs
        a stat per run, not an open, a read and a parse."""
        path = self.dir(job_id) / PROGRESS_FILE
        try:
            st = os.stat(path)
        except OSError:
            self._progress.pop(job_id, None)
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        known = self._progress.get(job_id)
        if known is not None and known[0] == key:
            return known[1]
        doc = read_json(path)
        self._progress[job_id] = (key, doc)
        return doc

    def _of_run(self, name: str, job_id: int, run_id: int) -> dict | None:
        doc = read_json(self.dir(job_id) / name)
        return doc if doc is not None and doc.get("run_id") == run_id else None

    def waits_for_go(self, job_id: int, once_training: bool) -> bool:
        """May the job's next run be prestarted? Only if its worker said it waits for a go
        file (a script that ignored it would train twice); with `once_training`, only once
        the current run trains, so the new process's imports do not slow down a run that
        has just resumed."""
        progress = self._last_progress(job_id) or {}
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
