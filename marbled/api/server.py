"""The broker's HTTP API (JSON), served on a Unix socket in the state directory.

  GET  /v1/status              broker, nodes, free GPUs, job counts
  POST /v1/jobs                submit: one job object, or {"jobs": [...]}
  GET  /v1/jobs[?state=S&name=X&limit=N&after=ID&since=T]
                               list jobs (FIFO order): in state S (repeatable), named X,
                               unfinished or finished at Unix time T or later, the first N
                               after job ID; `next` is the `after` of the next page
  GET  /v1/jobs/{id}           one job with its runs
  GET  /v1/jobs/{id}/log[?stream=stdout|stderr&run=R&offset=B&limit=B&tail=N&rank=K]
                               a page of a run's output (the latest run's by default), as
                               JSON with the offset that continues it: clients follow by polling
  POST /v1/jobs/{id}/cancel    cancel a queued or running job
  POST /v1/jobs/{id}/suspend   checkpoint a running job; it resumes when the FIFO reaches it
  GET  /v1/runs[?since=T]      every launch segment (the schedule); those open or ended at
                               Unix time T or later (the dashboard's window)
  GET  /v1/curves[?model=M]    each model's curve: profile, measured, believed
  GET  /v1/forecast            when each unfinished job should start and end (simulated)
  POST /v1/shutdown            suspend all running jobs to checkpoints and stop
  GET  /v1/openapi.json        this API as OpenAPI 3.1
  GET  /metrics                Prometheus metrics (text format, not JSON)
  GET  /dashboard/             the web dashboard: static files, no token (api/dashboard)

Every error is a 4xx (or a 503 while the broker drains) with {"error": "...",
"field": "...", "retry": bool}: `error` says what to change, `retry` whether the
same request may succeed later (the core's NotNow) or never will.

The routes call two objects the daemon provides: `commands` (submit, cancel,
suspend: the broker) and `views` (what it shows); nothing here imports the daemon.
A third, `metrics`, renders /metrics and counts the errors answered.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

from aiohttp import web

from marbled.api import dashboard
from marbled.api.answers import answer
from marbled.api.openapi import (
    IDEMPOTENCY_HEADER,
    KEY_PATTERN,
    LOG_PAGE,
    LOG_STREAMS,
    MAX_JOB_ID,
    MAX_KEY,
    MAX_LOG_BYTES,
    MAX_LOG_LINES,
    MAX_OFFSET,
    MAX_PAGE,
    MAX_RANK,
    MAX_WAIT_JOBS,
    MAX_WAIT_S,
    WAIT_S,
    for_broker,
    parse_since,
)
from marbled.core.admission import in_batch
from marbled.core.environment import Environment
from marbled.core.errors import Invalid, Never, NotFound, NotNow, Refusal, Unavailable
from marbled.core.model import JobState
from marbled.core.policy import POLICIES
from marbled.core.spec import MAX_NAME, MODEL_NAME, JobSpec, SpecError
from marbled.store.damage import DamagedValue

MAX_BODY = 4 * 1024 * 1024
MAX_JOBS_PER_REQUEST = 10_000
MAX_BODY_ENV = "MARBLE_MAX_REQUEST_BYTES"  # a lower (or higher) limit, e.g. for tests


def max_body() -> int:
    """The largest request body the broker reads: MAX_BODY, or $MARBLE_MAX_REQUEST_BYTES
    (at least 64 KiB). GET /v1/status says it (`max_request_bytes`), so that a client
    sends a large job set in as many requests as it needs."""
    raw = os.environ.get(MAX_BODY_ENV, "")
    return max(int(raw), 65536) if raw.isascii() and raw.isdigit() else MAX_BODY


class HttpRefusal(Refusal):
    """A refusal only HTTP knows (a body too large, not JSON): its own status."""

    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(message, field)
        self.status = status


def status_of(exc: Refusal) -> int:
    if isinstance(exc, HttpRefusal):
        return exc.status
    for kind, status in ((Unavailable, 503), (Invalid, 400), (NotFound, 404), (Never, 409),
                         (NotNow, 409)):
        if isinstance(exc, kind):
            return status
    return 400


def _error(status: int, message: str, field: str | None = None,
           retry: bool = False) -> web.Response:
    body: dict[str, Any] = {"error": message, "retry": retry}
    if field:
        body["field"] = field
    return answer(body, status=status)


def peer_uid(request: web.Request) -> int | None:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def authorized(token: str | None) -> Callable:
    """Who may talk to the broker: on the Unix socket (0600) the user who started it
    (SO_PEERCRED); on the TCP listener whoever shows the allocation's token."""

    @web.middleware
    async def check(request: web.Request, handler: Callable) -> web.StreamResponse:
        uid = peer_uid(request)
        if uid is not None:
            if uid != os.geteuid():
                return _error(403, f"uid {uid} may not use this broker: it belongs to uid "
                                   f"{os.geteuid()}, who started it")
            return await handler(request)
        if dashboard.is_public(request):
            # The dashboard's static files hold no data (its page sends the token with
            # every /v1 request it makes): a browser may load them without the token.
            return await handler(request)
        if token is None:
            return _error(403, "this broker answers only on its Unix socket")
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return _error(401, "send the broker's token as 'Authorization: Bearer TOKEN' "
                               "(it is in the state directory's 'token' file, mode 0600)")
        return await handler(request)

    return check


