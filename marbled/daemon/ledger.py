"""Every write the broker makes to its store, each change in one transaction with its event.

The `events` table is the journal; `jobs` and `runs` are derived from it and
written in the same transaction, so the two never disagree and a `kill -9`
between two changes loses neither. These are the broker's hot paths: plain SQL
on the store's one writing connection (`Store.writer`), each statement a
constant string that sqlite3 prepares once and caches, and `executemany` for
batches -- no SQLAlchemy statement building per write.

Every change is a `_Write`: a closure that writes it on a connection, the same
statements each time it is run. No write reads the database for what it writes:
the ids it gives (a run's id) and what it needs to know of a job (its step, its
first start, its failures) are kept here, as written. So a write can wait, and
be run again.

Writes are grouped, never reordered:

- **Submissions that arrive together share one transaction** (`submit_grouped`):
  the rows wait for the end of the loop's current round (or for the next write
  of any kind, which commits them first, in a transaction of their own), and each
  submitter hears that its jobs are durable only once that transaction has
  committed -- the API sends its 201 then.
- **Writes no one waits for** (`run_process`: a run's pid, which a restarted broker
  could also find by the process's environment) join the next transaction, or are
  committed on their own within `DEFER` seconds.
- **Changes made in one decision** (`batch()`) commit together.

**Faults of storage are survived.** A transaction the store refuses for a reason
of storage (a full disk or quota, a read-only database or filesystem, an I/O
error, a lock held too long: `storage_fault`) is rolled back and its writes are
*held* in memory, in order; the ledger is `fault` (the reason, with what to
free) and retries them every RETRY_FIRST s, doubling to RETRY_MAX s; the retry
that commits clears the fault, logs how many writes were held, and calls
`on_recovered`. The submissions in a refused transaction are refused (their
submitters hear `StoreRefused`: 503, and the broker drops their jobs from its
state), and while the fault lasts new ones are refused at once. Reads go on from
what was committed. A broker that must stop with writes held saves them beside
the database (`spill`) when it can; the next ledger on that store applies them
before anything reads it.

A commit that fails for another reason (a constraint, a bug) fails every
submission of its group (no 201 is sent) and calls `on_failure`: the broker
stops, since its state holds jobs its store does not; a new broker rebuilds from
what was committed.
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
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from marbled.core.admission import Admitted
from marbled.core.errors import Unavailable
from marbled.core.measure import Sample
from marbled.core.model import JobState, Start
from marbled.store.db import Store, placement_columns

log = logging.getLogger("marbled")

DEFER = 0.05  # seconds a write no one waits for may wait for company
RETRY_FIRST = 1.0  # seconds before held writes are tried again ...
RETRY_MAX = 10.0  # ... doubling up to this
REMIND = 60.0  # seconds between the log's reminders that writes are held
SPILL_SUFFIX = ".held.json"  # beside the database: writes a stopped broker still held

JOB_COLUMNS = (
    "id", "name", "model", "steps", "gpus_request", "demand", "nodes", "retries", "failures",
    "not_before", "malleable", "max_share", "command", "emulate", "after", "state", "step",
    "suspensions", "submitted_at", "started_at", "finished_at", "exit_code", "reason", "chdir",
    "per_gpu", "nodes_min", "env")
INSERT_ENVIRONMENT = "INSERT OR IGNORE INTO environments (digest, whole, vars) VALUES (?, ?, ?)"
INSERT_JOB = (f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)}) "
              f"VALUES ({', '.join('?' * len(JOB_COLUMNS))})")
INSERT_EVENT = "INSERT INTO events (at, kind, job_id, run_id, data) VALUES (?, ?, ?, ?, ?)"
INSERT_RUN = ("INSERT INTO runs (id, job_id, node, gpu_ids, gpu_count, share, role, started_at,"
              " start_step) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
FILL_END_STEP = ("UPDATE runs SET end_step = ? WHERE end_step IS NULL AND id = "
                 "(SELECT max(id) FROM runs WHERE job_id = ? AND id < ?)")

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
    the statement (a constraint, a bug), which no retry cures."""
    if isinstance(exc, OSError):
        return _OS_FAULTS.get(exc.errno)
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


def _json(value) -> str:
    """As the store's JSON columns hold values (SQLAlchemy's JSON type: None is 'null')."""
    return json.dumps(value)


