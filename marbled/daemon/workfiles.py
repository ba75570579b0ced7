"""The broker's side of the file protocol with its jobs (`marbled.worker.protocol`).

Each job has a directory under the state directory, kept across its runs: its
logs, its checkpoints, and the small JSON files the two sides exchange. A file
counts only if it names the run it is about: a marker left by an earlier run of
the same job is not this run's answer, and only if its fields have the protocol's
types (`protocol.malformed`): a report with a step written as a string is taken for none,
and said once in the log, not left to fail the broker's handling of the run's end.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import os
import secrets
from pathlib import Path

from marbled.batch.ranks import rank_prefix
from marbled.batch.supervise import exit_file_name, read_exit
from marbled.core.failures import TAIL_BYTES, tail
from marbled.worker.protocol import (
    ACK_FILE,
    PROGRESS_FILE,
    SUSPEND_FILE,
    atomic_write_json,
    malformed,
    read_json,
)

log = logging.getLogger("marbled")

LOG_STREAMS = ("stdout", "stderr")
SAID_PER_JOB = 16  # malformed files of a job logged at most (a file per run, each once)
EXIT_PREFIX = exit_file_name("")[:-len(".json")]  # "exit-": the runs' exit files
GO_PREFIX, RANK_GO = "go-", "-rank-"  # standbys' go files; a per-GPU standby's ranks' own
NO_OUTPUT = {"offset": 0, "next_offset": 0, "size": 0, "text": ""}


class JobFiles:
    def __init__(self, state_dir: Path):
        self.root = Path(state_dir) / "jobs"
        # progress paths are joined as strings: a Path join costs more than the stat, and
        # the broker reads every live run's progress at each end (EndCoalescer.coalesce)
        self._root = str(self.root)
        # Each job's last progress report as read, by what stat() says of its file: the
        # monitor and the API look often, a job reports every few seconds at most.
        self._progress: dict[int, tuple[tuple[int, int, int], dict | None]] = {}
        # the malformed files logged, by job: (file, run) once each, until the job ends
        self._said: dict[int, set[tuple[str, object]]] = {}

    def dir(self, job_id: int) -> Path:
        return self.root / str(job_id)

    def log(self, job_id: int, run_id: int, stream: str) -> Path:
        """A run's output (`stream`: stdout or stderr): a file per run, so that each run's
        output can be read, followed and served alone (`marble logs`)."""
        return self.dir(job_id) / f"run-{run_id}.{stream}.log"

    def standby_log(self, job_id: int, stream: str) -> Path:
        """The output of the job's prestarted process, which has no run yet: it becomes
        its run's log when the process is handed the run (`adopt_standby_logs`)."""
        return self.dir(job_id) / f"standby.{stream}.log"

    def clear_standby_logs(self, job_id: int) -> None:
        """Before a prestart: what a dropped standby printed is no run's output."""
        for stream in LOG_STREAMS:
            self.standby_log(job_id, stream).unlink(missing_ok=True)

    def adopt_standby_logs(self, job_id: int, run_id: int) -> None:
        """The prestarted process now runs `run_id`: its logs become the run's. A rename
        keeps the process's open file (same directory), so nothing it writes is lost; if
        the standby had died, what it printed heads the run's log."""
        for stream in LOG_STREAMS:
            with contextlib.suppress(FileNotFoundError):
                os.replace(self.standby_log(job_id, stream), self.log(job_id, run_id, stream))

    def checkpoints(self, job_id: int) -> Path:
        return self.dir(job_id) / "checkpoint"

    def go_file(self, job_id: int) -> Path:
        """A new standby's go file, named for it alone: a standby a broker killed -9 left
        waiting (on a node where it cannot see that broker die) must never read the go of
        the next broker's standby for the same job and start as that run too."""
        return self.dir(job_id) / f"{GO_PREFIX}{secrets.token_hex(8)}.json"

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
            # the exit files of the job's earlier runs: each run's end is recorded by now;
            # their standbys' go files, each read by now (a new one is written after this)
            for name in os.listdir(jdir):
                if name.endswith(".json") and (name.startswith(EXIT_PREFIX) or (
                        name.startswith(GO_PREFIX) and RANK_GO not in name)):
                    (jdir / name).unlink(missing_ok=True)
            self.checkpoints(job_id).mkdir(exist_ok=True)
            return
        os.mkdir(self.checkpoints(job_id))

    def exit_file(self, job_id: int, run_id: int) -> Path:
        """Where the run's supervisor records its exit status (marbled.batch.supervise)."""
        return self.dir(job_id) / exit_file_name(run_id)

    def exit_code(self, job_id: int, run_id: int) -> int | None:
        """The run's exit code as its supervisor recorded it; None if it recorded none."""
        return read_exit(self.dir(job_id), run_id)

    def forget(self, job_id: int) -> None:
        """The job has ended: its last report, and which of its files were malformed, need
        not be kept."""
        self._progress.pop(job_id, None)
        self._said.pop(job_id, None)

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
        path = f"{self._root}/{job_id}/{PROGRESS_FILE}"
        try:
            st = os.stat(path)
        except OSError:
            self._progress.pop(job_id, None)
            return None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        known = self._progress.get(job_id)
        if known is not None and known[0] == key:
            return known[1]
        doc = self._checked(PROGRESS_FILE, job_id, read_json(path))
        self._progress[job_id] = (key, doc)
        return doc

    def _of_run(self, name: str, job_id: int, run_id: int) -> dict | None:
        doc = self._checked(name, job_id, read_json(self.dir(job_id) / name))
        return doc if doc is not None and doc.get("run_id") == run_id else None

    def _checked(self, name: str, job_id: int, doc: dict | None) -> dict | None:
        """`doc`, or None if a field has a type the protocol does not write (logged once
        for each run the file names, for SAID_PER_JOB runs of a job at most)."""
        wrong = malformed(doc) if doc is not None else None
        if wrong is None:
            return doc
        run = doc.get("run_id")
        said = (name, run if isinstance(run, int) else None)  # a run id, or not one
        seen = self._said.setdefault(job_id, set())
        if said not in seen and len(seen) < SAID_PER_JOB:
            seen.add(said)
            log.warning("job %d: its %s is not a report the broker can use (%s): taken for "
                        "none", job_id, name, wrong)
        return None

    def waits_for_go(self, job_id: int, once_training: bool) -> bool:
        """May the job's next run be prestarted? Only if its worker said it waits for a go
        file (a script that ignored it would train twice); with `once_training`, only once
        the current run trains, so the new process's imports do not slow down a run that
        has just resumed."""
        progress = self._last_progress(job_id) or {}
        if not progress.get("prestart"):
            return False
        return not once_training or "first_step" in progress.get("phases", {})

    def stderr_tail(self, job_id: int, run_id: int) -> str:
        """The last lines the run printed on stderr (why it failed, often)."""
        path = self.log(job_id, run_id, "stderr")
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - TAIL_BYTES))
                return tail(f.read())
        except OSError:
            return ""

    def read_log(self, job_id: int, run_id: int, stream: str, offset: int, limit: int,
                 lines: int | None = None, rank: int | None = None) -> dict:
        """At most `limit` bytes of a run's log from byte `offset`, or its last `lines`
        lines (none before `offset`), as text: {offset, next_offset, size, text}. A page
        cut by `limit` ends at a line's end (or a whole character), so `next_offset`
        continues it; a log of any size costs one read of `limit` bytes. With `rank`, only
        that rank's lines of a per-GPU run, without their prefix (`rank_page`)."""
        try:
            f = open(self.log(job_id, run_id, stream), "rb")  # noqa: SIM115
        except FileNotFoundError:  # the run has not started, or printed nothing yet
            return dict(NO_OUTPUT)
        with f:
            size = os.fstat(f.fileno()).st_size
            start = min(offset, size)
            if lines is not None:
                start = max(start, size - limit)
                f.seek(start)
                data = f.read(size - start)
                if rank is not None:
                    return rank_page(data, start, size, rank, lines,
                                     whole=start == 0 or start == offset)
                skip = tail_start(data, lines, whole=start == 0 or start == offset)
                start, data = start + skip, data[skip:]
            else:
                f.seek(start)
                data = f.read(min(limit, size - start))
                if rank is not None:
                    return rank_page(data, start, size, rank)
        text, used = page_text(data, cut=start + len(data) < size)
        return {"offset": start, "next_offset": start + used, "size": size, "text": text}


