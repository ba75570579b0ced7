"""The OpenAPI 3 description of the broker's API, served at GET /v1/openapi.json."""

from __future__ import annotations

import copy
import functools
import re
import sys

from marbled.core.environment import BATCH_PREFIXES, MAX_ENV_BYTES, MAX_ENV_VARS, RUN_VARS
from marbled.core.errors import Invalid
from marbled.core.model import JobState
from marbled.core.spec import (
    MAX_COMMAND_ARGS,
    MAX_MODEL,
    MAX_NAME,
    MAX_NODES,
    MAX_PATH,
    MAX_RETRIES,
    MAX_STEPS,
    MODEL_CHARS,
    NODE_RANGE,
)

ENUMERATED_RANGES = 32  # up to this many nodes, a broker lists the node ranges it takes
MAX_JOB_ID = 10**18 - 1  # the largest id the API takes: 18 digits (SQLite's integers hold it)
MAX_PAGE = 10_000  # GET /v1/jobs?limit=: the most jobs a page may ask for
LOG_STREAMS = ("stdout", "stderr")  # GET /v1/jobs/{id}/log?stream=
LOG_PAGE = 1024 * 1024  # ... &limit=: the bytes of a page by default
MAX_LOG_BYTES = 4 * 1024 * 1024  # ... at most, and by default with &tail=
MAX_LOG_LINES = 100_000  # ... &tail=: the most lines
MAX_TIME = 1e11  # ?since=: a Unix time in seconds below this (the year 5138)
MAX_OFFSET = 2**62  # ... &offset=: larger than any file
WAIT_S, MAX_WAIT_S = 30.0, 300.0  # GET /v1/wait?timeout=: by default, at most
MAX_WAIT_JOBS = 300  # ... &job=: the most named (300 ids of 18 digits fit an 8 KiB request line)
# The longest request line the server reads. aiohttp's parser answers a longer one itself
# (a text/plain 400, outside this document), so it is far above any valid query (8 KiB):
# an invalid one, say 300 names for ids, reaches the handlers, which refuse it in JSON.
MAX_REQUEST_LINE = 256 * 1024
MAX_RANK = 999_999  # ... &rank=: beyond any run's GPU count (the run's own count is checked)
ERROR = {"$ref": "#/components/schemas/Error"}
# POST /v1/jobs: a key that makes a retry answer with the first request's jobs (docs/api.md)
IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_KEY = 255
KEY_PATTERN = re.compile(f"[!-~]{{1,{MAX_KEY}}}")  # printable ASCII, no space
IDEMPOTENCY_KEY = {"type": "string", "pattern": f"^{KEY_PATTERN.pattern}$"}
# What no job's text may hold (JobSpec): a NUL byte (no argument, path or name can); in a
# name or an `after` name, nor a control character or a line or paragraph separator. (Lone
# surrogates are refused too; a pattern cannot name them in every regex dialect.)
NO_NUL = {"not": {"type": "string", "pattern": "\u0000"}}
NO_CONTROL = {"not": {"type": "string", "pattern": "[\u0000-\u001f\u007f-\u009f\u2028\u2029]"}}
JOB_ID = {"name": "job_id", "in": "path", "required": True,
          "schema": {"type": "integer", "minimum": 1, "maximum": MAX_JOB_ID}}


def _one_not_in(test) -> str:
    """A pattern for a string with a character c for which `test(c)` is false (Python's
    str.isspace, str.isdigit, as JobSpec checks): a class of the literal characters, so
    that every regex dialect reads it alike."""
    chars = [c for c in map(chr, range(sys.maxunicode + 1)) if test(c)]
    spans: list[list[str]] = []
    for c in chars:
        if spans and ord(spans[-1][1]) == ord(c) - 1:
            spans[-1][1] = c
        else:
            spans.append([c, c])
    return "[^" + "".join(a if a == b else f"{a}-{b}" for a, b in spans) + "]"


