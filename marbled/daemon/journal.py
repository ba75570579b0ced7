"""The machinery every write of the broker goes through: transactions.

A `Journal` (the base of `Ledger`, which makes the writes: `ledger.py`) writes
on the store's one writing connection. Every change is a `_Write`: a closure that
writes it on a connection, the same statements each time it is run. So a write
can wait, and be run again.

Writes are grouped, never reordered:

- **Submissions that arrive together share one transaction** (`submit_grouped`):
  the rows wait for the end of the loop's current round (or for the next write
  of any kind, which commits them first, in a transaction of their own), and each
  submitter hears that its jobs are durable only once that transaction has
  committed -- the API sends its 201 then.
- **Writes no one waits for** (`run_process`: a run's pid, which a restarted broker
  could also find by the process's environment) join the next transaction, or are
  committed on their own within `DEFER` seconds.
- **Changes made in one decision** (`batch()`) commit together, with the runs' ends
  that woke it (`Ledger.run_ended`, `Ledger.commit_ends`).

A transaction the store refuses for a reason of storage (a full disk, a
read-only file) has its writes held and retried: `storage_faults.py`
(`SurvivesFaults`, which a `Journal` is).

A commit that fails for another reason (a constraint, a bug) fails every
submission of its group (no 201 is sent) and calls `on_failure`: the broker
stops, since its state holds jobs its store does not; a new broker rebuilds from
what was committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from marbled.daemon.storage_faults import StoreRefused, SurvivesFaults, storage_fault
from marbled.store.db import Store

DEFER = 0.05  # seconds a write no one waits for may wait for company

INSERT_EVENT = "INSERT INTO events (at, kind, job_id, run_id, data) VALUES (?, ?, ?, ?, ?)"


def _json(value) -> str:
    """As the store's JSON columns hold values (SQLAlchemy's JSON type: None is 'null')."""
    return json.dumps(value)


@dataclass(eq=False)
class _Write:
    """One change: `apply` writes it on a connection, the same statements each time."""

    apply: Callable[[sqlite3.Connection], None]
    future: asyncio.Future | None = None  # a submitter that waits for its commit
    jobs: tuple[int, ...] = ()  # a submission's jobs: refused, not held, if it cannot commit
    refused: StoreRefused | None = None


class Journal(SurvivesFaults):
    """Writes on the store's writing connection, grouped into transactions, held while the
    store cannot take them (`retry`: the seconds before they are tried again, and the most
    those seconds double to)."""

    def __init__(self, store: Store,
                 observe: Callable[[str, int | None, dict], None] | None,
                 on_failure: Callable[[BaseException], None] | None,
                 retry: tuple[float, float]):
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
        super().__init__(retry)  # the state of storage faults; applies a stopped broker's

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

    def committed(self, apply: Callable[[sqlite3.Connection], None], jobs: tuple[int, ...],
                  refusal: str) -> None:
        """Write `apply` (about `jobs`) with what waits, committed on return: a request
        whose answer must outlive a crash. StoreRefused (`refusal`, after the store's fault),
        with nothing of it held, if the store cannot take it now."""
        if self.fault is not None:
            raise StoreRefused(f"{refusal}: {self.fault}", jobs)
        write = _Write(apply, jobs=jobs)
        self._write(write)
        if write.refused is not None:
            raise StoreRefused(f"{refusal}: {self.fault}", jobs)

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

    # ------------------------------------------------------------ its own events

    def _own_event(self, kind: str, data: dict) -> _Write:
        """An event of the journal's own (the store unwritable, writable again), at now."""
        text = _json(data)
        at = time.time()
        return _Write(lambda con: self._log_row(con, kind, at, text))

    def _log_row(self, con: sqlite3.Connection, kind: str, at: float, data: str) -> None:
        con.execute(INSERT_EVENT, (at, kind, None, None, data))
        self._seen.append((kind, None, {}))
