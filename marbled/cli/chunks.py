"""A large job set in several requests: `marble submit --file` of a file whose jobs do not
fit in one POST /v1/jobs (the broker reads at most `max_request_bytes` a request, and
`max_jobs_per_request` jobs; GET /v1/status says both).

Each request (a chunk) is atomic, as any submission: all its jobs or none. The chunks go
in the file's order, each sized by its encoded JSON with headroom under the limit.

Dependencies: an `after` name resolves, in one request, to the latest earlier job of the
request with that name, else to the broker's latest job so named. Across chunks the client
keeps that meaning exactly: a name whose latest earlier definition in the file is in a
chunk already accepted is sent as that job's id (from the broker's answer), so that no job
submitted meanwhile by someone else under the same name can take the link. An `after`
integer is a job id, as in one request.

Idempotency and re-running: each chunk has its own Idempotency-Key, `BASE-N` (a retry
after a timeout sends the same). BASE is new to a submission and kept in the state
directory (submissions/, one small file per job file path and broker) with, for each
chunk the broker accepted, its first job id, its count and a digest of its jobs, until
every chunk is accepted. A later `marble submit` of the same file on the same broker,
after a failure half-way, does not send the chunks it accepted again: it checks that
they are unchanged (their jobs as they would be sent; the environment they share aside,
so that a re-run from another shell works) and that the broker still has their jobs,
then sends the rest (with the same BASE). A chunk that changed is refused before
anything is sent, saying which file to remove to submit the whole file anew. Once all
are accepted the file goes away, and the same command submits the jobs anew, as for a
small file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path

from marbled.cli.client import ApiError, BrokerClient, BrokerUnreachable

DEFAULT_MAX_BYTES = 4 * 1024 * 1024  # what a broker that does not say it reads
DEFAULT_MAX_JOBS = 10_000
HEADROOM = 0.9  # of the limit a chunk may use
ENVELOPE = 64  # '{"jobs": []}' around the jobs
ID_BYTES = 20  # the most an id sent for an `after` name may take, encoded
RECORDS = "submissions"  # under the state directory


class ChunkFailed(RuntimeError):
    """A chunk was refused or not answered; the message says how far the submission got."""


def limits(api: BrokerClient) -> tuple[int, int]:
    """The broker's (bytes, jobs) a request; the defaults for a broker that does not say."""
    status = api.get("/v1/status")
    return (int(status.get("max_request_bytes") or DEFAULT_MAX_BYTES),
            int(status.get("max_jobs_per_request") or DEFAULT_MAX_JOBS))


def _encoded(job: dict) -> int:
    """Bytes the job takes in a request, at most (an `after` name may become an id)."""
    size = len(json.dumps(job)) + 2  # ", " between jobs
    for ref in job.get("after", ()):
        if isinstance(ref, str):
            size += max(ID_BYTES - len(json.dumps(ref)), 0)
    return size


def split(body: dict, max_bytes: int, max_jobs: int) -> list[tuple[int, int]]:
    """The chunks of the job set `body` ({"jobs": [...]} and what every chunk carries
    along), as [start, end) bounds of its jobs, in order."""
    jobs = body["jobs"]
    budget = int(max_bytes * HEADROOM) - ENVELOPE - len(json.dumps(
        {k: v for k, v in body.items() if k != "jobs"}))
    bounds, start, size = [], 0, 0
    for i, job in enumerate(jobs):
        n = _encoded(job)
        if n > budget:
            raise ChunkFailed(f"job {i + 1} alone takes {n} bytes as JSON, over what one "
                              f"request may carry ({max_bytes} bytes, with headroom)")
        if i > start and (size + n > budget or i - start >= max_jobs):
            bounds.append((start, i))
            start, size = i, 0
        size += n
    bounds.append((start, len(jobs)))
    return bounds


def _cross_links(jobs: list[dict], bounds: list[tuple[int, int]]) -> dict[int, list]:
    """For each job with an `after` name whose latest earlier definition in the file lies in
    an earlier chunk: [(position in its `after`, index of the job it names)]."""
    chunk_start = {}
    for start, end in bounds:
        for i in range(start, end):
            chunk_start[i] = start
    defined: dict[str, int] = {}
    links: dict[int, list] = {}
    for i, job in enumerate(jobs):
        for k, ref in enumerate(job.get("after", ())):
            d = defined.get(ref) if isinstance(ref, str) else None
            if d is not None and d < chunk_start[i]:
                links.setdefault(i, []).append((k, d))
        if job.get("name"):
            defined[job["name"]] = i
    return links


def record_path(state_dir: Path, job_file: Path, where: str) -> Path:
    digest = hashlib.sha256(f"{os.path.abspath(job_file)}\0{where}".encode()).hexdigest()
    return Path(state_dir) / RECORDS / f"{digest[:32]}.json"


def _resume(record: Path, job_file: Path, chunks: int) -> tuple[dict, bool]:
    """This file's unfinished submission (its key base, and the chunks the broker accepted:
    first id, count, digest), or a new one, recorded; and whether it is recorded."""
    try:
        state = json.loads(record.read_text())
        if re.fullmatch(r"[0-9a-f]{32}", state["key"]) and isinstance(state["accepted"], list):
            return state, True
    except (OSError, ValueError, KeyError, TypeError):
        pass
    state = {"file": os.path.abspath(job_file), "key": secrets.token_hex(16),
             "chunks": chunks, "accepted": []}
    return state, _write(record, state)