def _json_once() -> Callable[[Hashable, object], str]:
    """_json(value), encoded once for each `key` (a request's jobs share their command, their
    dependencies and their submission event's data: one encoding, not one a job)."""
    done: dict[Hashable, str] = {}

    def encode(key: Hashable, value: object) -> str:
        text = done.get(key)
        if text is None:
            text = done[key] = json.dumps(value)
        return text

    return encode


class StoreRefused(Unavailable):
    """A submission the store could not take while it cannot be written (a full disk): it was
    not accepted (503), and the broker forgets its `jobs`."""

    def __init__(self, message: str, jobs: Iterable[int] = ()):
        super().__init__(message)
        self.jobs = tuple(jobs)


class StorageLost(RuntimeError):
    """The broker stops with writes its store never took."""


@dataclass(eq=False)
class _Write:
    """One change: `apply` writes it on a connection, the same statements each time."""

    apply: Callable[[sqlite3.Connection], None]
    future: asyncio.Future | None = None  # a submitter that waits for its commit
    jobs: tuple[int, ...] = ()  # a submission's jobs: refused, not held, if it cannot commit
    refused: StoreRefused | None = None


class _Recorder:
    """A connection that only keeps the statements it is given (to save held writes)."""

    def __init__(self):
        self.statements: list[list] = []

    def execute(self, sql: str, args=()) -> None:
        self.statements.append([sql, list(args)])

    def executemany(self, sql: str, rows) -> None:
        self.statements.append([sql, [list(r) for r in rows], "many"])


