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

How the writes are grouped into transactions is the `Journal`'s (`journal.py`),
which a `Ledger` is; how they survive faults of storage (held, retried, saved for
the next broker) is `SurvivesFaults`'s (`storage_faults.py`).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Hashable, Iterable
from types import SimpleNamespace

from marbled.core.admission import Admitted
from marbled.core.measure import Sample
from marbled.core.model import JobState, Start
from marbled.daemon.journal import DEFER, INSERT_EVENT, Journal, _json, _Write
from marbled.daemon.storage_faults import SPILL_SUFFIX, StorageLost, StoreRefused, storage_fault
from marbled.store.db import Store, placement_columns

# imported from here by the broker, its command and its tests
__all__ = ["DEFER", "SPILL_SUFFIX", "Ledger", "StorageLost", "StoreRefused", "storage_fault"]

RETRY_FIRST = 1.0  # seconds before held writes are tried again ...
RETRY_MAX = 10.0  # ... doubling up to this

JOB_COLUMNS = (
    "id", "name", "model", "steps", "gpus_request", "demand", "nodes", "retries", "failures",
    "not_before", "malleable", "max_share", "command", "emulate", "after", "state", "step",
    "suspensions", "submitted_at", "started_at", "finished_at", "exit_code", "reason", "chdir",
    "per_gpu", "nodes_min", "env")
INSERT_ENVIRONMENT = "INSERT OR IGNORE INTO environments (digest, whole, vars) VALUES (?, ?, ?)"
INSERT_JOB = (f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)}) "
              f"VALUES ({', '.join('?' * len(JOB_COLUMNS))})")
INSERT_RUN = ("INSERT INTO runs (id, job_id, node, gpu_ids, gpu_count, share, role, started_at,"
              " start_step) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
FILL_END_STEP = ("UPDATE runs SET end_step = ? WHERE end_step IS NULL AND id = "
                 "(SELECT max(id) FROM runs WHERE job_id = ? AND id < ?)")


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


class Ledger(Journal):
    def __init__(self, store: Store,
                 observe: Callable[[str, int | None, dict], None] | None = None,
                 on_failure: Callable[[BaseException], None] | None = None):
        super().__init__(store, observe, on_failure, retry=(RETRY_FIRST, RETRY_MAX))
        # What writes need to know, kept as written (or held): never read back for a write.
        self._jobs: dict[int, list] = {}  # unfinished job -> [step, started_at, failures]
        self.ends_held = False  # a run's end waits to be committed with the next decision
        self._next_run = (self.db.execute("SELECT max(id) FROM runs").fetchone()[0] or 0) + 1

    def _forget(self, jobs: tuple[int, ...]) -> None:
        for job_id in jobs:
            self._jobs.pop(job_id, None)

    def _refuse_submissions(self, jobs: Iterable[int]) -> None:
        if self.fault is not None:
            raise StoreRefused(f"the broker cannot write its store now: {self.fault}; running "
                               "jobs go on: submit again once it is freed", jobs)

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

    def cancel_requested(self, job_id: int, at: float) -> None:
        """The user's cancel, committed before the broker acts on it: a broker that dies before
        the job has stopped leaves it to the next (`Store.cancels_requested`). StoreRefused,
        and no cancel, while the store cannot be written."""
        self.committed(lambda con: self._log(con, "cancel-requested", job_id, None, at),
                       (job_id,), f"job {job_id} was not cancelled: the broker cannot record "
                       "the cancel now (cancel again once the store can be written)")

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

        # Committed with the decision that the end wakes (`commit_ends`): one transaction,
        # not two, for a run that ends and the run that takes its GPUs. A broker that dies
        # before then leaves the run open, and the next one reads its end from the run's
        # exit file, as it does for a run that ended while no broker watched (lifecycle I2).
        self.ends_held = True
        self._later(_Write(apply), soon=False)

    def commit_ends(self) -> None:
        """Commit the runs' ends not yet committed (a decision that wrote nothing left them
        waiting), unless the store is refusing writes (its retry writes them then)."""
        if self.ends_held and self.fault is None:
            self.flush()
            self.ends_held = bool(self._pending)  # (none left once committed)

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
