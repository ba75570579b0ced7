"""Every write the broker makes to its store, each change in one transaction with its event.

The `events` table is the journal; `jobs` and `runs` are derived from it and
written in the same transaction, so the two never disagree and a `kill -9`
between two changes loses neither. Plain SQL statements (SQLAlchemy Core), not
ORM objects: these are the broker's hot paths.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import SimpleNamespace

from sqlalchemy import Connection, insert, select, update

from marbled.core.admission import Admitted
from marbled.core.measure import Sample
from marbled.core.model import JobState, Start
from marbled.store.db import (
    EventRow,
    GpuSampleRow,
    JobRow,
    RunRow,
    SampleRow,
    Store,
    placement_columns,
)

JOBS, RUNS, EVENTS, GPU_SAMPLES, SAMPLES = (
    JobRow.__table__, RunRow.__table__, EventRow.__table__, GpuSampleRow.__table__,
    SampleRow.__table__)


class Ledger:
    def __init__(self, store: Store,
                 observe: Callable[[str, int | None, dict], None] | None = None):
        self.store = store
        # Sees every event written (kind, run id, data): the broker's metrics count them.
        self._observe = observe or (lambda kind, run_id, data: None)

    def _tx(self):
        return self.store.engine.begin()

    def _log(self, conn: Connection, kind: str, job_id: int | None, run_id: int | None,
             at: float, **data) -> None:
        conn.execute(insert(EVENTS).values(at=at, kind=kind, job_id=job_id, run_id=run_id,
                                           data=data or None))
        self._observe(kind, run_id, data)

    def event(self, kind: str, at: float, job_id: int | None = None, run_id: int | None = None,
              **data) -> None:
        with self._tx() as conn:
            self._log(conn, kind, job_id, run_id, at, **data)

    # -- jobs

    def submitted(self, admitted: list[Admitted], at: float) -> list[SimpleNamespace]:
        """Store the accepted jobs; their rows, as the API shows them."""
        rows = [dict(
            id=a.job.id, name=a.spec.name, model=a.spec.model, steps=a.spec.steps,
            gpus_request=a.spec.gpus, demand=a.job.demand, malleable=a.job.malleable,
            max_share=a.job.max_share, nodes=a.spec.nodes, retries=a.spec.retries,
            command=list(a.spec.command), emulate=a.spec.emulate, after=list(a.job.after),
            state=JobState.QUEUED.value, step=0, suspensions=0, submitted_at=at, failures=0,
            not_before=None, started_at=None, finished_at=None, exit_code=None, reason=None,
        ) for a in admitted]
        with self._tx() as conn:
            conn.execute(insert(JOBS), rows)
            conn.execute(insert(EVENTS), [dict(
                at=at, kind="submitted", job_id=a.job.id, run_id=None,
                data={"demand": a.job.demand, "malleable": a.job.malleable}) for a in admitted])
        for _ in admitted:
            self._observe("submitted", None, {})
        return [SimpleNamespace(**r) for r in rows]

    def job_ended(self, job_id: int, state: JobState, reason: str, at: float) -> None:
        """A job that is not running ended (a cancel, a dependency that can never be met)."""
        with self._tx() as conn:
            conn.execute(update(JOBS).where(JOBS.c.id == job_id).values(
                state=state.value, finished_at=at, reason=reason))
            self._log(conn, state.value, job_id, None, at, reason=reason)

    def suspend_requested(self, job_id: int, run_id: int, reason: str, at: float) -> None:
        """A broker that restarts now knows to expect the run's acknowledgement."""
        with self._tx() as conn:
            conn.execute(update(JOBS).where(JOBS.c.id == job_id).values(
                state=JobState.SUSPENDING.value))
            self._log(conn, "suspend-requested", job_id, run_id, at, reason=reason)

    def failures(self, job_id: int) -> int:
        with self._tx() as conn:
            return conn.scalar(select(JOBS.c.failures).where(JOBS.c.id == job_id))

    # -- runs

    def run_started(self, action: Start, at: float) -> tuple[int, int]:
        """A run's row, the job running, and its `started`/`resumed` event; (run id, the step
        it starts from)."""
        parts = ((action.node, action.gpus), *action.others)
        node_col, gpus_col = placement_columns(parts)
        with self._tx() as conn:
            step, first_start = conn.execute(select(JOBS.c.step, JOBS.c.started_at).where(
                JOBS.c.id == action.job)).one()
            run_id = conn.execute(insert(RUNS).values(
                job_id=action.job, node=node_col, gpu_ids=gpus_col,
                gpu_count=sum(len(g) for _, g in parts), share=action.share,
                role=action.role.value, started_at=at, start_step=step)).inserted_primary_key[0]
            conn.execute(update(JOBS).where(JOBS.c.id == action.job).values(
                state=JobState.RUNNING.value, not_before=None, started_at=first_start or at))
            extra = {"others": action.others} if action.others else {}
            if action.share > 1:
                extra["share"] = action.share
            self._log(conn, "resumed" if first_start is not None else "started", action.job,
                      run_id, at, node=node_col, gpus=list(action.gpus), role=action.role.value,
                      step=step, **extra)
        return run_id, step

    def run_process(self, run_id: int, pid: int | None, pid_start: int | None,
                    devices: tuple[str, ...] | None = None) -> None:
        """The process that carries a run (and the GPUs it got, when the broker chose them)."""
        values = {"pid": pid, "pid_start": pid_start}
        if devices is not None:
            values["devices"] = ",".join(devices)
        with self._tx() as conn:
            conn.execute(update(RUNS).where(RUNS.c.id == run_id).values(**values))

    def run_placed(self, job_id: int, run_id: int, info: dict, at: float) -> None:
        """Where the batch system really put a run (which GPUs, which step)."""
        with self._tx() as conn:
            conn.execute(update(RUNS).where(RUNS.c.id == run_id).values(devices=info.get("gpus")))
            self._log(conn, "placed", job_id, run_id, at, node=info.get("node"),
                      devices=info.get("gpus"), step=info.get("step_id"), host=info.get("host"))

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
        job = {"state": outcome.value, "reason": detail}
        if end_step is not None:
            job["step"] = end_step
        if outcome is JobState.FAILED:
            job["failures"] = JOBS.c.failures + 1
        if retry_at is not None:
            job.update(state=JobState.SUSPENDED.value, not_before=retry_at)
        if retry_at is not None or outcome is JobState.SUSPENDED:
            job["suspensions"] = JOBS.c.suspensions + 1
        else:
            job.update(finished_at=at, exit_code=exit_code)
        with self._tx() as conn:
            conn.execute(update(RUNS).where(RUNS.c.id == run_id).values(**run))
            conn.execute(update(JOBS).where(JOBS.c.id == job_id).values(**job))
            self._log(conn, reason, job_id, run_id, at, exit_code=exit_code, step=end_step,
                      detail=detail, **extra)

    # -- GPUs

    def gpu_samples(self, at: float, node: str, samples: Iterable, holder: dict) -> None:
        rows = [dict(at=at, node=node, device=g.device, job_id=holder.get(g.device),
                     util_gpu=g.util_gpu, util_mem=g.util_mem, mem_used=g.mem_used,
                     mem_total=g.mem_total) for g in samples]
        if rows:
            with self._tx() as conn:
                conn.execute(insert(GPU_SAMPLES), rows)

    def samples(self, model: str, job_id: int, run_id: int, samples: list[Sample],
                at: float) -> None:
        """What a run measured of its model."""
        with self._tx() as conn:
            conn.execute(insert(SAMPLES), [dict(
                at=at, model=model, kind=s.kind, gpus=s.gpus, share=s.share, value=s.value,
                job_id=job_id, run_id=run_id) for s in samples])
