"""The read-only API of a stopped broker: what its state directory records.

After the allocation ends, the state directory is all there is. `marble status`, `show`,
`explain`, `logs` and `schedule` then read it through `OfflineApi`, which answers the GET
routes they use as the broker would (`daemon/views.py`'s `Views`, over the jobs rebuilt
from the store as a broker's start rebuilds them: `daemon/recovery.py`), from the
database opened read-only (`report.queries.open_state`: nothing is written or created in
the state directory) and the jobs' own files. What only a live broker knows is left out:
no job runs, so there is no speed nor ETA; no forecast; no free GPUs.

Imported only when no broker answers (`cli/common.py`'s `Reader`): `marble submit` never
pays for it. (`cli/offline.py` is another thing: the simulator's commands.)
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

from marbled.api.openapi import LOG_PAGE, LOG_STREAMS, MAX_LOG_BYTES, parse_since
from marbled.cli.client import ApiError, BrokerUnreachable
from marbled.core.errors import Invalid, Never, NotFound, NotNow, Refusal
from marbled.core.model import JobState, Node, Placement, Role, State
from marbled.daemon.views import Views
from marbled.daemon.workfiles import JobFiles
from marbled.paths import DB_NAME, LOCK_NAME
from marbled.report.queries import StateFileError, open_state
from marbled.store.damage import DamagedValue, damaged_value
from marbled.store.db import Store, job_spec, recorded_job
from marbled.store.schema import placement_parts

FREE_NOW = "; the most free on a node is"  # how a policy's why_waiting ends with the free GPUs


class NoRecords(Exception):
    """The state directory holds no broker's records (no marble.db)."""


class ReadOnlyStore(Store):
    """The store's reads (`jobs`, `job_page`, `runs`, `events`, `samples`, `meta`) on a
    read-only connection: no migration, no table made, no pragma, no write."""

    def __init__(self, con):
        self.path, self.requests, self._con, self._engine = None, None, con, None


class OfflineViews(Views):
    """`Views` of the records: a forecast is a live broker's, simulated from now."""

    async def forecast(self) -> dict:
        return offline_forecast(self.broker.clock.time())

    async def job_detail(self, job_id: int) -> dict:
        """As a broker shows it, but an unfinished job first says that it waits for a
        broker, and its policy's line leaves out the GPUs free (a broker's, now)."""
        view = await super().job_detail(job_id)
        job = self.broker.state.jobs.get(job_id)
        if job is not None and not job.state.finished:
            where = self.broker.state_dir
            if job.state.holds_gpus:
                first = (f"it was {job.state.value} when its broker stopped without draining: "
                         f"a marbled started on {where} settles its run")
                view["why"], view["reasons"][0] = first.removeprefix("it "), first
            else:
                first = (f"it waits for a broker: none runs on {where}, and a marbled "
                         "started there carries on")
                view["why"] = view["why"].split(FREE_NOW)[0]
                view["reasons"][0:1] = [first, f"it {view['why']}"]
        return view


def offline_forecast(at: float) -> dict:
    return {"at": at, "finish_at": None, "jobs": [], "reason": None, "left_out": [],
            "left_out_count": 0}


