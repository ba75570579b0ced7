"""`marble cancel` and `marble suspend` of jobs by id or name: the requests and what they
print, without click (the commands are `jobs.cancel` and `jobs.suspend`; `quick.py` runs
`marble cancel JOB...` without importing click)."""

from __future__ import annotations

from marbled.cli.client import ApiError, BrokerClient
from marbled.cli.common import named_id, no_such_name


def ask(api: BrokerClient, refs: list[str], what: str) -> dict:
    """POST /v1/jobs/ID/`what` for each job of `refs` (an id, or a name: the last job so
    named, as --after reads it): every one it can; each one refused, or a name no job has,
    with the broker's reason. BrokerUnreachable if the broker stops answering."""
    results = []
    for ref in refs:
        result: dict = {"job": ref, "id": None, "ok": False}
        try:
            result["id"] = named_id(api, ref)
            if result["id"] is None:
                raise ApiError(404, no_such_name(ref), "name")
            api.post(f"/v1/jobs/{result['id']}/{what}")
            result["ok"] = True
        except ApiError as exc:
            result.update(status=exc.status, error=str(exc))
        results.append(result)
    return {"requested": [{"id": r["id"], what: "requested"} for r in results if r["ok"]],
            "results": results, "failed": sum(not r["ok"] for r in results)}


def ask_lines(doc: dict, what: str, summary_only: bool) -> list[tuple[str, bool]]:
    """What `ask`'s outcome prints: (line, whether it goes to stderr). With `summary_only`
    (--all, --state) a count instead of a line per job."""
    results = doc["results"]
    failed = [r for r in results if not r["ok"]]
    done = len(results) - len(failed)
    lines = [] if summary_only else \
        [(f"{what} requested for job {r['id']}", False) for r in results if r["ok"]]
    for r in failed:
        # the broker's reason names the job by its id; a name is said first
        label = "" if r["job"] == str(r["id"]) else f"{r['job']}: "
        lines.append((f"marble {what}: {label}{r['error']}", True))
    if summary_only or failed:
        line = f"{what} requested for {done} job{'' if done == 1 else 's'}"
        if failed:
            line += (f"; {len(failed)} could not be: "
                     + "; ".join(r["error"] for r in failed[:3])
                     + ("; ..." if len(failed) > 3 else ""))
        lines.append((line, bool(failed)))
    return lines
