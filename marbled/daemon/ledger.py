"""Every write the broker makes to its store, each change in one transaction with its event.

The `events` table is the journal; `jobs` and `runs` are derived from it and
written in the same transaction, so the two never disagree and a `kill -9`
between two changes loses neither. These are the broker's hot paths: plain SQL
on the store's one writing connection (`Store.writer`), each statement a
constant string that sqlite3 prepares once and caches, and `executemany` for
batches -- no SQLAlchemy statement building per write.

Writes are grouped, never reordered:

- **Submissions that arrive together share one transaction** (`submit_grouped`):
  the rows wait for the end of the loop's current round (or for the next write
  of any kind, which commits them first, in the same transaction), and each
  submitter hears that its jobs are durable only once that transaction has
  committed -- the API sends its 201 then.
- **Writes no one waits for** (`run_process`: a run's pid, which a restarted broker
  could also find by the process's environment) join the next transaction, or are
  committed on their own within `DEFER` seconds.
- **Changes made in one decision** (`batch()`) commit together.

A commit that fails fails every submission of its group (no 201 is sent) and
calls `on_failure`: the broker stops, since its state holds jobs its store does
not; a new broker rebuilds from what was committed.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace

from marbled.core.admission import Admitted
from marbled.core.measure import Sample
from marbled.core.model import JobState, Start
from marbled.store.db import Store, placement_columns

DEFER = 0.05  # seconds a write no one waits for may wait for company

JOB_COLUMNS = (
    "id", "name", "model", "steps", "gpus_request", "demand", "nodes", "retries", "failures",
    "not_before", "malleable", "max_share", "command", "emulate", "after", "state", "step",
    "suspensions", "submitted_at", "started_at", "finished_at", "exit_code", "reason", "chdir",
    "per_gpu", "nodes_min")
INSERT_JOB = (f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)}) "
              f"VALUES ({', '.join('?' * len(JOB_COLUMNS))})")
INSERT_EVENT = "INSERT INTO events (at, kind, job_id, run_id, data) VALUES (?, ?, ?, ?, ?)"
FILL_END_STEP = ("UPDATE runs SET end_step = ? WHERE end_step IS NULL AND id = "
                 "(SELECT max(id) FROM runs WHERE job_id = ? AND id < ?)")


def _json(value) -> str:
    """As the store's JSON columns hold values (SQLAlchemy's JSON type: None is 'null')."""
    return json.dumps(value)


class Ledger:
    def __init__(self, store: Store,
                 observe: Callable[[str, int | None, dict], None] | None = None,
                 on_failure: Callable[[BaseException], None] | None = None):
        self.store = store
        self.db: sqlite3.Connection = store.writer()
        # Sees every event written (kind, run id, data): the broker's metrics count them.
        self._observe = observe or (lambda kind, run_id, data: None)
        self.on_failure = on_failure or (lambda exc: None)
        self._pending: list[Callable[[sqlite3.Connection], None]] = []  # not yet written
        self._waiting: list[asyncio.Future] = []  # submitters of what is pending
        self._joined: list[asyncio.Future] = []  # ... of what joined the open transaction
        self._seen: list[tuple[str, int | None, dict]] = []  # events to observe at commit
        self._depth = 0  # > 0 inside a scope (batch() nests the writes in its transaction)
        self._open = False  # the scope's transaction has begun
        self._flush_soon: asyncio.Handle | asyncio.TimerHandle | None = None
        self._soon_is_timer = False

    # ------------------------------------------------------------ transactions

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction (or a part of the enclosing one), which first writes what waits."""
        with self._scope():
            self._begin()
            yield self.db

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Every write made inside goes into one transaction (a decision's changes); none is
        begun if nothing is written."""
        with self._scope():
            yield

    def _begin(self) -> None:
        """Open the scope's transaction, if not yet: BEGIN, and what waits written first."""
        if self._open:
            return
        pending, self._pending = self._pending, []
        self._joined += self._waiting
        self._waiting = []
        self._cancel_flush()
        self.db.execute("BEGIN")
        self._open = True
        for write in pending:
            write(self.db)

    @contextmanager
    def _scope(self) -> Iterator[None]:
        """The outermost scope commits (or rolls back) the transaction its writes began, and
        then tells the submitters in it and the observer."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._depth = 1
        try:
            yield
            if self._open:
                self.db.commit()
        except BaseException as exc:
            waiting, self._joined = self._joined, []
            self._seen.clear()
            if self.db.in_transaction:
                self.db.rollback()
            for future in waiting:
                if not future.done():
                    future.set_exception(exc)
            if waiting:  # submissions the state holds are lost: the broker must stop
                self.on_failure(exc)
            raise
        finally:
            self._depth = 0
            self._open = False
        waiting, self._joined = self._joined, []
        seen, self._seen = self._seen, []
        for kind, run_id, data in seen:
            self._observe(kind, run_id, data)
        for future in waiting:
            if not future.done():
                future.set_result(None)

    def flush(self) -> None:
        """Commit what waits now."""
        if self._pending and not self._depth:
            with self._tx():
                pass

    def _later(self, write: Callable[[sqlite3.Connection], None], *, soon: bool,
               future: asyncio.Future | None = None) -> None:
        """Queue `write` for the next transaction: at the end of this round of the loop
        (`soon`) or within DEFER seconds; at once without a running loop."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or self._depth:
            with self._tx() as con:
                write(con)
                if future is not None:  # done when the transaction commits
                    self._joined.append(future)
            return
        self._pending.append(write)
        if future is not None:
            self._waiting.append(future)
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

    def _log(self, con: sqlite3.Connection, kind: str, job_id: int | None,
             run_id: int | None, at: float, **data) -> None:
        con.execute(INSERT_EVENT, (at, kind, job_id, run_id, _json(data or None)))
        self._seen.append((kind, run_id, data))

    def event(self, kind: str, at: float, job_id: int | None = None, run_id: int | None = None,
              **data) -> None:
        with self._tx() as con:
            self._log(con, kind, job_id, run_id, at, **data)

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
        ) for a in admitted]

    def _insert_jobs(self, rows: list[SimpleNamespace]) -> Callable[[sqlite3.Connection], None]:
        def write(con: sqlite3.Connection) -> None:
            con.executemany(INSERT_JOB, [(
                r.id, r.name, r.model, r.steps, r.gpus_request, r.demand, r.nodes, r.retries,
                0, None, r.malleable, r.max_share, _json(r.command), r.emulate, _json(r.after),
                r.state, 0, 0, r.submitted_at, None, None, None, None, r.chdir, r.per_gpu,
                r.nodes_min)
                for r in rows])
            con.executemany(INSERT_EVENT, [(
                r.submitted_at, "submitted", r.id, None,
                _json({"demand": r.demand, "malleable": r.malleable})) for r in rows])
            self._seen.extend(("submitted", None, {}) for _ in rows)

        return write

    def submitted(self, admitted: list[Admitted], at: float) -> list[SimpleNamespace]:
        """Store the accepted jobs now; their rows, as the API shows them."""
        rows = self._job_rows(admitted, at)
        with self._tx() as con:
            self._insert_jobs(rows)(con)
        return rows

    def submit_grouped(self, admitted: list[Admitted],
                       at: float) -> tuple[list[SimpleNamespace], asyncio.Future]:
        """Store the accepted jobs with the other submissions of this round of the loop (one
        transaction); their rows, and a future done once that transaction has committed
        (its exception if it failed)."""
        rows = self._job_rows(admitted, at)
        future = asyncio.get_running_loop().create_future()
        self._later(self._insert_jobs(rows), soon=True, future=future)
        return rows, future

    def job_ended(self, job_id: int, state: JobState, reason: str, at: float) -> None:
        """A job that is not running ended (a cancel, a dependency that can never be met)."""
        with self._tx() as con:
            con.execute("UPDATE jobs SET state = ?, finished_at = ?, reason = ? WHERE id = ?",
                        (state.value, at, reason, job_id))
            self._log(con, state.value, job_id, None, at, reason=reason)

    def suspend_requested(self, job_id: int, run_id: int, reason: str, at: float) -> None:
        """A broker that restarts now knows to expect the run's acknowledgement."""
        with self._tx() as con:
            con.execute("UPDATE jobs SET state = ? WHERE id = ?",
                        (JobState.SUSPENDING.value, job_id))
            self._log(con, "suspend-requested", job_id, run_id, at, reason=reason)

    def failures(self, job_id: int) -> int:
        self.flush()
        return self.db.execute("SELECT failures FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]

    # ------------------------------------------------------------ runs

    def run_started(self, action: Start, at: float) -> tuple[int, int]:
        """A run's row, the job running, and its `started`/`resumed` event; (run id, the step
        it starts from)."""
        parts = ((action.node, action.gpus), *action.others)
        node_col, gpus_col = placement_columns(parts)
        with self._tx() as con:
            step, first_start = con.execute("SELECT step, started_at FROM jobs WHERE id = ?",
                                            (action.job,)).fetchone()
            run_id = con.execute(
                "INSERT INTO runs (job_id, node, gpu_ids, gpu_count, share, role, started_at,"
                " start_step) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (action.job, node_col, gpus_col, sum(len(g) for _, g in parts), action.share,
                 action.role.value, at, step)).lastrowid
            con.execute("UPDATE jobs SET state = ?, not_before = NULL, started_at = ? "
                        "WHERE id = ?",
                        (JobState.RUNNING.value, first_start or at, action.job))
            extra = {"others": action.others} if action.others else {}
            if action.share > 1:
                extra["share"] = action.share
            self._log(con, "resumed" if first_start is not None else "started", action.job,
                      run_id, at, node=node_col, gpus=list(action.gpus), role=action.role.value,
                      step=step, **extra)
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
        self._later(lambda con: con.execute(*args), soon=False)

    def run_placed(self, job_id: int, run_id: int, info: dict, at: float) -> None:
        """Where the batch system really put a run (which GPUs, which step; under Slurm the
        job too, which `marble report --slurm` joins with Slurm's accounting)."""
        with self._tx() as con:
            con.execute("UPDATE runs SET devices = ? WHERE id = ?", (info.get("gpus"), run_id))
            self._log(con, "placed", job_id, run_id, at, node=info.get("node"),
                      devices=info.get("gpus"), step=info.get("step_id"), host=info.get("host"),
                      slurm_job=info.get("job_id"))

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
        if end_step is not None:
            job["step"] = end_step
        if outcome is JobState.FAILED:
            counters.append("failures = failures + 1")
        if retry_at is not None:
            job.update(state=JobState.SUSPENDED.value, not_before=retry_at)
        if retry_at is not None or outcome is JobState.SUSPENDED:
            counters.append("suspensions = suspensions + 1")
        else:
            job.update(finished_at=at, exit_code=exit_code)
        with self._tx() as con:
            con.execute(f"UPDATE runs SET {', '.join(f'{k} = ?' for k in run)} WHERE id = ?",
                        (*run.values(), run_id))
            if start_step is not None:
                # Where this run resumed is where the run before it (stopped by force, so
                # its checkpoint's step was unknown) really ended.
                con.execute(FILL_END_STEP, (start_step, job_id, run_id))
            sets = [f"{k} = ?" for k in job] + counters
            con.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE id = ?",
                        (*job.values(), job_id))
            self._log(con, reason, job_id, run_id, at, exit_code=exit_code, step=end_step,
                      detail=detail, **extra)

    # ------------------------------------------------------------ GPUs

    def gpu_samples(self, at: float, node: str, samples: Iterable, holder: dict) -> None:
        rows = [(at, node, g.device, holder.get(g.device), g.util_gpu, g.util_mem, g.mem_used,
                 g.mem_total) for g in samples]
        if rows:
            with self._tx() as con:
                con.executemany(
                    "INSERT INTO gpu_samples (at, node, device, job_id, util_gpu, util_mem, "
                    "mem_used, mem_total) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)

    def samples(self, model: str, job_id: int, run_id: int, samples: list[Sample],
                at: float) -> None:
        """What a run measured of its model."""
        with self._tx() as con:
            con.executemany(
                "INSERT INTO samples (at, model, kind, gpus, share, value, job_id, run_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(at, model, s.kind, s.gpus, s.share, s.value, job_id, run_id)
                 for s in samples])