class Records:
    """What `Views` reads of a broker (state, store, files, policy, book, config), rebuilt
    from a stopped broker's state directory as of its last event."""

    def __init__(self, state_dir: Path):
        from marbled.core.learning import LearnedBook, Learning

        self.state_dir = Path(state_dir)
        db = self.state_dir / DB_NAME
        if not db.is_file():
            raise NoRecords(f"{self.state_dir} holds no broker's records (no {DB_NAME})")
        self.store = ReadOnlyStore(open_state(db))
        meta = self.store.meta()
        nodes = json.loads(meta.get("nodes") or "{}")
        book = _book(meta)
        self.state = State(nodes={n: Node(n, tuple(range(len(d)))) for n, d in nodes.items()})
        self.book = LearnedBook(book, Learning(), self.state.max_node_size) \
            if self.state.nodes else book
        if isinstance(self.book, LearnedBook):  # as a broker's start replays them
            for row in self.store.samples():
                self.book.record(row.model, row.kind, row.value, row.gpus)
        self.config = SimpleNamespace(nodes=nodes, book=book,
                                      time_scale=float(meta.get("time_scale") or 1.0),
                                      state_dir=self.state_dir)
        self.policy = _policy(meta.get("policy"))
        self.files = JobFiles(self.state_dir)
        self.as_of = self.store.writer().execute("SELECT max(at) FROM events").fetchone()[0]
        self.clock = SimpleNamespace(time=lambda: self.as_of or time.time())
        self.runs = SimpleNamespace(live={})  # no run is watched: no speed, no ETA
        self.ledger = SimpleNamespace(fault=None, held=0)
        self.draining, self.learner = False, None
        self.started_at = None  # the stopped broker's start is not recorded
        self.pid = _last_pid(self.state_dir)
        self.specs: dict = {}
        self._rebuild()

    def _rebuild(self) -> None:
        """The jobs as the records leave them (as `recovery.recover` rebuilds them, without
        settling anything): a job whose run is open holds that run's GPUs; one that ended
        by its last run keeps that run's role, as the broker that saw it end shows it."""
        runs: dict[int, list] = {}
        for run in self.store.runs():
            runs.setdefault(run.job_id, []).append(run)
        for row in self.store.jobs():
            state, last = JobState(row.state), (runs.get(row.id) or [None])[-1]
            job = replace(recorded_job(row), state=state)
            parts = placement_parts(last.node, last.gpu_ids) if last is not None else []
            if state.holds_gpus and last is not None and last.ended_at is None \
                    and all(n in self.state.nodes for n, _ in parts):
                job = replace(job, role=Role(last.role), run_started=last.started_at,
                              placement=Placement(*parts[0], tuple(parts[1:]), last.share))
            elif state.holds_gpus:  # no open run: as a broker's start puts it back
                job = replace(job, state=JobState.SUSPENDED)
            elif state.finished and last is not None and last.end_reason != "suspended":
                job = replace(job, role=Role(last.role))
            spec = self.specs[row.id] = job_spec(row)
            curve = self.book.lookup(spec.model) if spec.model else None
            scale = self.config.time_scale if spec.emulate else 1.0
            self.state.submit(replace(
                job, curve=curve.in_time(scale) if curve else None,
                steps_left=max(spec.steps - row.step, 0) if spec.steps else None))

    def close(self) -> None:
        self.store.close()


def _book(meta: dict):
    """The profile the broker ran with (its path, else its name); an empty one if neither
    loads (its jobs then show no curve)."""
    from marbled.core.profiles import ProfileBook, ProfileError
    from marbled.resources import load_profile

    for ref in (meta.get("profile_ref"), meta.get("profile")):
        if ref:
            try:
                return load_profile(ref)
            except (ProfileError, OSError, ValueError):
                pass
    return ProfileBook(meta.get("profile") or "unknown", 1, {})


def _policy(name: str | None):
    """The broker's policy (with its default settings: they are not recorded)."""
    from marbled.core.policy import get_policy

    try:
        return get_policy(name or "marble")
    except (ValueError, OSError):  # e.g. a learned policy's weights are elsewhere
        return get_policy("marble")


def _last_pid(state_dir: Path) -> int | None:
    try:
        text = (state_dir / LOCK_NAME).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


# -- the routes


def _status_of(exc: Refusal) -> int:
    """The HTTP status the broker answers a refusal with (`api/server.py`'s status_of)."""
    for kind, status in ((Invalid, 400), (NotFound, 404), (Never, 409), (NotNow, 409)):
        if isinstance(exc, kind):
            return status
    return 400


def _whole(query: dict, name: str) -> int | None:
    values = query.get(name)
    if not values:
        return None
    if not (values[-1].isascii() and values[-1].isdigit()):
        raise Invalid(f"{name} must be a whole number", name)
    return int(values[-1])


