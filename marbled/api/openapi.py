"""The OpenAPI 3 description of the broker's API, served at GET /v1/openapi.json."""

from __future__ import annotations

from marbled.core.spec import MAX_NAME, MAX_NODES, MAX_RETRIES, MAX_STEPS

ERROR = {"$ref": "#/components/schemas/Error"}
JOB_ID = {"name": "job_id", "in": "path", "required": True,
          "schema": {"type": "integer", "minimum": 1}}


def _answer(description: str, status: str = "200", *more: tuple[str, str]) -> dict:
    errors = {code: {"description": why, "content": {"application/json": {"schema": ERROR}}}
              for code, why in (("400", "bad input; `error` says what to change"),
                                ("403", "another user"), ("404", "no such job"),
                                ("409", "not in this job's state (`retry`: whether it may be "
                                        "later)"), *more)}
    return {status: {"description": description,
                     "content": {"application/json": {"schema": {"type": "object"}}}},
            **errors}


JOB = {
    "type": "object",
    "additionalProperties": False,
    "description": "Give either `command` or `emulate: true` (with model and steps).",
    "properties": {
        "command": {"oneOf": [{"type": "string"},
                              {"type": "array", "items": {"type": "string"}}]},
        "emulate": {"type": "boolean", "default": False},
        "model": {"type": "string", "minLength": 1},
        "steps": {"type": "integer", "minimum": 1, "maximum": MAX_STEPS},
        "gpus": {"oneOf": [{"const": "auto"}, {"type": "integer", "minimum": 1}],
                 "default": "auto"},
        "after": {"oneOf": [{"type": "integer", "minimum": 1}, {"type": "string"},
                            {"type": "array", "items": {"oneOf": [
                                {"type": "integer", "minimum": 1}, {"type": "string"}]}}]},
        "name": {"type": "string", "minLength": 1, "maxLength": MAX_NAME},
        "nodes": {"type": "integer", "minimum": 1, "maximum": MAX_NODES, "default": 1,
                  "description": "run `gpus` GPUs on each of this many nodes (one process "
                                 "per node; policies marble and rigid)"},
        "retries": {"type": "integer", "minimum": 0, "maximum": MAX_RETRIES, "default": 0,
                    "description": "times a failed run is started again from its checkpoint, "
                                   "after a back-off that doubles each time"},
    },
}

SPEC = {
    "openapi": "3.1.0",
    "info": {"title": "marbled broker API", "version": "1",
             "description": "JSON over the broker's Unix socket (state directory)."},
    "paths": {
        "/v1/status": {"get": {"summary": "broker, nodes, free GPUs, job counts",
                               "responses": _answer("status")}},
        "/v1/jobs": {
            "get": {"summary": "all jobs in FIFO order",
                    "parameters": [{"name": "state", "in": "query", "schema": {"enum": [
                        "queued", "running", "suspending", "suspended", "done", "failed",
                        "cancelled"]}}],
                    "responses": _answer("jobs")},
            "post": {"summary": "submit one job, or {'jobs': [...]} all or none",
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"oneOf": [
                             {"$ref": "#/components/schemas/Job"},
                             {"type": "object", "additionalProperties": False,
                              "required": ["jobs"], "properties": {"jobs": {
                                  "type": "array", "minItems": 1, "maxItems": 10000,
                                  "items": {"$ref": "#/components/schemas/Job"}}}}]}}}},
                     "responses": _answer(
                         "the accepted jobs", "201", ("413", "more than 10,000 jobs or 4 MiB"),
                         ("415", "the body is not application/json"),
                         ("503", "the broker drains or has no GPUs: submit to the next one"))},
        },
        "/v1/jobs/{job_id}": {"get": {"summary": "one job with its runs and events",
                                      "parameters": [JOB_ID], "responses": _answer("job")}},
        "/v1/jobs/{job_id}/cancel": {"post": {"summary": "cancel a queued or running job",
                                              "parameters": [JOB_ID],
                                              "responses": _answer("requested", "202")}},
        "/v1/jobs/{job_id}/suspend": {"post": {"summary": "checkpoint a running job now",
                                               "parameters": [JOB_ID],
                                               "responses": _answer("requested", "202")}},
        "/v1/runs": {"get": {"summary": "every launch segment", "responses": _answer("runs")}},
        "/v1/curves": {"get": {
            "summary": "each model's curve: the profile's, measured by runs, believed",
            "parameters": [{"name": "model", "in": "query", "schema": {
                "type": "string", "minLength": 1, "pattern": "\\S"}}],
            "responses": _answer("curves")}},
        "/v1/shutdown": {"post": {"summary": "suspend all running jobs and stop",
                                  "responses": _answer("started", "202")}},
        "/v1/openapi.json": {"get": {"summary": "this description",
                                     "responses": _answer("OpenAPI 3.1")}},
    },
    "components": {"schemas": {
        "Job": JOB,
        "Error": {"type": "object", "required": ["error", "retry"], "properties": {
            "error": {"type": "string", "description": "what to change"},
            "field": {"type": "string", "description": "the field at fault"},
            "retry": {"type": "boolean", "description": "true: not now (the same request "
                                                        "may succeed later); false: never"}}},
    }},
}