# What shlex.split (JobSpec) makes at least one word of: quotes closed, no lone backslash
_UNIT = r"""\\[\s\S]|'[^']*'|"(?:[^"\\]|\\[\s\S])*\""""
COMMAND_WORDS = rf"""^[ \t\r\n]*(?:[^ \t\r\n'"\\]|{_UNIT})(?:[^'"\\]|{_UNIT})*$"""
NO_WORDS = r"^[ \t\r\n]*$"
TORCHRUN_WORD = r"^[ \t\r\n]*([^ \t\r\n'\"\\]*/)?torchrun([ \t\r\n]|$)"


def _answer(description: str, status: str = "200", *more: tuple[str, str],
            schema: dict | None = None) -> dict:
    """An operation's answers: `status` with `schema` (a $ref to components/schemas), and
    the errors every operation may give (the error middleware's body, ERROR), and `more`."""
    errors = {code: {"description": why, "content": {"application/json": {"schema": ERROR}}}
              for code, why in (("400", "bad input; `error` says what to change"),
                                ("401", "TCP without the broker's token"),
                                ("403", "another user"), ("404", "no such job"),
                                ("409", "not in this job's state (`retry`: whether it may be "
                                        "later)"), *more)}
    return {status: {"description": description,
                     "content": {"application/json": {"schema": schema or {"type": "object"}}}},
            **errors}


def _requested(what: str) -> dict:
    """The 202 of a cancel or suspend: {"id": ..., what: "requested"}."""
    return _object({"id": INT, what: {"const": "requested"}})


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(properties: dict, optional: tuple[str, ...] = ()) -> dict:
    """An answer's object: every field the server sends described, each always sent (but
    `optional`), no other (what the contract test checks the answers against)."""
    return {"type": "object", "additionalProperties": False, "properties": properties,
            "required": [k for k in properties if k not in optional]}


INT, NUM, STR, BOOL = ({"type": t} for t in ("integer", "number", "string", "boolean"))
OR_NULL = {t: {"type": [t, "null"]} for t in ("integer", "number", "string", "boolean")}
TIME, TIME_OR_NULL = NUM, OR_NULL["number"]  # seconds since the epoch
# a run's or job's GPUs on each of its nodes: [[node, [gpu index, ...]], ...]
PARTS = {"type": "array", "items": {"type": "array", "minItems": 2, "maxItems": 2, "items": {
    "anyOf": [STR, {"type": "array", "items": INT}]}}}
STATES = [s.value for s in JobState]
TARGET = _object({"count": OR_NULL["integer"], "reason": STR, "text": STR, "capped": BOOL})
RUN = _object({
    "id": INT, "job_id": INT, "node": STR, "gpus": {"type": "array", "items": INT},
    "parts": PARTS, "devices": {"type": ["array", "null"], "items": STR}, "share": NUM,
    "role": OR_NULL["string"], "started_at": TIME, "ended_at": TIME_OR_NULL,
    "start_step": OR_NULL["number"], "end_step": OR_NULL["number"],
    "exit_code": OR_NULL["integer"], "end_reason": OR_NULL["string"],
    "pid": OR_NULL["integer"]})
JOB_VIEW_FIELDS = {
    "id": INT, "name": OR_NULL["string"], "model": OR_NULL["string"],
    "steps": OR_NULL["integer"], "state": {"enum": STATES},
    "role": {"description": "primary, standby...: its part in the policy now", **OR_NULL["string"]},
    "node": {"description": "its nodes, comma-separated, while it holds GPUs",
             **OR_NULL["string"]},
    "gpus": {"type": "array", "items": INT}, "parts": PARTS,
    "demand": OR_NULL["integer"],
    "want": {"description": "what it aims for and why (null once it has ended)",
             "anyOf": [TARGET, {"type": "null"}]},
    "nodes": INT, "nodes_min": {"description": "a node range's fewest (null: exactly `nodes`)",
                                **OR_NULL["integer"]},
    "retries": INT, "failures": INT, "not_before": TIME_OR_NULL, "malleable": BOOL,
    "gpus_request": {"anyOf": [{"const": "auto"}, INT]}, "step": NUM, "suspensions": INT,
    "after": {"type": "array", "items": INT},
    "command": {"type": "array", "items": STR}, "emulate": BOOL, "chdir": STR,
    "per_gpu": BOOL, "submitted_at": TIME, "started_at": TIME_OR_NULL,
    "finished_at": TIME_OR_NULL, "exit_code": OR_NULL["integer"], "reason": OR_NULL["string"],
    "rate": {"description": "steps per second", **OR_NULL["number"]},
    "rate_source": {"enum": ["measured", "profile", None]},
    "finish_at": TIME_OR_NULL, "eta_s": OR_NULL["number"]}