class OfflineApi:
    """The GET routes `marble` reads, answered from a stopped broker's state directory, with
    BrokerClient's `get`; POST routes need a broker, and say so."""

    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)
        try:
            self.records = Records(self.state_dir)
        except StateFileError as exc:
            raise NoRecords(str(exc)) from None
        except DamagedValue as exc:  # a bad byte in a job's command, say
            raise NoRecords(damaged_value(self.state_dir / DB_NAME, exc)) from None
        self.views = OfflineViews(self.records)

    @property
    def note(self) -> str:
        """The line `marble` prints once, on stderr, when it reads the records."""
        at = self.records.as_of
        when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at)) if at else "no event"
        return (f"marble: no broker is running; read the records it left in "
                f"{self.state_dir} (as of {when})")

    def get(self, path: str) -> dict:
        try:
            return self._route(path)
        except Refusal as exc:
            raise ApiError(_status_of(exc), str(exc), exc.field) from None

    def post(self, path: str, body: object | None = None) -> dict:
        parts = urlsplit(path).path.strip("/").split("/")
        what = {"cancel": "cancel job", "suspend": "suspend job"}.get(parts[-1])
        doing = f"{what} {parts[2]}" if what and len(parts) == 4 else \
            {"jobs": "submit jobs", "shutdown": "stop it"}.get(parts[-1], f"POST {path}")
        raise BrokerUnreachable(f"no broker is running on {self.state_dir}: start one with "
                                f"`marbled` to {doing}")

    def submit(self, body: object, **_) -> dict:
        return self.post("/v1/jobs", body)

    def _route(self, path: str) -> dict:
        url = urlsplit(path)
        query = parse_qs(url.query)
        parts = url.path.strip("/").split("/")
        views = self.views
        if parts == ["v1", "status"]:
            return self.status()
        since = (query.get("since") or [None])[-1]  # /v1/jobs and /v1/runs take it
        if parts == ["v1", "runs"]:
            return views.runs(parse_since(since))
        if parts == ["v1", "forecast"]:
            return offline_forecast(self.records.clock.time())
        if parts == ["v1", "jobs"]:
            states = tuple(query.get("state", ()))
            known = {s.value for s in JobState}
            for wanted in states:
                if wanted not in known:
                    raise Invalid(f"unknown state '{wanted}'", "state")
            jobs, more = views.jobs(states, _whole(query, "after") or 0,
                                    _whole(query, "limit"), (query.get("name") or [None])[-1],
                                    parse_since(since))
            return {"jobs": jobs, "next": more}
        if len(parts) in (3, 4) and parts[:2] == ["v1", "jobs"] and parts[2].isdigit():
            job_id = int(parts[2])
            if len(parts) == 3:
                return asyncio.run(views.job_detail(job_id))
            if parts[3] == "log":
                stream = (query.get("stream") or ["stdout"])[-1]
                if stream not in LOG_STREAMS:
                    raise Invalid(f"stream must be {' or '.join(LOG_STREAMS)}", "stream")
                lines = _whole(query, "tail")
                limit = _whole(query, "limit") or (LOG_PAGE if lines is None else MAX_LOG_BYTES)
                return asyncio.run(views.log(job_id, _whole(query, "run"), stream,
                                             _whole(query, "offset") or 0, limit, lines,
                                             _whole(query, "rank")))
        raise NotFound(f"GET {url.path} needs a running broker (start one with `marbled`)")

    def status(self) -> dict:
        """GET /v1/status as the broker answered it, but for what only a live broker has:
        the pid is the last broker's (null if unknown), and no GPU is counted free."""
        doc = self.views.status()
        return {**doc, "pid": self.records.pid, "running": False, "as_of": self.records.as_of,
                "nodes": {n: {**v, "free": None} for n, v in doc["nodes"].items()}}

    def drained_since(self, at: float) -> bool:
        """Whether the broker began a drain at `at` or later (its `drain` event)."""
        return self.records.store.writer().execute(
            "SELECT 1 FROM events WHERE kind = 'drain' AND at >= ? LIMIT 1",
            (at,)).fetchone() is not None

    def close(self) -> None:
        self.records.close()
