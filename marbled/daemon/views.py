"""What the API shows: the broker, its jobs and their runs, from the store and the live state."""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from marbled.core.errors import Never, NotFound
from marbled.core.explain import RUN_STARTS, reasons
from marbled.core.learning import LearnedBook
from marbled.core.model import Job, JobState, Role
from marbled.core.policy.base import role_now
from marbled.core.profiles import ProfileBook, model_key
from marbled.core.progress import UNKNOWN, Progress, run_progress
from marbled.core.target import Target, explicit, of_job
from marbled.daemon.workfiles import NO_OUTPUT
from marbled.store.db import job_spec, recorded_job
from marbled.store.schema import placement_parts

if TYPE_CHECKING:
    from marbled.daemon.broker import Broker


def run_speed(b: Broker, job_id: int, steps: int | None, progress: dict | None = None
              ) -> Progress:
    """A running job's speed and end, from its run's last progress report (`progress`, when
    the caller has read it): the ETA `status` shows, and the expected end policies read
    (`Broker._measured_ends`)."""
    live, job = b.runs.live.get(job_id), b.state.jobs.get(job_id)
    if not live or job is None or job.placement is None or job.state is not JobState.RUNNING:
        return UNKNOWN
    if progress is None:
        progress = b.files.progress(job_id, live.run_id)
    return run_progress(progress, steps, len(job.gpus), job.placement.share, job.curve,
                        b.clock.time())


HOLDING = {s.value for s in JobState if s.holds_gpus}  # states whose row may lag the live one
FORECAST_REUSE = 10  # a forecast is reused for this many times what it took (1 s at least)
LEFT_OUT_LISTED = 50  # jobs a forecast names as left out (with a count of all): each status
# poll of a queue of 20,000 command jobs carried 1 MB of them