class Ledger:
    def __init__(self, store: Store,
                 observe: Callable[[str, int | None, dict], None] | None = None,
                 on_failure: Callable[[BaseException], None] | None = None):
        self.store = store
        self.db: sqlite3.Connection = store.writer()
        # Sees every event written (kind, run id, data; a submission's `submitted` events as
        # one, with `jobs`: how many): the broker's metrics count them.
        self._observe = observe or (lambda kind, run_id, data: None)
        self.on_failure = on_failure or (lambda exc: None)
        self.on_recovered: Callable[[], None] = lambda: None  # held writes were committed
        self._pending: list[_Write] = []  # not yet written (or held: see `fault`)
        self._writes: list[_Write] = []  # those of the open transaction
        self._error: BaseException | None = None  # a write of the open transaction failed
        self._seen: list[tuple[str, int | None, dict]] = []  # events to observe at commit
        self._depth = 0  # > 0 inside a scope (batch() nests the writes in its transaction)
        self._open = False  # the scope's transaction has begun
        self._flush_soon: asyncio.Handle | asyncio.TimerHandle | None = None
        self._soon_is_timer = False
        # Storage faults: why writes are held (None: they are written), and their retry.
        self.fault: str | None = None
        self._fault_since = self._reminded = 0.0
        self._retry: asyncio.TimerHandle | None = None
        self._retry_in = RETRY_FIRST
        self.held_most = 0  # the most writes held at once
        self.dropped_samples = 0  # GPU samples not kept while writes were held
        self._spilled = False  # the held writes were saved for the next broker: write no more
        # What writes need to know, kept as written (or held): never read back for a write.
        self._jobs: dict[int, list] = {}  # unfinished job -> [step, started_at, failures]
        self._apply_spill()
        self._next_run = (self.db.execute("SELECT max(id) FROM runs").fetchone()[0] or 0) + 1

    @property
    def held(self) -> int:
        """Writes held in memory while the store cannot take them."""
        return len(self._pending) if self.fault is not None else 0

    # ------------------------------------------------------------ transactions

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Every write made inside goes into one transaction (a decision's changes); none is
        begun if nothing is written."""
        with self._scope():
            yield

    @contextmanager
    def _scope(self) -> Iterator[None]:
        """The outermost scope commits (or holds, or rolls back) the transaction its writes
        began, and then tells the submitters in it and the observer."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        if self.fault is None and any(w.future for w in self._pending):
            # Submissions commit in a transaction of their own, before any change that could
            # concern their jobs: if the store refuses them, they are refused alone.
            self.flush()
        with self._outermost():
            yield

    @contextmanager
    def _outermost(self) -> Iterator[None]:
        """The outermost scope's body: its transaction aborted on an error, ended after."""
        self._depth = 1
        try:
            yield
        except BaseException as exc:
            self._abort(exc)
            raise
        finally:
            self._depth = 0
        self._end()

    def _write(self, write: _Write) -> None:
        """One change: in the open transaction, or in one of its own; held while the store
        cannot be written."""
        if self.fault is not None and not self._open:
            self._hold(write)
            return
        with self._scope():
            self._begin()
            self._run(write)

    def _hold(self, write: _Write) -> None:
        self._pending.append(write)
        if self.fault is not None:
            self.held_most = max(self.held_most, len(self._pending))

    def _begin(self) -> None:
        """Open the scope's transaction, if not yet: BEGIN, and what waits written first."""
        if self._open:
            return
        self._cancel_flush()
        pending, self._pending = self._pending, []
        self._open, self._error, self._writes = True, None, []
        try:
            if not self.db.in_transaction:  # (one left open on the connection is joined)
                self.db.execute("BEGIN")
        except (sqlite3.Error, OSError) as exc:
            if storage_fault(exc) is None:
                self._writes = pending  # the scope rolls back, and they fail with it
                raise
            self._error = exc
        for write in pending:
            self._run(write)

    def _run(self, write: _Write) -> None:
        """Write `write` in the open transaction; once one has failed, only keep it."""
        self._writes.append(write)
        if self._error is not None:
            return
        try:
            write.apply(self.db)
        except (sqlite3.Error, OSError) as exc:
            if storage_fault(exc) is None:
                raise
            self._error = exc

    def _end(self) -> None:
        """Commit the open transaction; if the store refuses it, hold its writes."""
        if not self._open:
            return
        if self._error is None:
            try:
                self.db.commit()
            except (sqlite3.Error, OSError) as exc:
                if storage_fault(exc) is None:
                    self._abort(exc)
                    raise
                self._error = exc
        writes, self._writes, self._open = self._writes, [], False
        if self._error is not None:
            exc, self._error = self._error, None
            self._refused(writes, exc)
            return
        if self.fault is not None:
            self._recovered(len(writes))
        seen, self._seen = self._seen, []
        for kind, run_id, data in seen:
            self._observe(kind, run_id, data)
        for write in writes:
            if write.future is not None and not write.future.done():
                write.future.set_result(None)

    def _abort(self, exc: BaseException) -> None:
        """A failure that is not the storage's: the transaction is rolled back and its writes
        are lost; the submitters in it hear `exc`, and the broker stops (its state holds
        jobs its store does not)."""
        writes, self._writes = self._writes, []
        self._open, self._error = False, None
        self._seen.clear()
        if self.db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self.db.rollback()
        waiting = [w.future for w in writes if w.future is not None and not w.future.done()]
        for future in waiting:
            future.set_exception(exc)
        if waiting:
            self.on_failure(exc)

    def flush(self) -> None:
        """Commit what waits now; while the store cannot be written, try the held writes."""
        if not self._pending or self._depth or self._spilled:
            return
        with self._outermost():
            self._begin()

    def _later(self, write: _Write, *, soon: bool) -> None:
        """Queue `write` for the next transaction: at the end of this round of the loop
        (`soon`) or within DEFER seconds; at once without a running loop."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or self._depth:
            self._write(write)
            return
        self._hold(write)
        if self.fault is not None:  # the retry writes it
            return
        if self._flush_soon is not None and (soon and self._soon_is_timer):
            self._cancel_flush()
        if self._flush_soon is None:
            self._soon_is_timer = not soon
            self._flush_soon = loop.call_soon(self._flush_now) if soon else \
                loop.call_later(DEFER, self._flush_now)

    def _flush_now(self) -> None:
        self._flush_soon = None
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 (no caller to raise to: the broker stops)
            self.on_failure(exc)

    def _cancel_flush(self) -> None:
        if self._flush_soon is not None:
            self._flush_soon.cancel()
            self._flush_soon = None

    # ------------------------------------------------------------ storage faults

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
            self._retry_in = RETRY_FIRST
            kept.insert(0, self._fault_event(exc))  # the journal will say when and why
        self._pending[:0] = kept
        self.held_most = max(self.held_most, len(self._pending))
        if first:
            log.error("the store cannot be written (%s): %s. Its writes are held in memory "
                      "(%d now) and tried again every %g-%g s; submissions get 503 until then; "
                      "running jobs go on", exc, self.fault, len(self._pending), RETRY_FIRST,
                      RETRY_MAX)
        elif now - self._reminded >= REMIND:
            self._reminded = now
            log.warning("the store still cannot be written after %.0f s (%s): %s; %d writes "
                        "held", now - self._fault_since, exc, self.fault, len(self._pending))
        else:
            log.debug("the store still refuses writes (%s); %d held", exc, len(self._pending))
        grouped: list[int] = []
        for write in refused:
            write.refused = StoreRefused(f"not accepted: {self.fault}", write.jobs)
            for job_id in write.jobs:
                self._jobs.pop(job_id, None)
            if write.future is not None:
                grouped += write.jobs
                if not write.future.done():
                    write.future.set_exception(write.refused)
                    write.future.exception()  # its submitter may be gone: no warning then
        if grouped:  # the broker's state holds them: it must forget them
            self.on_failure(StoreRefused(f"not accepted: {self.fault}", grouped))
        self._schedule_retry()

    def _fault_event(self, exc: BaseException) -> _Write:
        data = _json({"error": str(exc), "reason": self.fault})
        at = time.time()

        def apply(con: sqlite3.Connection) -> None:
            con.execute(INSERT_EVENT, (at, "store-unwritable", None, None, data))
            self._seen.append(("store-unwritable", None, {}))

        return _Write(apply)

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
        delay, self._retry_in = self._retry_in, min(self._retry_in * 2, RETRY_MAX)
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
        data = _json({"held": held, "after_s": round(after, 3)})
        at = time.time()
        self._later(_Write(lambda con: self._log_row(con, "store-writable", at, data)),
                    soon=False)
        self.on_recovered()

    def _log_row(self, con: sqlite3.Connection, kind: str, at: float, data: str) -> None:
        con.execute(INSERT_EVENT, (at, kind, None, None, data))
        self._seen.append((kind, None, {}))

    def _refuse_submissions(self, jobs: Iterable[int]) -> None:
        if self.fault is not None:
            raise StoreRefused(f"the broker cannot write its store now: {self.fault}; running "
                               "jobs go on: submit again once it is freed", jobs)

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

    # ------------------------------------------------------------ events

    def _log(self, con: sqlite3.Connection, kind: str, job_id: int | None,
             run_id: int | None, at: float, **data) -> None:
        con.execute(INSERT_EVENT, (at, kind, job_id, run_id, _json(data or None)))
        self._seen.append((kind, run_id, data))

    def event(self, kind: str, at: float, job_id: int | None = None, run_id: int | None = None,
              **data) -> None:
        self._write(_Write(lambda con: self._log(con, kind, job_id, run_id, at, **data)))

    def _job(self, job_id: int) -> list:
        """[step, started_at, failures] of an unfinished job, as written (or held)."""
        known = self._jobs.get(job_id)
        if known is None:  # not written by this ledger: what is committed is all there is
            row = self.db.execute("SELECT step, started_at, failures FROM jobs WHERE id = ?",
                                  (job_id,)).fetchone()
            known = self._jobs[job_id] = list(row)
        return known

    # ------------------------------------------------------------ jobs

    @staticmethod
    def _job_rows(admitted: list[Admitted], at: float) -> list[SimpleNamespace]:
        """The accepted jobs' rows, as the API shows them."""
        return [SimpleNamespace(
            id=a.job.id, name=a.spec.name, model=a.spec.model, steps=a.spec.steps,
            gpus_request=a.spec.gpus, demand=a.job.demand, nodes=a.spec.nodes,
            retries=a.spec.retries, failures=0, not_before=None, malleable=a.job.malleable,
            max_share=a.job.max_share, command=list(a.spec.command), emulate=a.spec.emulate,
            after=list(a.job.after), state=JobState.QUEUED.value, step=0, suspensions=0,
            submitted_at=at, started_at=None, finished_at=None, exit_code=None, reason=None,
            chdir=a.spec.chdir, per_gpu=a.spec.per_gpu, nodes_min=a.spec.nodes_min,
            environment=a.spec.environment,
        ) for a in admitted]

    def _insert_jobs(self, rows: list[SimpleNamespace],
                     also: Callable[[sqlite3.Connection], None] | None = None) -> _Write:
        encode = _json_once()
        jobs = [(
            r.id, r.name, r.model, r.steps, r.gpus_request, r.demand, r.nodes, r.retries,
            0, None, r.malleable, r.max_share, encode(("command", *r.command), r.command),
            r.emulate, encode(("after", *r.after), r.after),
            r.state, 0, 0, r.submitted_at, None, None, None, None, r.chdir, r.per_gpu,
            r.nodes_min, None if r.environment.is_default else r.environment.digest)
            for r in rows]
        # each environment once (the jobs of a request share theirs), before its jobs
        shared = {r.environment.digest: r.environment for r in rows
                  if not r.environment.is_default}
        environments = [(digest, e.whole, _json(e.as_dict())) for digest, e in shared.items()]
        events = [(r.submitted_at, "submitted", r.id, None,
                   encode(("event", r.demand, r.malleable),
                          {"demand": r.demand, "malleable": r.malleable})) for r in rows]

        def apply(con: sqlite3.Connection) -> None:
            if environments:
                con.executemany(INSERT_ENVIRONMENT, environments)
            con.executemany(INSERT_JOB, jobs)
            con.executemany(INSERT_EVENT, events)
            # the group's events seen as one (`jobs`: how many): a batch of 1,000 jobs
            # is one count for the metrics, not 1,000
            self._seen.append(("submitted", None, {"jobs": len(rows)}))
            if also is not None:
                also(con)

        for r in rows:
            self._jobs[r.id] = [0, None, 0]
        return _Write(apply, jobs=tuple(r.id for r in rows))

    def submitted(self, admitted: list[Admitted], at: float,
                  also: Callable[[sqlite3.Connection], None] | None = None
                  ) -> list[SimpleNamespace]:
        """Store the accepted jobs now (and what `also` writes, in their transaction: a row
        that belongs to the submission); their rows, as the API shows them. `StoreRefused`
        if the store cannot take them (they were not accepted)."""
        self._refuse_submissions(a.job.id for a in admitted)
        rows = self._job_rows(admitted, at)
        write = self._insert_jobs(rows, also)
        self._write(write)
        if write.refused is not None:
            raise write.refused
        return rows

    def submit_grouped(self, admitted: list[Admitted], at: float,
                       also: Callable[[sqlite3.Connection], None] | None = None
                       ) -> tuple[list[SimpleNamespace], asyncio.Future]:
        """Store the accepted jobs (and what `also` writes, as in `submitted`) with the other
        submissions of this round of the loop (one transaction); their rows, and a future
        done once that transaction has committed (its exception if it failed:
        `StoreRefused` if the store could not take it)."""
        self._refuse_submissions(a.job.id for a in admitted)
        rows = self._job_rows(admitted, at)
        write = self._insert_jobs(rows, also)
        write.future = asyncio.get_running_loop().create_future()
        self._later(write, soon=True)
        return rows, write.future

    def job_ended(self, job_id: int, state: JobState, reason: str, at: float) -> None:
        """A job that is not running ended (a cancel, a dependency that can never be met)."""
        self._jobs.pop(job_id, None)

        def apply(con: sqlite3.Connection) -> None:
            con.execute("UPDATE jobs SET state = ?, finished_at = ?, reason = ? WHERE id = ?",
                        (state.value, at, reason, job_id))
            self._log(con, state.value, job_id, None, at, reason=reason)

        self._write(_Write(apply))

    def suspend_requested(self, job_id: int, run_id: int, reason: str, at: float) -> None:
        """A broker that restarts now knows to expect the run's acknowledgement."""
        def apply(con: sqlite3.Connection) -> None:
            con.execute("UPDATE jobs SET state = ? WHERE id = ?",
                        (JobState.SUSPENDING.value, job_id))
            self._log(con, "suspend-requested", job_id, run_id, at, reason=reason)

        self._write(_Write(apply))

    def failures(self, job_id: int) -> int:
        return self._job(job_id)[2]

    # ------------------------------------------------------------ runs

    def run_started(self, action: Start, at: float) -> tuple[int, int]:
        """A run's row, the job running, and its `started`/`resumed` event; (run id, the step
        it starts from). The run's id is given here, not by the database."""
        parts = ((action.node, action.gpus), *action.others)
        node_col, gpus_col = placement_columns(parts)
        known = self._job(action.job)
        step, first_start = known[0], known[1]
        known[1] = first_start or at
        run_id, self._next_run = self._next_run, self._next_run + 1
        run = (run_id, action.job, node_col, gpus_col, sum(len(g) for _, g in parts),
               action.share, action.role.value, at, step)
        extra = {"others": action.others} if action.others else {}
        if action.share > 1:
            extra["share"] = action.share

        def apply(con: sqlite3.Connection) -> None:
            con.execute(INSERT_RUN, run)
            con.execute("UPDATE jobs SET state = ?, not_before = NULL, started_at = ? "
                        "WHERE id = ?", (JobState.RUNNING.value, first_start or at, action.job))
            self._log(con, "resumed" if first_start is not None else "started", action.job,
                      run_id, at, node=node_col, gpus=list(action.gpus), role=action.role.value,
                      step=step, **extra)

        self._write(_Write(apply))
        return run_id, step

    def run_process(self, run_id: int, pid: int | None, pid_start: int | None,
                    devices: tuple[str, ...] | None = None) -> None:
        """The process that carries a run (and the GPUs it got, when the broker chose them).
        Written with the next transaction (at most DEFER seconds later): until then a
        restarted broker finds the process by its environment, as it would if the broker
        had died before the launch returned."""
        if devices is None:
            args = ("UPDATE runs SET pid = ?, pid_start = ? WHERE id = ?",
                    (pid, pid_start, run_id))
        else:
            args = ("UPDATE runs SET pid = ?, pid_start = ?, devices = ? WHERE id = ?",
                    (pid, pid_start, ",".join(devices), run_id))
        self._later(_Write(lambda con: con.execute(*args)), soon=False)

    def run_placed(self, job_id: int, run_id: int, info: dict, at: float) -> None:
        """Where the batch system really put a run (which GPUs, which step; under Slurm the
        job too, which `marble report --slurm` joins with Slurm's accounting)."""
        def apply(con: sqlite3.Connection) -> None:
            con.execute("UPDATE runs SET devices = ? WHERE id = ?", (info.get("gpus"), run_id))
            self._log(con, "placed", job_id, run_id, at, node=info.get("node"),
                      devices=info.get("gpus"), step=info.get("step_id"), host=info.get("host"),
                      slurm_job=info.get("job_id"))

        self._write(_Write(apply))

    def run_ended(self, job_id: int, run_id: int, *, at: float, exit_code: int | None,
                  reason: str, detail: str, end_step: int | None = None,
                  start_step: int | None = None, outcome: JobState = JobState.SUSPENDED,
                  retry_at: float | None = None, **extra) -> None:
        """Close a run and record its job's outcome; `extra` goes into the event (stderr,
        start-up phases). A failed run with `retry_at` leaves its job waiting to retry."""
        run = {"ended_at": at, "exit_code": exit_code, "end_reason": reason,
               "end_step": end_step}
        if start_step is not None:
            run["start_step"] = start_step
        job: dict = {"state": outcome.value, "reason": detail}
        counters = []
        known = self._job(job_id)
        if end_step is not None:
            job["step"] = known[0] = end_step
        if outcome is JobState.FAILED:
            counters.append("failures = failures + 1")
            known[2] += 1
        if retry_at is not None:
            job.update(state=JobState.SUSPENDED.value, not_before=retry_at)
        if retry_at is not None or outcome is JobState.SUSPENDED:
            counters.append("suspensions = suspensions + 1")
        else:
            job.update(finished_at=at, exit_code=exit_code)
            self._jobs.pop(job_id, None)  # ended for good: never started again
        run_sql = f"UPDATE runs SET {', '.join(f'{k} = ?' for k in run)} WHERE id = ?"
        job_sql = f"UPDATE jobs SET {', '.join([f'{k} = ?' for k in job] + counters)} WHERE id = ?"

        def apply(con: sqlite3.Connection) -> None:
            con.execute(run_sql, (*run.values(), run_id))
            if start_step is not None:
                # Where this run resumed is where the run before it (stopped by force, so
                # its checkpoint's step was unknown) really ended.
                con.execute(FILL_END_STEP, (start_step, job_id, run_id))
            con.execute(job_sql, (*job.values(), job_id))
            self._log(con, reason, job_id, run_id, at, exit_code=exit_code, step=end_step,
                      detail=detail, **extra)

        self._write(_Write(apply))

    # ------------------------------------------------------------ GPUs

    def gpu_samples(self, at: float, node: str, samples: Iterable, holder: dict) -> None:
        """NVML readings; not kept while the store cannot be written (they only describe)."""
        rows = [(at, node, g.device, holder.get(g.device), g.util_gpu, g.util_mem, g.mem_used,
                 g.mem_total) for g in samples]
        if not rows:
            return
        if self.fault is not None:
            self.dropped_samples += len(rows)
            return
        self._write(_Write(lambda con: con.executemany(
            "INSERT INTO gpu_samples (at, node, device, job_id, util_gpu, util_mem, "
            "mem_used, mem_total) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)))

    def samples(self, model: str, job_id: int, run_id: int, samples: list[Sample],
                at: float) -> None:
        """What a run measured of its model."""
        rows = [(at, model, s.kind, s.gpus, s.share, s.value, job_id, run_id) for s in samples]
        self._write(_Write(lambda con: con.executemany(
            "INSERT INTO samples (at, model, kind, gpus, share, value, job_id, run_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)))
