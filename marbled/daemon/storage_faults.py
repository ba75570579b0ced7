"""Faults of storage: what they are, what to do about them, and how the writes survive them.

**Faults of storage are survived.** A transaction the store refuses for a reason
of storage (a full disk or quota, a read-only database or filesystem, an I/O
error, a lock held too long: `storage_fault`) is rolled back and its writes are
*held* in memory, in order; the ledger is `fault` (the reason, with what to
free) and retries them every RETRY_FIRST s, doubling to RETRY_MAX s (`retry`,
given by `ledger.py`); the retry that commits clears the fault, logs how many writes
were held, and calls `on_recovered`. The submissions in a refused transaction are
refused (their submitters hear `StoreRefused`: 503, and the broker drops their
jobs from its state), and while the fault lasts new ones are refused at once.
Reads go on from what was committed. A broker that must stop with writes held
saves them beside the database (`spill`) when it can; the next ledger on that
store applies them before anything reads it.

`SurvivesFaults` is that part of a `Journal` (`journal.py`, which groups the
writes into transactions and tells it of a refused or recovered commit).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from marbled.core.errors import Unavailable
from marbled.store.damage import damaged, is_damage

if TYPE_CHECKING:
    from marbled.daemon.journal import _Write

log = logging.getLogger("marbled")

REMIND = 60.0  # seconds between the log's reminders that writes are held
SPILL_SUFFIX = ".held.json"  # beside the database: writes a stopped broker still held

# SQLite's primary result codes that say the storage failed, not the statement
_SQLITE_FAULTS = {5: "locked", 6: "locked", 8: "readonly", 10: "ioerr", 13: "full",
                  14: "cantopen"}
_OS_FAULTS = {errno.ENOSPC: "full", errno.EDQUOT: "quota", errno.EROFS: "readonly",
              errno.EIO: "ioerr"}
_MESSAGES = (("database or disk is full", "full"), ("readonly database", "readonly"),
             ("disk i/o error", "ioerr"), ("database is locked", "locked"),
             ("unable to open database file", "cantopen"))


def storage_fault(exc: BaseException) -> str | None:
    """The kind of storage fault `exc` is ('full', 'quota', 'readonly', 'ioerr', 'locked',
    'cantopen'), which a retry may cure once space or access returns; None for a fault of
    the statement (a constraint, a bug), which no retry cures; 'damaged' for a database file
    that is (which only its recovery cures: the writes are held meanwhile all the same)."""
    if isinstance(exc, OSError):
        return _OS_FAULTS.get(exc.errno)
    if is_damage(exc):
        return "damaged"
    if not isinstance(exc, sqlite3.OperationalError):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return _SQLITE_FAULTS.get(code & 0xFF)
    text = str(exc).lower()
    return next((kind for words, kind in _MESSAGES if words in text), None)


def mount_point(path: Path) -> Path:
    """The mount point of the filesystem `path` is on."""
    path = Path(os.path.abspath(path))
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def _diagnose(kind: str | None, db: Path) -> tuple[str | None, Path]:
    """A closer look at a fault SQLite reports vaguely (an I/O error may be a file made
    immutable, or a full disk): its kind, and the file at fault."""
    if kind in ("ioerr", "readonly", "cantopen"):
        for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"),
                     db.parent):
            if path.exists() and not os.access(path, os.W_OK):
                return "readonly", path
    if kind == "ioerr":
        with contextlib.suppress(OSError):
            disk = os.statvfs(db.parent)
            if disk.f_bavail * disk.f_frsize < 1 << 16:
                return "full", db
    return kind, db


class StoreRefused(Unavailable):
    """A submission the store could not take while it cannot be written (a full disk): it was
    not accepted (503), and the broker forgets its `jobs`."""

    def __init__(self, message: str, jobs: Iterable[int] = ()):
        super().__init__(message)
        self.jobs = tuple(jobs)


class StorageLost(RuntimeError):
    """The broker stops with writes its store never took."""


class _Recorder:
    """A connection that only keeps the statements it is given (to save held writes)."""

    def __init__(self):
        self.statements: list[list] = []

    def execute(self, sql: str, args=()) -> None:
        self.statements.append([sql, list(args)])

    def executemany(self, sql: str, rows) -> None:
        self.statements.append([sql, [list(r) for r in rows], "many"])


class SurvivesFaults:
    """The part of a `Journal` that survives faults of storage: holds the writes of a
    transaction the store refused, tries them again, and saves them for the next broker if
    this one must stop first. Its state is made by `__init__`, called by `Journal`'s."""

    def __init__(self, retry: tuple[float, float]):
        # Storage faults: why writes are held (None: they are written), and their retry.
        self.fault: str | None = None
        self._fault_since = self._reminded = 0.0
        self._retry: asyncio.TimerHandle | None = None
        self._retry_first, self._retry_max = retry
        self._retry_in = self._retry_first
        self.held_most = 0  # the most writes held at once
        self.dropped_samples = 0  # GPU samples not kept while writes were held
        self._spilled = False  # the held writes were saved for the next broker: write no more
        self._writable: asyncio.Future | None = None  # what `until_written` waits on
        self._waits_stopped = False  # the broker stops: `until_written` waits no more
        self._apply_spill()

    @property
    def held(self) -> int:
        """Writes held in memory while the store cannot take them."""
        return len(self._pending) if self.fault is not None else 0

    async def until_written(self) -> bool:
        """Wait while the store refuses writes: True once the writes held are committed (so
        is everything written before this was called), False if the broker stops first
        (`stop_waits`). A run is started only once its record is committed: a broker killed
        before then would not know the run, and the next one would start its job again."""
        while self.fault is not None:
            if self._waits_stopped:
                return False
            if self._writable is None or self._writable.done():
                self._writable = asyncio.get_running_loop().create_future()
            if not await asyncio.shield(self._writable):
                return False
        return True

    def stop_waits(self) -> None:
        """The broker stops: what waits in `until_written` gives up (the held writes are
        saved for the next broker, which settles the runs never started)."""
        self._waits_stopped = True
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(False)

    def _refused(self, writes: list[_Write], exc: BaseException) -> None:
        """The store refused the transaction of `writes` (full, read-only, failing): roll it
        back, hold its writes ahead of any made since, in order, and try them again later;
        refuse the submissions among them."""
        self._seen.clear()
        if self.db.in_transaction:
            try:
                self.db.rollback()
            except sqlite3.Error as again:
                log.debug("rolling back the refused transaction: %s", again)
        kind = storage_fault(exc)
        first = self.fault is None
        self.fault = self._advice(kind, exc)
        refused = [w for w in writes if w.jobs]
        kept = [w for w in writes if not w.jobs]
        now = time.monotonic()
        if first:
            self._fault_since = self._reminded = now
            self._retry_in = self._retry_first
            kept.insert(0, self._own_event(  # the journal will say when and why
                "store-unwritable", {"error": str(exc), "reason": self.fault}))
        self._pending[:0] = kept
        self.held_most = max(self.held_most, len(self._pending))
        if first:
            log.error("the store cannot be written (%s): %s. Its writes are held in memory "
                      "(%d now) and tried again every %g-%g s; submissions get 503 until then; "
                      "running jobs go on", exc, self.fault, len(self._pending),
                      self._retry_first, self._retry_max)
        elif now - self._reminded >= REMIND:
            self._reminded = now
            log.warning("the store still cannot be written after %.0f s (%s): %s; %d writes "
                        "held", now - self._fault_since, exc, self.fault, len(self._pending))
        else:
            log.debug("the store still refuses writes (%s); %d held", exc, len(self._pending))
        grouped: list[int] = []
        for write in refused:
            write.refused = StoreRefused(f"not accepted: {self.fault}", write.jobs)
            self._forget(write.jobs)
            if write.future is not None:
                grouped += write.jobs
                if not write.future.done():
                    write.future.set_exception(write.refused)
                    write.future.exception()  # its submitter may be gone: no warning then
        if grouped:  # the broker's state holds them: it must forget them
            self.on_failure(StoreRefused(f"not accepted: {self.fault}", grouped))
        self._schedule_retry()

    def _forget(self, jobs: tuple[int, ...]) -> None:
        """The jobs of a refused submission, never written: a subclass forgets what it kept
        of them (nothing here)."""

    def _advice(self, kind: str | None, exc: BaseException) -> str:
        """Why writes are held, and what to do about it."""
        db = self.store.path
        if db is None:
            return f"the store refuses writes ({exc})"
        state_dir = db.parent
        mount = mount_point(state_dir)
        kind, db = _diagnose(kind, db)
        match kind:
            case "full":
                return (f"the state directory's disk is full: free space on {mount} (the "
                        f"filesystem of {state_dir})")
            case "quota":
                return (f"the disk quota on {mount} is exceeded: free space there or raise "
                        f"the quota (the state directory {state_dir})")
            case "readonly":
                return (f"{db} cannot be written (read-only): make it writable again (its "
                        f"mode; its immutable flag: lsattr; or {mount} mounted read-only)")
            case "locked":
                return (f"the database {db} is locked by another process: stop what holds it "
                        f"(fuser {db})")
            case "cantopen":
                return f"the database's files in {state_dir} cannot be opened ({exc})"
            case "damaged":  # (running jobs go on; `marble shutdown` checkpoints them)
                return damaged(db, exc)
            case _:
                return f"writing the database {db} fails ({exc}): check the filesystem {mount}"

    def _schedule_retry(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # the next write or flush tries
        delay, self._retry_in = self._retry_in, min(self._retry_in * 2, self._retry_max)
        self._retry = loop.call_later(delay, self._try_again)

    def _try_again(self) -> None:
        self._retry = None
        if self.fault is None:
            return
        if self._depth:  # never from a callback, but a scope's end will not retry
            self._schedule_retry()
            return
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 (no caller to raise to: the broker stops)
            self.on_failure(exc)

    def _recovered(self, held: int) -> None:
        after = time.monotonic() - self._fault_since
        log.warning("the store can be written again after %.1f s: the %d writes held in the "
                    "meantime are committed; submissions are accepted again", after, held)
        self.fault = None
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self.dropped_samples:
            log.info("%d GPU samples were not kept while the store could not be written",
                     self.dropped_samples)
            self.dropped_samples = 0
        self._later(self._own_event("store-writable",
                                    {"held": held, "after_s": round(after, 3)}), soon=False)
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(True)
        self.on_recovered()

    @property
    def spill_path(self) -> Path | None:
        path = self.store.path
        return path.with_name(path.name + SPILL_SUFFIX) if path is not None else None

    def spill(self) -> Path | None:
        """Save the held writes beside the database, as SQL statements, for the next broker
        on this store to apply before it reads it; the file, or None if it could not be
        written (then the next broker settles the open runs from the jobs' files)."""
        if self.fault is None or not self._pending:
            return None
        recorder = _Recorder()
        for write in self._pending:
            write.apply(recorder)
        self._seen.clear()
        path = self.spill_path
        if path is None:
            return None
        tmp = path.with_name(path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with open(fd, "w") as f:
                json.dump({"statements": recorder.statements, "reason": self.fault}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            log.error("could not save the %d held writes to %s (%s): the next broker settles "
                      "the runs left open from the jobs' own files", len(self._pending), path,
                      exc)
            return None
        log.error("the store could not take %d writes before the broker stopped (%s): they "
                  "are saved in %s, and the next broker on this state directory applies them "
                  "first", len(self._pending), self.fault, path)
        self._pending.clear()  # saved: a later flush must not write them a second time
        self._spilled = True
        return path

    def _apply_spill(self) -> None:
        """Apply what a broker that stopped with writes held saved (see `spill`)."""
        path = self.spill_path
        if path is None or not path.exists():
            return
        try:
            statements = json.loads(path.read_text())["statements"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StorageLost(f"cannot read the writes a stopped broker saved in {path} "
                              f"({exc}); move it away to start without them") from None
        try:
            self.db.execute("BEGIN")
            for sql, args, *many in statements:
                (self.db.executemany if many else self.db.execute)(sql, args)
            self.db.commit()
        except sqlite3.Error as exc:
            if self.db.in_transaction:
                self.db.rollback()
            raise StorageLost(f"cannot apply the writes a stopped broker saved in {path} "
                              f"({exc}); free the store and start again") from None
        path.unlink()
        log.warning("applied the writes the last broker held when it stopped (%d statements, "
                    "saved in %s)", len(statements), path)