class Views:
    def __init__(self, broker: Broker):
        self.broker = broker
        self._forecast: dict | None = None
        self._forecast_until = 0.0
        self._forecasting = asyncio.Lock()
        self._targets: dict[str, Target] = {}  # model key -> its target
        self._targets_version = 0  # of the learned book they were read from

    def status(self) -> dict:
        b = self.broker
        # the live state's tallies: what the live jobs cost, not every job ever
        counts = {s.value: n for s, n in b.state.counts().items() if n}
        return {
            "pid": os.getpid(),
            "policy": b.policy.name,
            "profile": b.config.book.system,
            "nodes": {n: {"gpus": list(d), "free": b.state.free(n)}
                      for n, d in b.config.nodes.items()},
            "jobs": counts,
            "draining": b.draining,
            # ok: the store takes writes; else why not, what to free, and the writes held
            "storage": {"ok": b.ledger.fault is None, "reason": b.ledger.fault,
                        "held": b.ledger.held},
            "started_at": b.started_at,
            "time_scale": b.config.time_scale,
            "cannot_run": self.cannot_run(),
        }

    def cannot_run(self, ids: Iterable[int] = ()) -> dict[str, str]:
        """The queued jobs (all, or of `ids`) that this allocation can never hold, and why
        (`State.unfit`): a larger allocation queued them."""
        unfit = self.broker.state.unfit()
        wanted = set(ids)
        return {str(i): why for i, why in unfit.items() if not wanted or i in wanted}

    def counts_of(self, ids: Iterable[int]) -> dict[str, int]:
        """The jobs `ids` by state; NotFound for one that does not exist."""
        counts: dict[str, int] = {}
        for job_id in ids:
            state = self.broker.intake.state_of(job_id).value
            counts[state] = counts.get(state, 0) + 1
        return counts

    def jobs(self, states: tuple[str, ...] = (), after: int = 0, limit: int | None = None,
             name: str | None = None,
             since: float | None = None) -> tuple[list[dict], int | None]:
        """Jobs in FIFO (id) order with an id above `after`, in one of `states` (all if
        none), named `name` (if given), unfinished or finished at `since` or later (if
        given), at most `limit`; and the cursor of the next page (the `after` that continues
        it), None when there is none.

        The state shown is the live one, which differs from the row's only while a run holds
        GPUs (a suspension under way, a stop): the rows are filtered in SQL by state, with
        the few jobs that hold GPUs added, and then by the state shown."""
        b, wanted = self.broker, set(states)
        also = b.state.holding() if wanted else ()
        views: list[dict] = []
        while limit is None or len(views) <= limit:
            want = None if limit is None else limit + 1 - len(views)
            rows = b.store.job_page(states=sorted(wanted | HOLDING) if wanted else (),
                                    also=also, after=after, limit=want, name=name, since=since)
            views += [v for v in self._page(rows) if not wanted or v["state"] in wanted]
            if not rows or want is None or len(rows) < want:
                break
            after = rows[-1].id
        if limit is not None and len(views) > limit:
            return views[:limit], views[limit - 1]["id"]
        return views, None

    def _page(self, rows: list) -> list[dict]:
        """The views of `rows`; the last runs of the ended jobs the state no longer holds
        (their roles) are read in one query."""
        b = self.broker
        last = b.store.last_runs([r.id for r in rows if r.id not in b.state.jobs])
        return [self.job(r, last.get(r.id, ())) for r in rows]  # (): read, it has no run

    def job(self, row, last: tuple | None = None) -> dict:
        """One `jobs` row as the API shows it, with what the live state knows better; `last`:
        (role, end reason) of its last run (() if none), if the state no longer holds it and
        the caller has read it."""
        b = self.broker
        job = b.state.jobs.get(row.id)
        parts = job.placement.parts() if job and job.placement else ()
        role = role_now(job, b.state, b.policy.promotes) if job else self._ended_role(row, last)
        view = {
            "id": row.id, "name": row.name, "model": row.model, "steps": row.steps,
            "state": (job.state if job else JobState(row.state)).value,
            "role": role.value if role else None,
            "node": ",".join(n for n, _ in parts) or None,
            "gpus": [g for _, gs in parts for g in gs],
            "parts": [[n, list(gs)] for n, gs in parts],  # its GPUs on each of its nodes
            "demand": row.demand, "want": None, "nodes": row.nodes,
            "nodes_min": row.nodes_min,  # a node range's fewest (None: exactly `nodes`)
            "retries": row.retries,
            "failures": row.failures, "not_before": row.not_before, "malleable": row.malleable,
            "gpus_request": "auto" if row.gpus_request is None else row.gpus_request,
            "step": row.step, "suspensions": row.suspensions, "after": row.after,
            "command": row.command, "emulate": row.emulate,
            # where it runs; a job of an older broker runs in its own directory
            "chdir": row.chdir or str(b.files.dir(row.id)),
            "per_gpu": bool(row.per_gpu),
            "submitted_at": row.submitted_at, "started_at": row.started_at,
            "finished_at": row.finished_at, "exit_code": row.exit_code, "reason": row.reason,
        }
        if (aim := self._aim(row, job)) is not None:
            view.update(demand=aim.count, want=aim.as_dict())
        live = b.runs.live.get(row.id)
        progress = b.files.progress(row.id, live.run_id) if live else {}
        if "step" in progress:
            view["step"] = progress["step"]
        speed = run_speed(b, row.id, row.steps, progress)
        view.update(rate=speed.rate, rate_source=speed.source, finish_at=speed.finish_at,
                    eta_s=speed.eta(b.clock.time()))
        return view

    def _ended_role(self, row, last: tuple | None = None) -> Role | None:
        """The role of an ended job the state no longer holds, as the broker held it at its
        end: its last run's, if that run ended it (not one suspended, or failed and retried,
        before the job was cancelled); `last`: that run's (role, end reason) if read, () if
        it has none."""
        if not JobState(row.state).finished:
            return None
        if last is None:
            last = self.broker.store.last_runs([row.id]).get(row.id)
        return Role(last[0]) if last and last[1] == row.state else None

    def _ended(self, row) -> Job | None:
        """An ended job the state no longer holds, as the broker held it at its end (for
        `explain`): its row, its role, its model's curve; None for an unfinished job's row."""
        state = JobState(row.state)
        if not state.finished:
            return None
        return replace(recorded_job(row), state=state, role=self._ended_role(row),
                       curve=self.broker.curve_of(row.id, job_spec(row)))

    def _aim(self, row, job) -> Target | None:
        """What an unfinished job aims for and why (None for one that has ended)."""
        if job is None or job.state.finished:
            return None
        return of_job(self._target(row.model, row.gpus_request), job.demand,
                      len(job.resume_on.gpus) if job.resume_on else 0)

    def _target(self, model: str | None, gpus: int | None) -> Target:
        """`core.target`'s count and reason for a job of `model` (`gpus`: its explicit count):
        the answer `marble curves` gives, looked up once per model until the book learns."""
        if gpus is not None:
            return explicit(gpus)
        b = self.broker
        if getattr(b.book, "version", 0) != self._targets_version:
            self._targets, self._targets_version = {}, b.book.version
        key = model_key(model)
        if key not in self._targets:
            book = b.book if isinstance(b.book, LearnedBook) else LearnedBook(b.book)
            self._targets[key] = book.target(model, b.state.max_node_size)
        return self._targets[key]

    async def job_detail(self, job_id: int) -> dict:
        """One job with its runs, its events, and why it is where it is."""
        b = self.broker
        rows = b.store.jobs([job_id])
        if not rows:
            raise NotFound(f"no job {job_id}", "id")
        view = self.job(rows[0])
        job = b.state.jobs.get(job_id) or self._ended(rows[0])
        now = b.clock.time()
        view["why"] = b.policy.explain(job, b.state, now) if job else None
        view["runs"] = [run_view(r) for r in b.store.runs(job_id)]
        view["events"] = [{"at": e.at, "kind": e.kind, "run_id": e.run_id, "data": e.data}
                          for e in b.store.events(job_id)]
        waiting = job is not None and job.state in (JobState.QUEUED, JobState.SUSPENDED)
        start = next((f["start_at"] for f in (await self.forecast())["jobs"]
                      if f["id"] == job_id), None) if waiting else None
        view["reasons"] = reasons(job, b.state, b.policy, now, self._history(job_id, view),
                                  start, self._aim(rows[0], job),
                                  b.config.time_scale if rows[0].emulate else 1.0,
                                  self._own_ends() if waiting else None) if job else \
            [f"it has ended ({view['state']})"]
        return view

    def _history(self, job_id: int, view: dict) -> list[tuple[str, dict]]:
        """The job's events for `reasons`, each run's start with the step the run itself
        says it restored (`restored`): its row once it has ended, its progress report while
        it runs (none before its first report)."""
        restored = {r["id"]: r["start_step"] for r in view["runs"] if r["ended_at"] is not None}
        for r in view["runs"]:
            if r["ended_at"] is None:
                step = self.broker.files.progress(job_id, r["id"]).get("start_step")
                if step is not None:
                    restored[r["id"]] = step
        return [(e["kind"], {**(e["data"] or {}), "restored": restored[e["run_id"]]}
                 if e["kind"] in RUN_STARTS and restored.get(e["run_id"]) is not None
                 else e["data"] or {}) for e in view["events"]]

    async def log(self, job_id: int, run_id: int | None, stream: str, offset: int,
                  limit: int, lines: int | None, rank: int | None = None) -> dict:
        """A page of one run's output (the job's latest run if `run_id` is None), with what
        a client following it needs: the job's state, its runs, whether the run has ended;
        with `rank`, only that rank's lines of a per-GPU job's run (a rank per GPU).
        The file is read in a thread: a log may sit on a slow shared file system."""
        b = self.broker
        rows = b.store.jobs([job_id])
        if not rows:
            raise NotFound(f"no job {job_id}", "id")
        runs = b.store.runs(job_id)
        run = runs[-1] if runs and run_id is None else \
            next((r for r in runs if r.id == run_id), None)
        if run is None and run_id is not None:
            raise NotFound(f"job {job_id} has no run {run_id}; its runs are "
                           f"{', '.join(str(r.id) for r in runs) or 'none yet'}", "run")
        if rank is not None:
            _check_rank(rows[0], run, rank)
        page = await asyncio.to_thread(b.files.read_log, job_id, run.id, stream, offset, limit,
                                       lines, rank) if run else \
            NO_OUTPUT
        job = b.state.jobs.get(job_id)
        return {"job_id": job_id, "state": (job.state if job else JobState(rows[0].state)).value,
                "runs": [r.id for r in runs], "run": run_view(run) if run else None,
                "stream": stream, **page}

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
            return self._with_running_ends(self._forecast)

    def _with_running_ends(self, made: dict) -> dict:
        """The forecast as of now: a running job ends no sooner than its own ETA (which
        follows its last reports, where the simulator plays its curve, and is fresher than
        a forecast reused for seconds), and the queue no sooner than its last job."""
        b = self.broker
        if made["finish_at"] is None:
            return {**made, "at": b.clock.time()}
        own = self._own_ends()
        jobs = [{**f, "end_at": max(f["end_at"], own[f["id"]])} if f["id"] in own else f
                for f in made["jobs"]]
        return {**made, "at": b.clock.time(), "jobs": jobs,
                "finish_at": max([made["finish_at"], *own.values()])}

    def _own_ends(self) -> dict[int, float]:
        """When each running job ends at its own speed: the ETA `status` shows (its eta_s),
        which `explain` gives too (one truth)."""
        b = self.broker
        return {i: end for i in b.runs.live
                if (end := run_speed(b, i, b.specs[i].steps).finish_at) is not None}

    def _forecast_snapshot(self):
        """What a forecast needs, copied from the live state: a function to run elsewhere,
        or the answer when there is nothing to simulate."""
        from marbled.sim.forecast import Left, forecast

        b, now = self.broker, self.broker.clock.time()
        left = [Left(job.id, b.specs[job.id], self._steps_left(job), job.placement is not None,
                     job.after)
                for job in b.state.active()]
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
            b.config.time_scale if emulated == {True} else 1.0, unfit=b.state.unfit())

        def answer() -> dict:
            result = run()
            return {"at": now, "finish_at": result.finish_at, "reason": result.reason,
                    "jobs": [{"id": i, "start_at": s, "end_at": e}
                             for i, (s, e) in sorted(result.ends.items())],
                    "left_out": [{"id": i, "why": result.left_out[i]}
                                 for i in sorted(result.left_out)[:LEFT_OUT_LISTED]],
                    "left_out_count": len(result.left_out)}

        return answer

    def _steps_left(self, job) -> int:
        """What a job has left to train: by its running run's last report, else by its
        checkpoint. A running job measured slower or faster than its curve counts the steps
        its curve would train in the time it needs at its measured speed: the simulator
        plays curves, and the jobs after it should wait as long as it will take."""
        total = self.broker.specs[job.id].steps or 0
        live = self.broker.runs.live.get(job.id)
        if not live:
            return int(job.steps_left if job.steps_left is not None else total)
        report = self.broker.files.progress(job.id, live.run_id)
        left = max(total - int(report.get("step") or live.start_step or 0), 0)
        speed = run_speed(self.broker, job.id, total)
        if speed.source == "measured" and job.curve and job.curve.possible(len(job.gpus)):
            left = round(left * job.curve.throughput(len(job.gpus), job.placement.share)
                         / speed.rate)
        return left

    def curves(self, model: str | None = None) -> dict:
        """Each model's curve: the profile's, what runs measured, what the broker believes."""
        b = self.broker
        book = b.book if isinstance(b.book, LearnedBook) else LearnedBook(b.book)
        return {"profile": book.system, "learning": b.learner is not None,
                "models": book.report(model)}

    def runs(self, since: float | None = None) -> dict:
        """Every run; with `since`, the runs open or ended at `since` or later."""
        store = self.broker.store
        rows = store.runs() if since is None else store.runs_since(since)
        return {"runs": [run_view(r) for r in rows], "started_at": self.broker.started_at,
                "since": since}


def _check_rank(job, run, rank: int) -> None:
    """A rank that the job's run (if it has one) has: one per GPU of a per-GPU job. Never,
    not Invalid: the rank is well formed, and another job or run may have it."""
    if not job.per_gpu:
        raise Never(f"job {job.id} is not a per-GPU job (submitted without --per-gpu): its "
                      "log has no ranks; leave out the rank", "rank")
    world = len(run_view(run)["gpus"]) if run else None
    if world is not None and rank >= world:
        raise Never(f"run {run.id} of job {job.id} has {world} rank(s), 0 to {world - 1} "
                      f"(one per GPU): there is no rank {rank}", "rank")


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
