"""What the API shows: the broker, its jobs and their runs, from the store and the live state."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from marbled.core.errors import NotFound
from marbled.core.learning import LearnedBook
from marbled.core.model import JobState
from marbled.store.db import placement_parts

if TYPE_CHECKING:
    from marbled.daemon.broker import Broker


class Views:
    def __init__(self, broker: Broker):
        self.broker = broker

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

    def jobs(self, state: str | None = None) -> list[dict]:
        views = [self.job(r) for r in self.broker.store.jobs()]
        return [v for v in views if v["state"] == state] if state else views

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
        if live:
            progress = b.files.progress(row.id, live.run_id)
            if "step" in progress:
                view["step"] = progress["step"]
        return view

    def job_detail(self, job_id: int) -> dict:
        """One job with its runs, its events, and why it is where it is."""
        b = self.broker
        rows = b.store.jobs([job_id])
        if not rows:
            raise NotFound(f"no job {job_id}", "id")
        view = self.job(rows[0])
        job = b.state.jobs.get(job_id)
        view["why"] = b.policy.explain(job, b.state, b.clock.time()) if job else None
        view["runs"] = [run_view(r) for r in b.store.runs(job_id)]
        view["events"] = [{"at": e.at, "kind": e.kind, "run_id": e.run_id, "data": e.data}
                          for e in b.store.events(job_id)]
        return view

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