def _write(record: Path, state: dict) -> bool:
    try:
        record.parent.mkdir(mode=0o700, exist_ok=True)
        temporary = record.with_suffix(".tmp")
        temporary.write_text(json.dumps(state))
        temporary.replace(record)
    except OSError:
        return False  # not kept: a re-run after a failure submits every chunk again
    return True


def _digest(chunk: list[dict]) -> str:
    """A chunk's jobs, as sent (the environment they share aside: a re-run from another
    shell sends the rest with its own)."""
    return hashlib.sha256(json.dumps(chunk, sort_keys=True).encode()).hexdigest()


def _accepted_before(api: BrokerClient, first: int, count: int) -> list[dict]:
    """The jobs `first`.. of a chunk the broker accepted at an earlier try (as it shows
    them now)."""
    page = api.get(f"/v1/jobs?after={first - 1}&limit={count}")["jobs"]
    return [j for j in page if first <= j["id"] < first + count]


def _shifted(exc: ApiError, start: int) -> ApiError:
    """The refusal of a chunk's job, counted in the whole file ('job 30001: ...')."""
    field, message = exc.field, str(exc)
    match = re.match(r"jobs\[(\d+)\](.*)", field or "")
    if match and start:
        i = int(match.group(1))
        field = f"jobs[{i + start}]{match.group(2)}"
        message = re.sub(rf"^job {i + 1}:", f"job {i + 1 + start}:", message)
    return ApiError(exc.status, message, field)


def submit_in_chunks(api: BrokerClient, body: dict, bounds: list[tuple[int, int]],
                     record: Path | None, job_file: Path,
                     place: Callable[[str | None], str | None],
                     say: Callable[[str], None]) -> list[dict]:
    """Send the job set `body` in the chunks `bounds` (each with the fields besides "jobs");
    the accepted jobs, in order. Raises ChunkFailed, saying how many were submitted and
    what to do."""
    jobs = body["jobs"]
    along = {k: v for k, v in body.items() if k != "jobs"}
    state, kept = _resume(record, job_file, len(bounds)) if record else \
        ({"key": secrets.token_hex(16), "accepted": []}, False)
    record = record if kept else None
    links = _cross_links(jobs, bounds)
    accepted: list[dict] = []
    for n, (start, end) in enumerate(bounds):
        chunk = jobs[start:end]
        for i in range(start, end):
            for k, d in links.get(i, ()):
                jobs[i]["after"][k] = accepted[d]["id"]
        digest = _digest(chunk)
        try:
            if n < len(state["accepted"]):  # accepted at an earlier try: not sent again
                before = state["accepted"][n]
                rows = [] if before["digest"] != digest else \
                    _accepted_before(api, before["first"], before["count"])
                if len(rows) != len(chunk):
                    raise ChunkFailed(_changed(n, before, record, len(bounds)))
                accepted.extend(rows)
                say(f"chunk {n + 1} of {len(bounds)} accepted before (jobs {before['first']}-"
                    f"{before['first'] + before['count'] - 1}): {len(accepted):,} of "
                    f"{len(jobs):,} jobs submitted")
                continue
            answer = api.submit({**along, "jobs": chunk}, key=f"{state['key']}-{n + 1}",
                                on_retry=lambda said: say(said))
        except (ApiError, BrokerUnreachable) as exc:
            raise ChunkFailed(_failure(exc, start, n, bounds, len(accepted), len(jobs),
                                       place, record)) from None
        accepted.extend(answer["jobs"])
        if record:
            state["accepted"].append({"first": answer["jobs"][0]["id"], "count": len(chunk),
                                      "digest": digest})
            _write(record, state)
        say(f"chunk {n + 1} of {len(bounds)} accepted: {len(accepted):,} of {len(jobs):,} "
            "jobs submitted")
    if record:
        with contextlib.suppress(OSError):
            record.unlink()
    return accepted


def _changed(n: int, before: dict, record: Path | None, chunks: int) -> str:
    last = before["first"] + before["count"] - 1
    return (f"chunk {n + 1} of {chunks} is not the one an unfinished submission of this file "
            f"sent before (the broker accepted it as jobs {before['first']}-{last}): the file "
            "changed there since, or those jobs are gone; nothing was submitted now. To "
            f"submit the whole file anew, remove {record} and run the command again")


def _failure(exc: Exception, start: int, n: int, bounds: list, done: int, total: int,
             place: Callable[[str | None], str | None], record: Path | None) -> str:
    if isinstance(exc, ApiError):
        exc = _shifted(exc, start)
        where = place(exc.field)
        reason = f"refused ({exc.status}): " + (f"{where}: " if where else "") + str(exc)
        if exc.status == 409 and exc.field == "Idempotency-Key":
            reason += ("; this chunk is not the one an unfinished submission of this file "
                       "sent before (the file changed in a part the broker accepted)"
                       + (f"; to submit the whole file anew, remove {record}" if record
                          else ""))
    else:
        reason = str(exc)
    got = (f"submitted {done:,} of {total:,} jobs (chunk{'s' if n > 1 else ''} "
           f"{'1-' if n > 1 else ''}{n} of {len(bounds)})" if n else
           f"submitted none of {total:,} jobs (in {len(bounds)} chunks)")
    again = "run the same command again to submit the rest" if n else \
        "run the same command again once that is fixed"
    if n and record is None:
        again = ("the accepted ones could not be recorded (no state directory to keep the "
                 "submission's key in): a re-run submits them again; submit the rest")
    elif n:
        again += f" (the {done:,} accepted are not submitted again)"
    return f"{got}; chunk {n + 1} failed: {reason}; {again}"