JOB_VIEW = _object(JOB_VIEW_FIELDS)
JOBS = _object({"jobs": {"type": "array", "items": _ref("JobView")},
                "next": {"description": "the `after` of the next page; null at the end",
                         **OR_NULL["integer"]}})
SUBMITTED = _object({"jobs": {"type": "array", "items": _object({
    **JOB_VIEW_FIELDS, "notes": {"type": "array", "items": STR}})}})
JOB_DETAIL = _object({
    **JOB_VIEW_FIELDS, "why": OR_NULL["string"], "runs": {"type": "array", "items": _ref("Run")},
    "events": {"type": "array", "items": _object({
        "at": TIME, "kind": STR, "run_id": OR_NULL["integer"],
        "data": {"type": ["object", "null"]}})},
    "reasons": {"type": "array", "items": STR}})
# queued jobs that the allocation can never hold (a larger one queued them): they stay queued
# for one that can, and the jobs behind them go on
CANNOT_RUN = {"description": "queued jobs this allocation can never hold, by id, and why: "
                             "they stay queued for an allocation that can",
              "type": "object", "additionalProperties": STR}
STATUS = _object({
    "pid": INT, "policy": STR, "profile": OR_NULL["string"],
    "nodes": {"type": "object", "additionalProperties": _object({
        "gpus": {"type": "array", "items": STR}, "free": {"type": "array", "items": INT}})},
    "jobs": {"description": "jobs by state", "type": "object",
             "propertyNames": {"enum": STATES}, "additionalProperties": INT},
    "draining": BOOL,
    "storage": {"description": "ok: the store takes writes; else `reason` (what to free) "
                               "and the writes `held`", **_object({
                                   "ok": BOOL, "reason": OR_NULL["string"], "held": INT})},
    "started_at": TIME, "time_scale": NUM, "max_request_bytes": INT,
    "max_jobs_per_request": INT, "cannot_run": CANNOT_RUN})
WAITED = _object({"ended": BOOL, "jobs": STATUS["properties"]["jobs"], "draining": BOOL,
                  "cannot_run": CANNOT_RUN})
LOG = _object({
    "job_id": INT, "state": {"enum": STATES}, "runs": {"type": "array", "items": INT},
    "run": {"anyOf": [_ref("Run"), {"type": "null"}]}, "stream": {"enum": ["stdout", "stderr"]},
    "offset": INT, "next_offset": INT, "size": INT, "text": STR})
RUNS = _object({"runs": {"type": "array", "items": _ref("Run")}, "started_at": TIME,
                "since": TIME_OR_NULL})
SINCE = {"name": "since", "in": "query",
         "description": "only what is unfinished, or ended at this Unix time (seconds) or later: "
                        "a window on a long history, as the dashboard asks",
         "schema": {"type": "number", "minimum": 0, "exclusiveMaximum": MAX_TIME}}


def parse_since(raw: str | None) -> float | None:
    """The `since` query parameter (SINCE): a Unix time in seconds; None when absent."""
    if raw is None:
        return None
    try:
        since = float(raw)
    except ValueError:
        since = -1.0
    if not 0 <= since < MAX_TIME:  # NaN and the infinities fail too
        raise Invalid("since must be a Unix time in seconds (e.g. 1795930000.5), 0 or more",
                      "since")
    return since
