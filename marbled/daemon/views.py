"""What the API shows: the broker, its jobs and their runs, from the store and the live state."""

from __future__ import annotations

import asyncio
import functools
import os
import time
from typing import TYPE_CHECKING

from marbled.core.errors import NotFound
from marbled.core.explain import reasons
from marbled.core.learning import LearnedBook
from marbled.core.model import JobState
from marbled.core.profiles import ProfileBook, model_key
from marbled.core.progress import UNKNOWN, run_progress
from marbled.store.db import placement_parts

if TYPE_CHECKING:
    from marbled.daemon.broker import Broker


HOLDING = {s.value for s in JobState if s.holds_gpus}  # states whose row may lag the live one
FORECAST_REUSE = 10  # a forecast is reused for this many times what it took (1 s at least)


class Views:
    def __init__(self, broker: Broker):
        self.broker = broker
        self._forecast: dict | None = None
        self._forecast_until = 0.0
        self._forecasting = asyncio.Lock()

    def status(self) -> dict:
        b = self.broker
        counts: dict[str, int] = {}
        for job in b.state.jobs.values():
            counts[job.state.value] = counts.get(job.state.value, 0) + 1
        return {
            "pid": os.getpid(),
            "policy": b.policy.name,
            "profile": b.config.book.system,
            "nodes": {n: {"gpus": list(d), "free": b.state.free(n)}
                      for n, d in b.config.nodes.items()},
            "jobs": counts,
            "draining": b.draining,
            "started_at": b.started_at,
            "time_scale": b.config.time_scale,
        }

    def jobs(self, states: tuple[str, ...] = (), after: int = 0,
             limit: int | None = None) -> tuple[list[dict], int | None]:
        """Jobs in FIFO (id) order with an id above `after`, in one of `states` (all if
        none), at most `limit`; and the cursor of the next page (the `after` that continues
        it), None when there is none.

        The state shown is the live one, which differs from the row's only while a run holds
        GPUs (a suspension under way, a stop): the rows are filtered in SQL by state, with
        the few jobs that hold GPUs added, and then by the state shown."""
        b, wanted = self.broker, set(states)
        also = [j.id for j in b.state.jobs.values() if j.state.holds_gpus] if wanted else ()
        views: list[dict] = []
        while limit is None or len(views) <= limit:
            want = None if limit is None else limit + 1 - len(views)
            rows = b.store.job_page(states=sorted(wanted | HOLDING) if wanted else (),
                                    also=also, after=after, limit=want)
            views += [v for v in map(self.job, rows) if not wanted or v["state"] in wanted]
            if not rows or want is None or len(rows) < want:
                break
            after = rows[-1].id
        if limit is not None and len(views) > limit:
            return views[:limit], views[limit - 1]["id"]
        return views, None

    def job(self, row) -> dict:
        """One `jobs` row as the API shows it, with what the live state knows better."""
        b = self.broker
        job = b.state.jobs.get(row.id)
        parts = job.placement.parts() if job and job.placement else ()
        view = {
            "id": row.id, "name": row.name, "model": row.model, "steps": row.steps,
            "state": (job.state if job else JobState(row.state)).value,
            "role": job.role.value if job and job.role else None,
            "node": ",".join(n for n, _ in parts) or None,
            "gpus": [g for _, gs in parts for g in gs],
            "demand": row.demand, "nodes": row.nodes, "retries": row.retries,
            "failures": row.failures, "not_before": row.not_before, "malleable": row.malleable,
            "gpus_request": "auto" if row.gpus_request is None else row.gpus_request,
            "step": row.step, "suspensions": row.suspensions, "after": row.after,
            "command": row.command, "emulate": row.emulate,
            "submitted_at": row.submitted_at, "started_at": row.started_at,
            "finished_at": row.finished_at, "exit_code": row.exit_code, "reason": row.reason,
        }
        live = b.runs.live.get(row.id)
        speed = UNKNOWN
        if live:
            progress = b.files.progress(row.id, live.run_id)
            if "step" in progress:
                view["step"] = progress["step"]
            if job.placement is not None and job.state is JobState.RUNNING:
                speed = run_progress(progress, row.steps, len(job.gpus), job.placement.share,
                                     job.curve, b.clock.time())
        view.update(rate=speed.rate, rate_source=speed.source, finish_at=speed.finish_at,
                    eta_s=speed.eta(b.clock.time()))
        return view

    async def job_detail(self, job_id: int) -> dict:
        """One job with its runs, its events, and why it is where it is."""
        b = self.broker
        rows = b.store.jobs([job_id])
        if not rows:
            raise NotFound(f"no job {job_id}", "id")
        view = self.job(rows[0])
        job = b.state.jobs.get(job_id)
        now = b.clock.time()
        view["why"] = b.policy.explain(job, b.state, now) if job else None
        view["runs"] = [run_view(r) for r in b.store.runs(job_id)]
        view["events"] = [{"at": e.at, "kind": e.kind, "run_id": e.run_id, "data": e.data}
                          for e in b.store.events(job_id)]
        waiting = job is not None and job.state in (JobState.QUEUED, JobState.SUSPENDED)
        start = next((f["start_at"] for f in (await self.forecast())["jobs"]
                      if f["id"] == job_id), None) if waiting else None
        view["reasons"] = reasons(job, b.state, b.policy, now,
                                  [(e["kind"], e["data"] or {}) for e in view["events"]],
                                  start) if job else [f"it has ended ({view['state']})"]
        return view

    async def forecast(self) -> dict:
        """When each unfinished job should start and end, and the queue with it
        (`marbled.sim.forecast`: the simulator, from now, on what is left). The simulation
        runs in a thread on a snapshot, so the broker's loop goes on meanwhile; its result
        is reused for FORECAST_REUSE times what it took, so polling clients (the dashboard,
        `marble watch`) cost the broker a bounded share of a core."""
        async with self._forecasting:
            if self._forecast is None or time.monotonic() >= self._forecast_until:
                began = time.monotonic()
                snapshot = self._forecast_snapshot()
                self._forecast = snapshot if isinstance(snapshot, dict) else \
                    await asyncio.to_thread(snapshot)
                took = time.monotonic() - began
                self._forecast_until = time.monotonic() + max(1.0, FORECAST_REUSE * took)
            return self._forecast

    def _forecast_snapshot(self):
        """What a forecast needs, copied from the live state: a function to run elsewhere,
        or the answer when there is nothing to simulate."""
        from marbled.sim.forecast import Left, forecast

        b, now = self.broker, self.broker.clock.time()
        left = [Left(job.id, b.specs[job.id], self._steps_left(job), job.placement is not None,
                     job.after)
                for job in b.state.jobs.values() if not job.state.finished]
        emulated = {b.specs[j.id].emulate for j in left}
        if len(emulated) > 1:
            return {"at": now, "finish_at": None, "jobs": [],
                    "reason": "emulated and real jobs run on different clocks"}
        curves = {model_key(j.spec.model): b.book.lookup(j.spec.model)
                  for j in left if j.spec.model}
        book = ProfileBook(b.book.system, b.config.book.gpus_per_node,
                           {k: c for k, c in curves.items() if c is not None})
        run = functools.partial(
            forecast, left, book, b.policy, [len(g) for g in b.config.nodes.values()], now,
            b.config.time_scale if emulated == {True} else 1.0)

        def answer() -> dict:
            result = run()
            return {"at": now, "finish_at": result.finish_at, "reason": result.reason,
                    "jobs": [{"id": i, "start_at": s, "end_at": e}
                             for i, (s, e) in sorted(result.ends.items())]}

        return answer

    def _steps_left(self, job) -> int:
        """What a job has left to train: by its running run's last report, else by its
        checkpoint."""
        total = self.broker.specs[job.id].steps or 0
        live = self.broker.runs.live.get(job.id)
        if live:
            report = self.broker.files.progress(job.id, live.run_id)
            return max(total - int(report.get("step") or live.start_step or 0), 0)
        return int(job.steps_left if job.steps_left is not None else total)

    def curves(self, model: str | None = None) -> dict:
        """Each model's curve: the profile's, what runs measured, what the broker believes."""
        b = self.broker
        book = b.book if isinstance(b.book, LearnedBook) else LearnedBook(b.book)
        return {"profile": book.system, "learning": b.learner is not None,
                "models": book.report(model)}

    def runs(self) -> dict:
        return {"runs": [run_view(r) for r in self.broker.store.runs()],
                "started_at": self.broker.started_at}


def run_view(r) -> dict:
    parts = placement_parts(r.node, r.gpu_ids)
    return {
        "id": r.id, "job_id": r.job_id, "node": r.node,
        "gpus": [g for _, gpus in parts for g in gpus],
        "parts": [[node, list(gpus)] for node, gpus in parts],
        "devices": r.devices.split(",") if r.devices else None, "share": r.share,
        "role": r.role, "started_at": r.started_at, "ended_at": r.ended_at,
        "start_step": r.start_step, "end_step": r.end_step, "exit_code": r.exit_code,
        "end_reason": r.end_reason, "pid": r.pid,
    }