def rank_page(data: bytes, start: int, size: int, rank: int, lines: int | None = None,
              whole: bool = True) -> dict:
    """A page of rank `rank`'s lines in `data` (the log's bytes from `start`), the
    `[rank N] ` prefix (the local launcher's) or `N: ` label (srun --label's, space-padded to
    the widest rank's) taken off; with `lines`, its last `lines` of them. A page cut short
    of the log's end ends at a line's end (unless one line fills it), as page_text's.
    `whole`: `data` starts at a line's start, else its first (part of a) line is left out."""
    first = 0 if whole else data.find(b"\n") + 1
    end = len(data)
    if start + len(data) < size:
        end = data.rfind(b"\n") + 1 or end
    prefix, label = rank_prefix(rank), f"{rank}: ".encode()
    kept = []
    for line in data[first:end].split(b"\n"):
        if line.startswith(prefix):
            kept.append(line[len(prefix):])
        elif line.lstrip(b" ").startswith(label):
            kept.append(line.lstrip(b" ")[len(label):])
    if lines is not None:
        kept = kept[-lines:]
    text = b"".join(line + b"\n" for line in kept).decode(errors="replace")
    return {"offset": start + first, "next_offset": start + end, "size": size, "text": text}


def tail_start(data: bytes, lines: int, whole: bool) -> int:
    """Where the last `lines` lines of `data` begin (a last line's own newline does not
    count). When `data` holds fewer, it is all of them if `whole` (the log's start), else
    from its first line's start (a window cut from a longer log starts mid-line)."""
    body = data[:-1] if data.endswith(b"\n") else data
    cut = len(body)
    for _ in range(lines):
        cut = body.rfind(b"\n", 0, cut)
        if cut < 0:
            break
    if cut >= 0:
        return cut + 1
    first = body.find(b"\n")
    return 0 if whole or first < 0 else first + 1


def page_text(data: bytes, cut: bool) -> tuple[str, int]:
    """A page of a log as text, and the bytes it used. A page that stops before the log's
    end (`cut`) ends at its last newline, or without the first bytes of a character split
    by the cut: the next page starts with them."""
    if cut:
        end = data.rfind(b"\n") + 1
        if end:
            return data[:end].decode(errors="replace"), end
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        text = decoder.decode(data, final=False)
        used = len(data) - len(decoder.getstate()[0])
        if used:  # else a page too small for one character: take it as it is
            return text, used
    return data.decode(errors="replace"), len(data)