FORECAST = _object({
    "at": TIME, "finish_at": TIME_OR_NULL, "reason": OR_NULL["string"],
    "jobs": {"type": "array", "items": _object({"id": INT, "start_at": TIME,
                                                "end_at": TIME})},
    "left_out": {"type": "array", "items": _object({"id": INT, "why": STR})},
    "left_out_count": INT},
    optional=("left_out", "left_out_count"))
CURVES = _object({"profile": OR_NULL["string"], "learning": BOOL, "models": {
    "type": "array", "items": _object({
        "model": STR, "counts": {"type": "array", "items": _object({
            "gpus": INT, "profile": OR_NULL["number"], "measured": OR_NULL["number"],
            "samples": INT, "estimate": OR_NULL["number"],
            "source": {"enum": ["measured", "none", "profile", "scaled profile",
                                "corrected profile", "fitted"]}})},
        "profile_optimum": OR_NULL["integer"], "optimum": OR_NULL["integer"],
        "next_count": OR_NULL["integer"], "next_reason": TARGET, "startup_s": OR_NULL["number"],
        "suspend_s": OR_NULL["number"], "disagrees": OR_NULL["string"]})}})


# A job's environment (core/environment.py): in a job, or a request's for its jobs
ENVIRONMENT = {
    "export": {"enum": ["ALL", "NONE"], "default": "NONE",
               "description": "ALL: `env` is the job's whole environment (its "
                              "submitter's; `marble submit` sends it so by default); "
                              "NONE: the broker's environment, with `env` added. The "
                              "allocation's variables (SLURM_*, LSB_*...) come from "
                              "the broker either way (docs/environment.md)"},
    "env": {"type": "object", "maxProperties": MAX_ENV_VARS,
            "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$", "not": {"anyOf": [
                {"pattern": "^(" + "|".join((*BATCH_PREFIXES, "MARBLE_", "TORCHELASTIC_"))
                            + ")"},
                {"enum": sorted(RUN_VARS)}]}},
            "additionalProperties": {"type": "string", "pattern": "^[^\u0000]*$"},
            "description": "variables the job runs with; never those marbled or the "
                           "allocation sets (MARBLE_*, CUDA_VISIBLE_DEVICES, RANK..., "
                           f"SLURM_*...: 400); at most {MAX_ENV_BYTES} bytes in all"}}

DEPENDENCY = {"oneOf": [{"type": "integer", "minimum": 1},
                        {"type": "string", "minLength": 1, **NO_CONTROL}]}