@web.middleware
async def errors_as_json(request: web.Request, handler: Callable) -> web.StreamResponse:
    try:
        return await handler(request)
    except Refusal as exc:
        return _error(status_of(exc), str(exc), exc.field, exc.retry)
    except DamagedValue as exc:  # a bad byte in an ended job's row (docs/staff-guide.md)
        return _error(500, f"the store holds a value that cannot be read: {exc}; stop the "
                           "broker: its next start says how to put it right")
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"request body too large; the limit is {max_body()} bytes "
                           "(submit large job sets in several requests)")
    except web.HTTPException as exc:
        if exc.status >= 400:
            answer = _error(exc.status, exc.reason)
            if "Allow" in exc.headers:  # a 405 says which methods the path has (RFC 9110)
                answer.headers["Allow"] = exc.headers["Allow"]
            return answer
        raise


def counted(on_error: Callable[[int], None]) -> Callable:
    """Count every error answered, by status; outermost, so it sees the access refusals
    and what aiohttp turns into a 500."""

    @web.middleware
    async def count(request: web.Request, handler: Callable) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            if exc.status >= 400:
                on_error(exc.status)
            raise
        except Exception:
            on_error(500)
            raise
        if response.status >= 400:
            on_error(response.status)
        return response

    return count


async def _json_body(request: web.Request) -> object:
    if request.content_type != "application/json":
        raise HttpRefusal(415, "send the body as JSON with Content-Type: application/json")
    try:
        return json.loads(await request.text(), parse_float=_number)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Invalid(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        # the parser's stack ends near 1,000 levels; a job set needs 4 ({"jobs": [{...: [...
        raise Invalid("the body nests arrays or objects too deeply to read; a job set needs "
                      "at most 4 levels ({\"jobs\": [{\"command\": [...]}]})", "body") from None


SUBMISSION_FIELDS = {"jobs", "export", "env"}  # of a {"jobs": [...]} body (client_token: out)


def _idempotency_key(request: web.Request, body: object) -> str | None:
    """The request's idempotency key: its Idempotency-Key header, or the `client_token` of
    a {"jobs": [...]} body (taken out of it); None if it has neither."""
    keys = {}
    if IDEMPOTENCY_HEADER in request.headers:
        keys[IDEMPOTENCY_HEADER] = request.headers[IDEMPOTENCY_HEADER]
    if isinstance(body, dict) and "jobs" in body and "client_token" in body:
        keys["client_token"] = body.pop("client_token")
    for field, key in keys.items():
        if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
            raise Invalid(f"{field} must be 1 to {MAX_KEY} printable ASCII characters without "
                          "spaces (a UUID, for one), new for each request", field)
    if len(set(keys.values())) > 1:  # 409: each is well formed, they disagree
        raise Never(f"the {IDEMPOTENCY_HEADER} header and 'client_token' differ; send one "
                    "of them", "client_token")
    return next(iter(keys.values()), None)


def _number(text: str) -> int | float:
    """A JSON number: 3.0 and 3e2 are the integers 3 and 300, as JSON Schema (the OpenAPI
    document's "integer") counts them."""
    value = float(text)
    return int(value) if value.is_integer() else value


def _job_id(request: web.Request) -> int:
    raw = request.match_info["job_id"]
    # ASCII digits only: str.isdigit() also takes '²', which int() refuses
    if not (raw.isascii() and raw.isdigit()) or len(raw) > len(str(MAX_JOB_ID)):
        raise Invalid(f"'{raw}' is not a job id; job ids are whole numbers up to "
                      f"{MAX_JOB_ID}", "id")
    return int(raw)


def _whole(request: web.Request, name: str, least: int, most: int) -> int | None:
    """A whole-number query parameter within [least, most], or None when absent."""
    raw = request.query.get(name)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or not least <= int(raw) <= most:
        raise Invalid(f"{name} must be a whole number from {least} to {most}", name)
    return int(raw)


def _seconds(request: web.Request, name: str, most: float, default: float) -> float:
    """A duration query parameter in seconds, from 0 to `most`; `default` when absent."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= most:  # NaN fails too
        raise Invalid(f"{name} must be a number of seconds from 0 to {most:g}", name)
    return value


def _job_ids(request: web.Request) -> list[int]:
    """The `job` query parameters (repeated): job ids, at most MAX_WAIT_JOBS, each once."""
    raw = request.query.getall("job", ())
    if len(raw) > MAX_WAIT_JOBS:
        raise Invalid(f"at most {MAX_WAIT_JOBS} jobs by id; to wait for every job, name none",
                      "job")
    ids = []
    for value in raw:
        if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_JOB_ID:
            raise Invalid(f"job must be a job id: a whole number from 1 to {MAX_JOB_ID}",
                          "job")
        ids.append(int(value))
    return list(dict.fromkeys(ids))


def _since(request: web.Request) -> float | None:
    return parse_since(request.query.get("since"))


def build_app(commands: Any, views: Any, on_shutdown: Callable[[], None],
              token: str | None = None, metrics: Any = None) -> web.Application:
    """`metrics`: `exposition()` -> (body, content type) and `api_error(status)`."""
    middlewares = [authorized(token), errors_as_json]
    if metrics is not None:
        middlewares.insert(0, counted(metrics.api_error))
    limit = max_body()
    app = web.Application(client_max_size=limit, middlewares=middlewares)
    routes = web.RouteTableDef()

    @routes.get("/v1/status")
    async def status(request: web.Request) -> web.Response:
        return answer({**views.status(), "max_request_bytes": limit,
                       "max_jobs_per_request": MAX_JOBS_PER_REQUEST})

    @routes.get("/v1/wait")
    async def wait(request: web.Request) -> web.Response:
        # a long poll: answered as the last job ends, at no cost before (marble wait)
        timeout = _seconds(request, "timeout", MAX_WAIT_S, WAIT_S)
        ids = _job_ids(request)
        if ids:
            views.counts_of(ids)  # 404 for a job that does not exist, before any wait
        ended = await commands.end_waiters.wait(timeout, ids or None)
        status = views.status()
        return answer({"ended": ended,
                       "jobs": views.counts_of(ids) if ids else status["jobs"],
                       "draining": status["draining"],
                       "cannot_run": views.cannot_run(ids)})

    @routes.post("/v1/jobs")
    async def submit(request: web.Request) -> web.Response:
        body = await _json_body(request)
        key = _idempotency_key(request, body)
        many = isinstance(body, dict) and "jobs" in body and set(body) <= SUBMISSION_FIELDS
        docs = body["jobs"] if many else [body]
        # the environment of every job that gives none of its own: sent once, checked once
        shared = Environment.of(body) if many and ("export" in body or "env" in body) \
            else None
        if not isinstance(docs, list) or not docs:
            raise Invalid("'jobs' must be a non-empty list of job objects", "jobs")
        if len(docs) > MAX_JOBS_PER_REQUEST:
            # 400 as for any document the schema refuses (maxItems); 413 is for the bytes
            raise Invalid(f"at most {MAX_JOBS_PER_REQUEST} jobs per request; submit the "
                          "rest in another request", "jobs")
        specs = []
        for i, doc in enumerate(docs):
            try:
                specs.append(JobSpec.from_mapping(doc, environment=shared))
            except SpecError as exc:
                raise (in_batch(exc, i) if many else exc) from None
        # Admitted now; durable once the group commit that carries them is done (the
        # submissions that arrive together share one transaction): only then the 201.
        rows, durable, again = commands.submit_grouped(specs, key)
        jobs = [views.job(r) for r in rows]
        for view, r in zip(jobs, rows, strict=True):  # each view is a new dict: no copy
            view["notes"] = getattr(r, "notes", [])
        await asyncio.shield(durable)
        # a retry of a keyed request: 200 (nothing new was created), the same jobs
        return answer({"jobs": jobs}, status=200 if again else 201,
                      headers={"Idempotent-Replayed": "true"} if again else None)

    @routes.get("/v1/jobs")
    async def list_jobs(request: web.Request) -> web.Response:
        states = tuple(request.query.getall("state", ()))
        known = {s.value for s in JobState}
        for wanted in states:
            if wanted not in known:
                raise Invalid(f"unknown state '{wanted}'; use one of "
                              f"{', '.join(s.value for s in JobState)}", "state")
        limit = _whole(request, "limit", 1, MAX_PAGE)
        after = _whole(request, "after", 0, MAX_JOB_ID)
        name = request.query.get("name")
        if name is not None and not 0 < len(name) <= MAX_NAME:
            raise Invalid(f"name must be a job's name: 1 to {MAX_NAME} characters", "name")
        jobs, more = views.jobs(states, after or 0, limit, name, _since(request))
        return answer({"jobs": jobs, "next": more})

    @routes.get("/v1/jobs/{job_id}")
    async def show(request: web.Request) -> web.Response:
        return answer(await views.job_detail(_job_id(request)))

    @routes.get("/v1/jobs/{job_id}/log")
    async def log(request: web.Request) -> web.Response:
        job_id = _job_id(request)
        stream = request.query.get("stream", "stdout")
        if stream not in LOG_STREAMS:
            raise Invalid(f"stream must be {' or '.join(LOG_STREAMS)}", "stream")
        run = _whole(request, "run", 1, MAX_JOB_ID)
        offset = _whole(request, "offset", 0, MAX_OFFSET) or 0
        lines = _whole(request, "tail", 1, MAX_LOG_LINES)
        limit = _whole(request, "limit", 1, MAX_LOG_BYTES) or \
            (LOG_PAGE if lines is None else MAX_LOG_BYTES)
        rank = _whole(request, "rank", 0, MAX_RANK)
        return answer(await views.log(job_id, run, stream, offset, limit, lines, rank))

    @routes.post("/v1/jobs/{job_id}/cancel")
    async def cancel(request: web.Request) -> web.Response:
        job_id = _job_id(request)
        commands.cancel(job_id)
        return answer({"id": job_id, "cancel": "requested"}, status=202)

    @routes.post("/v1/jobs/{job_id}/suspend")
    async def suspend(request: web.Request) -> web.Response:
        job_id = _job_id(request)
        commands.suspend(job_id)
        return answer({"id": job_id, "suspend": "requested"}, status=202)

    @routes.get("/v1/runs")
    async def runs(request: web.Request) -> web.Response:
        return answer(views.runs(_since(request)))

    @routes.get("/v1/forecast")
    async def forecast(request: web.Request) -> web.Response:
        return answer(await views.forecast())

    @routes.get("/v1/curves")
    async def curves(request: web.Request) -> web.Response:
        model = request.query.get("model")
        # the schema's pattern, so that the two agree (the schema once took "\x1f" as a name)
        if model is not None and not MODEL_NAME.fullmatch(model):
            raise Invalid("model must be a model name such as resnet-50 (letters, digits "
                          "and . _ + : / -)", "model")
        return answer(views.curves(model))

    @routes.get("/v1/openapi.json")
    async def openapi(request: web.Request) -> web.Response:
        # SPEC with this broker's limits, so that what it describes is what it accepts
        status = views.status()
        policy = POLICIES.get(status["policy"])
        return answer(for_broker(
            max(len(node["gpus"]) for node in status["nodes"].values()),
            len(status["nodes"]) if policy is None or policy.multi_node else 1,
            [m["model"] for m in views.curves()["models"]
             if any(c["estimate"] is not None for c in m["counts"])]))

    @routes.get("/metrics")  # where Prometheus looks by default; not versioned with /v1
    async def prometheus(request: web.Request) -> web.Response:
        if metrics is None:
            raise NotFound("this broker keeps no metrics")
        body, content_type = metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": content_type})

    @routes.post("/v1/shutdown")
    async def shutdown(request: web.Request) -> web.Response:
        asyncio.get_running_loop().call_soon(on_shutdown)
        return answer({"shutdown": "started"}, status=202)

    app.add_routes(routes)
    dashboard.add_routes(app.router)  # GET /dashboard/: static files, read-only page
    return app