@functools.cache
def _spec() -> dict:
    """The description, built once at its first use: the name pattern scans all of
    Unicode (0.1 s), which neither a broker's start nor an offline read should pay."""
    job = {
        "type": "object",
        "additionalProperties": False,
        "description": "Give either a `command` (a string, split into words as a shell does, or "
                       f"a list of words; at most {MAX_COMMAND_ARGS} words) or `emulate: true` "
                       "with `model` and `steps`; without a GPU count (`gpus` 'auto'), a `model`. "
                       "null is the same as leaving a field out.",
        # the rules between fields (JobSpec.from_mapping, size_job)
        "allOf": [
            {"oneOf": [
                {"title": "a job that runs a command", "required": ["command"], "properties": {
                    "command": {"anyOf": [
                        {"type": "string", "pattern": COMMAND_WORDS},
                        {"type": "array", "minItems": 1}]},
                    "emulate": {"const": False}}},
                {"title": "an emulated job", "required": ["emulate", "model", "steps"],
                 "properties": {
                     "emulate": {"const": True},
                     "command": {"anyOf": [{"type": "null"},
                                           {"type": "string", "pattern": NO_WORDS},
                                           {"type": "array", "maxItems": 0}]},
                     "model": {"type": "string"}, "steps": {"type": "integer"}}}]},
            {"anyOf": [{"required": ["gpus"], "properties": {"gpus": {"type": "integer"}}},
                       {"required": ["model"], "properties": {"model": {"type": "string"}}}]},
            {"not": {"title": "torchrun with per_gpu", "required": ["per_gpu", "command"],
                     "properties": {"per_gpu": {"const": True}, "command": {"anyOf": [
                         {"type": "string", "pattern": TORCHRUN_WORD},
                         {"type": "array", "prefixItems": [{"pattern": "(^|/)torchrun$"}]}]}}}},
        ],
        "properties": {
            "command": {"anyOf": [{"type": "null"}, {"type": "string", **NO_NUL},
                                  {"type": "array", "maxItems": MAX_COMMAND_ARGS,
                                   "items": {"type": "string", **NO_NUL}}]},
            "emulate": {"type": "boolean", "default": False},
            "model": {"type": ["string", "null"], "minLength": 1, "maxLength": MAX_MODEL,
                      "pattern": f"^[{MODEL_CHARS}]+$",
                      "description": "letters, digits and . _ + : / -; an alias or another "
                                     "spelling of a profile's model is recorded under the "
                                     "profile's name"},
            "new_model": {"type": "boolean", "default": False,
                          "description": "the model is meant to be one no profile knows: no "
                                         "note in the answer"},
            "steps": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_STEPS},
            "gpus": {"anyOf": [{"const": "auto"}, {"type": "null"},
                               {"type": "integer", "minimum": 1}],
                     "default": "auto"},
            "after": {"oneOf": [*DEPENDENCY["oneOf"], {"type": "array", "items": DEPENDENCY}],
                      "description": "earlier jobs, by id or name (the latest so named, in this "
                                     "request or before it); one that is not there, or not earlier "
                                     "(this job, a later one of the request), is a 404"},
            "name": {"type": ["string", "null"], "minLength": 1, "maxLength": MAX_NAME,
                     "pattern": _one_not_in(str.isdigit), **NO_CONTROL,
                     "description": "not only digits (it would read as a job id); one line of "
                                    "printable characters (a control character is refused, "
                                    "never changed)"},
            "nodes": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_NODES},
                                {"type": "string", "pattern": NODE_RANGE}],
                      "default": 1,
                      "description": "run `gpus` GPUs on each of this many nodes (one process "
                                     "per node; policies marble, adaptive and rigid), or a range "
                                     "'MIN-MAX' (MIN <= MAX): the GPUs of MAX nodes, on the "
                                     "fewest nodes in the range that divide them and have them "
                                     "free"},
            "retries": {"type": "integer", "minimum": 0, "maximum": MAX_RETRIES, "default": 0,
                        "description": "times a failed run is started again from its checkpoint, "
                                       "after a back-off that doubles each time"},
            "per_gpu": {"type": "boolean", "default": False,
                        "description": "one process (rank) per GPU of the run, each with RANK, "
                                       "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and its "
                                       "own CUDA_VISIBLE_DEVICES; not with torchrun (or python -m "
                                       "torch.distributed.run), which starts them itself"},
            "chdir": {"type": ["string", "null"], "maxLength": MAX_PATH, "pattern": "^/[^\u0000]*$",
                      "description": "the directory the job runs in: absolute (else 400), an "
                                     "existing directory on the broker's host (else 404; 409 if "
                                     "it cannot be entered); null: the broker's working "
                                     "directory. `marble submit` sends its own"},
            **ENVIRONMENT,
        },
    }

    return {
        "openapi": "3.1.0",
        "info": {"title": "marbled broker API", "version": "1",
                 "description": "JSON over the broker's Unix socket (state directory)."},
        # on the TCP listener (marbled --listen); the Unix socket checks the peer's uid instead
        "security": [{"token": []}],
        "paths": {
            "/v1/status": {"get": {"summary": "broker, nodes, free GPUs, job counts",
                                   "description": "also `max_request_bytes` (the largest body "
                                                  "POST /v1/jobs reads: a larger one is a 413) "
                                                  "and `max_jobs_per_request`: a client sends a "
                                                  "large job set in as many requests as they need",
                                   "responses": _answer("status", schema=_ref("Status"))}},
            "/v1/wait": {"get": {
                "summary": "wait until every job (or each `job` named) has ended, at most "
                           "`timeout` seconds: a long poll, answered as the last one ends "
                           "(`marble wait`)",
                "description": "`ended`: whether they have all ended (a job this "
                               "allocation can never hold counts as ended: it is in "
                               "`cannot_run`, with why); `jobs`: those waited "
                               "for by state (every job: as in /v1/status); a draining broker "
                               "answers at once (`draining`), with the jobs left for the next "
                               "broker",
                "parameters": [{"name": "timeout", "in": "query",
                                "description": "seconds to wait at most (0: answer at once)",
                                "schema": {"type": "number", "minimum": 0,
                                           "maximum": MAX_WAIT_S, "default": WAIT_S}},
                               {"name": "job", "in": "query", "style": "form", "explode": True,
                                "description": "only these jobs (repeat it: job=3&job=4; 404 "
                                               "for one that does not exist)",
                                "schema": {"type": "array", "maxItems": MAX_WAIT_JOBS,
                                           "items": {"type": "integer", "minimum": 1,
                                                     "maximum": MAX_JOB_ID}}}],
                "responses": _answer("ended, or the timeout passed", schema=_ref("Waited"))}},
            "/v1/jobs": {
                "get": {"summary": "jobs in FIFO order, all or a page: `next` is the `after` that "
                                   "continues the page, null at the end",
                        "parameters": [
                            {"name": "state", "in": "query", "style": "form", "explode": True,
                             "description": "only jobs in these states (repeat it: "
                                            "state=queued&state=running)",
                             "schema": {"type": "array", "items": {"enum": [
                                 "queued", "running", "suspending", "suspended", "done",
                                 "failed", "cancelled"]}}},
                            {"name": "name", "in": "query",
                             "description": "only jobs with this name (`marble show NAME` takes "
                                            "the last)",
                             "schema": {"type": "string", "minLength": 1, "maxLength": MAX_NAME}},
                            {"name": "limit", "in": "query",
                             "description": "at most this many jobs (all if absent)",
                             "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}},
                            {"name": "after", "in": "query",
                             "description": "only jobs with a greater id (the cursor: the last "
                                            "page's `next`)",
                             "schema": {"type": "integer", "minimum": 0, "maximum": MAX_JOB_ID}},
                            SINCE],
                        "responses": _answer("jobs", schema=_ref("Jobs"))},
                "post": {"summary": "submit one job, or {'jobs': [...]} all or none",
                         "requestBody": {"required": True, "content": {"application/json": {
                             "schema": {"oneOf": [
                                 {"$ref": "#/components/schemas/Job"},
                                 {"type": "object", "additionalProperties": False,
                                  "required": ["jobs"], "properties": {"jobs": {
                                      "type": "array", "minItems": 1, "maxItems": 10000,
                                      "items": {"$ref": "#/components/schemas/Job"}},
                                      # the environment of every job that gives none
                                      **ENVIRONMENT,
                                      "client_token": {
                                          **IDEMPOTENCY_KEY,
                                          "description": f"as the {IDEMPOTENCY_HEADER} header "
                                                         "(the same value if both are sent, else a "
                                                         "409)"}}}]}}}},
                         "parameters": [{
                             "name": IDEMPOTENCY_HEADER, "in": "header", "required": False,
                             "schema": IDEMPOTENCY_KEY,
                             "description": "a key new to each request (a UUID): a retry with the "
                                            "same key and the same jobs is answered 200 with the "
                                            "jobs the first request made (also while it is still "
                                            "being stored, and after a restart of the broker), and "
                                            "submits nothing; the same key with other jobs is a "
                                            "409"}],
                         "responses": {**_answer(
                             f"a retry (the same {IDEMPOTENCY_HEADER} and jobs): the jobs the "
                             "first request submitted, as they are now; header "
                             "Idempotent-Replayed: true", schema=_ref("Submitted")), **_answer(
                             "the accepted jobs, each with its `notes` (e.g. a model no profile "
                             "knows, and the profile's models it is close to)", "201",
                             ("404", "a job named in `after` does not exist"),
                             ("413", "a body over `max_request_bytes` (GET /v1/status; 4 MiB "
                                     "unless the broker's MARBLE_MAX_REQUEST_BYTES says "
                                     "otherwise)"),
                             ("415", "the body is not application/json"),
                             ("503", "the broker drains, has no GPUs or cannot write its store "
                                     "now (GET /v1/status: `storage`): submit to the next one, or "
                                     "again later"), schema=_ref("Submitted"))}},
            },
            "/v1/jobs/{job_id}": {"get": {"summary": "one job with its runs and events",
                                          "parameters": [JOB_ID],
                                          "responses": _answer("job", schema=_ref("JobDetail"))}},
            "/v1/jobs/{job_id}/log": {"get": {
                "summary": "a page of a run's output: {job_id, state, runs, run, stream, offset, "
                           "next_offset, size, text}; follow it by asking again from next_offset, "
                           "and on with the next of `runs` once `run` has ended and next_offset "
                           "is its size",
                "parameters": [
                    JOB_ID,
                    {"name": "stream", "in": "query", "description": "stdout (default) or stderr",
                     "schema": {"enum": list(LOG_STREAMS), "default": "stdout"}},
                    {"name": "run", "in": "query",
                     "description": "the run's id (as GET /v1/jobs/{id} lists its runs); by "
                                    "default the job's latest run. 404 if it is not this job's",
                     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_JOB_ID}},
                    {"name": "offset", "in": "query",
                     "description": "the byte to start at (a page's next_offset)",
                     "schema": {"type": "integer", "minimum": 0, "maximum": MAX_OFFSET,
                                "default": 0}},
                    {"name": "limit", "in": "query",
                     "description": f"at most this many bytes ({LOG_PAGE} by default, "
                                    f"{MAX_LOG_BYTES} with `tail`); a page cut short ends at a "
                                    "line's end",
                     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LOG_BYTES}},
                    {"name": "tail", "in": "query",
                     "description": "only the last N lines (within `limit` bytes, from `offset`)",
                     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LOG_LINES}},
                    {"name": "rank", "in": "query",
                     "description": "a per-GPU job's run: only this rank's lines, without their "
                                    "`[rank N] ` prefix (under Slurm, srun's `N: ` label; "
                                    "`offset`s stay the whole log's). 409 if "
                                    "the job is not per-GPU or the run has no such rank",
                     "schema": {"type": "integer", "minimum": 0, "maximum": MAX_RANK}}],
                "responses": _answer("the page", schema=_ref("LogPage"))}},
            "/v1/jobs/{job_id}/cancel": {"post": {"summary": "cancel a queued or running job",
                                                  "parameters": [JOB_ID],
                                                  "responses": _answer(
                                                      "requested (recorded: a broker that dies "
                                                      "before the job has stopped leaves the "
                                                      "cancel to the next)", "202",
                                                      ("503", "the broker cannot write its store "
                                                              "now (GET /v1/status: `storage`): "
                                                              "nothing was done; cancel again "
                                                              "later"),
                                                      schema=_requested("cancel"))}},
            "/v1/jobs/{job_id}/suspend": {"post": {"summary": "checkpoint a running job now",
                                                   "parameters": [JOB_ID],
                                                   "responses": _answer("requested", "202",
                                                                        schema=_requested("suspend"))}},
            "/v1/runs": {"get": {"summary": "every launch segment, or those of a window",
                                 "parameters": [SINCE],
                                 "responses": _answer("runs", schema=_ref("Runs"))}},
            "/v1/curves": {"get": {
                "summary": "each model's curve: the profile's, measured by runs, believed",
                "parameters": [{"name": "model", "in": "query", "schema": {
                    "type": "string", "pattern": f"^[{MODEL_CHARS}]+$"}}],
                "responses": _answer("curves", schema=_ref("Curves"))}},
            "/v1/forecast": {"get": {
                "summary": "when each unfinished job should start and end, and the queue with it "
                           "(the simulator from now; `reason` says why not, when it cannot); "
                           "`left_out`: [{id, why}] the jobs it cannot play (no curve, no step "
                           "count) and those waiting for them, the first 50 by id, and "
                           "`left_out_count` how many in all; a running job "
                           "ends, and the queue with it, no sooner than its own ETA (`finish_at` "
                           "of the job)",
                "responses": _answer("forecast", schema=_ref("Forecast"))}},
            "/v1/shutdown": {"post": {"summary": "suspend all running jobs and stop",
                                      "responses": _answer("started", "202", schema=_object({
                                          "shutdown": {"const": "started"}}))}},
            "/v1/openapi.json": {"get": {"summary": "this description",
                                         "responses": _answer("OpenAPI 3.1")}},
            "/metrics": {"get": {
                "summary": "Prometheus metrics: jobs by state, GPUs busy and idle per node, runs, "
                           "suspensions, acknowledgement and decision latencies, API errors",
                "responses": {
                    "200": {"description": "the Prometheus text exposition format",
                            "content": {"text/plain": {"schema": {"type": "string"}}}},
                    **{code: {"description": why,
                              "content": {"application/json": {"schema": ERROR}}}
                       for code, why in (("401", "TCP without the broker's token"),
                                         ("403", "another user"),
                                         ("404", "the broker keeps no metrics"))}}}},
        },
        "components": {"securitySchemes": {"token": {
            "type": "http", "scheme": "bearer",
            "description": "on the TCP listener: the token in STATE_DIR/token (new at every "
                           "start); on the Unix socket, none"}}, "schemas": {
            "Job": job,
            # the answers (daemon/views.py): every field, as the contract test checks
            "Status": STATUS, "JobView": JOB_VIEW, "Jobs": JOBS, "JobDetail": JOB_DETAIL,
            "Waited": WAITED, "Submitted": SUBMITTED, "Run": RUN, "Runs": RUNS, "LogPage": LOG,
            "Forecast": FORECAST, "Curves": CURVES,
            "Error": {"type": "object", "required": ["error", "retry"], "properties": {
                "error": {"type": "string", "description": "what to change"},
                "field": {"type": "string", "description": "the field at fault"},
                "retry": {"type": "boolean", "description": "true: not now (the same request "
                                                            "may succeed later); false: never"}}},
        }},
    }


def for_broker(node_gpus: int, nodes: int, models: list[str]) -> dict:
    """SPEC with one broker's limits, as it serves it: GPUs per node (its largest node), the
    nodes a job may span (1 under a single-node policy), and the models an emulated job may
    name (those with a curve; also matched by alias, ignoring case and punctuation)."""
    spec = copy.deepcopy(_spec())
    job = spec["components"]["schemas"]["Job"]
    next(s for s in job["properties"]["gpus"]["anyOf"]
         if s.get("type") == "integer")["maximum"] = node_gpus
    count, text = job["properties"]["nodes"]["anyOf"]
    count["maximum"] = nodes
    if nodes <= ENUMERATED_RANGES:  # what a pattern cannot say: MIN <= MAX <= the nodes
        text.pop("pattern")
        text["enum"] = [f"{a}-{b}" for b in range(1, nodes + 1) for a in range(1, b + 1)]
    emulated = next(s for s in job["allOf"][0]["oneOf"]
                    if s["properties"]["emulate"] == {"const": True})
    emulated["properties"]["model"] = {"enum": sorted(models)} if models else False
    return spec


def __getattr__(name: str):
    if name == "SPEC":  # the description without one broker's limits (docs, tests)
        return _spec()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
