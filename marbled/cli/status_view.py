"""`marble status`: what it asks the broker and what it prints, without click (the command
is `jobs.status`; `quick.py` runs it without importing click, as `marble status` polled
from a batch script or `watch` runs thousands of times)."""

from __future__ import annotations

from marbled.cli.common import eta_text, forecast_text, left_out_text
from marbled.core.shapes import gpus_text

UNFINISHED = ("queued", "running", "suspending", "suspended")
STATUS_LIMIT = 500  # jobs `marble status` lists by default: a page of GET /v1/jobs
FAILED_SHOWN = 5  # failed jobs `marble status` names under its table (the rest: --all)
GPUS_WIDTH = 12  # the GPUS column's, unless a multi-node run's node names need more


def status_doc(api, show_all: bool, limit: int) -> dict:
    """What `marble status` shows (its --json): the broker, a page of jobs (unfinished, or
    with `show_all` every one; `limit` 0: all), how many more, the failed ones named under
    the table, and the forecast. `api`: a client or a Reader (`get_many`: the three asked
    at once)."""
    query = [] if show_all else [f"state={s}" for s in UNFINISHED]
    if limit:
        query.append(f"limit={limit}")
    broker, page, forecast = api.get_many(
        ["/v1/status", "/v1/jobs" + ("?" + "&".join(query) if query else ""), "/v1/forecast"])
    jobs = page["jobs"]
    counted = _counted(broker, show_all)
    more = max(sum(counted.values()) - len(jobs), 0) if page.get("next") is not None else 0
    failed = [] if show_all or not broker["jobs"].get("failed") else \
        api.get(f"/v1/jobs?state=failed&limit={FAILED_SHOWN}")["jobs"]
    ended = {s: n for s, n in broker["jobs"].items() if s not in UNFINISHED}
    return {"broker": broker, "jobs": jobs, "more": more, "forecast": forecast,
            "ended": ended, "failed": failed}


def _counted(broker: dict, show_all: bool) -> dict[str, int]:
    return broker["jobs"] if show_all else \
        {s: n for s, n in broker["jobs"].items() if s in UNFINISHED}


def status_lines(doc: dict, show_all: bool) -> list[str]:
    """`marble status`'s text of `status_doc`'s document."""
    broker, jobs, forecast = doc["broker"], doc["jobs"], doc["forecast"]
    nodes = "; ".join(f"{n}: {len(v['free'])}/{gpus_text(len(v['gpus']))} free"
                      if v["free"] is not None else f"{n}: {gpus_text(len(v['gpus']))}"
                      for n, v in broker["nodes"].items())  # free: None, no broker
    lines = [f"marbled {broker['pid']} policy={broker['policy']} "
             f"profile={broker['profile']} {nodes}" + (" DRAINING" if broker["draining"] else "")]
    if storage_text(broker.get("storage")):
        lines.append(storage_text(broker["storage"]))
    ends = {f["id"]: f["end_at"] for f in forecast["jobs"]}
    width = max([GPUS_WIDTH, *(len(gpus_cell(j)) for j in jobs)])
    lines += [header(width), *(job_row(j, forecast, ends, width) for j in jobs)]
    if doc["more"]:
        counted = _counted(broker, show_all)
        lines.append(f"... and {doc['more']} more "
                     f"({', '.join(f'{n} {s}' for s, n in counted.items())}"
                     " in all; --limit 0 lists every one)")
    if not show_all:
        lines += ended_text(broker["jobs"], doc["failed"])
    lines += [f"job {j} cannot run in this allocation: {why}"  # a larger one queued it
              for j, why in broker.get("cannot_run", {}).items()]
    return lines + [t for t in (forecast_text(forecast), left_out_text(forecast)) if t]


def header(gpus_width: int = GPUS_WIDTH) -> str:
    return (f"{'ID':>5} {'NAME':<20} {'MODEL':<14} {'STATE':<10} {'ROLE':<9} {'WANT':>4} "
            f"{'GPUS':<{gpus_width}} {'STEP':>12} {'STEPS/S':>8} {'ETA':>7} {'SUSP':>4}")


def gpus_cell(j: dict) -> str:
    """The GPUS column: the GPU slots of a job's run ('0,1'), each node's behind its name on
    several nodes, as Slurm names nodes ('n1:0,1 n2:0,1'); '-' for a job without a run."""
    parts = j.get("parts")
    if parts is None and j.get("node") and "," in j["node"]:  # a broker without "parts"
        nodes = j["node"].split(",")
        each = len(j["gpus"]) // len(nodes)
        parts = [(n, j["gpus"][i * each:(i + 1) * each]) for i, n in enumerate(nodes)]
    if parts and len(parts) > 1:
        return " ".join(f"{node}:{','.join(map(str, gpus))}" for node, gpus in parts)
    return ",".join(map(str, j["gpus"])) or "-"


def job_row(j: dict, forecast: dict, ends: dict | None = None,
            gpus_width: int = GPUS_WIDTH) -> str:
    steps = f"{j['step']}/{j['steps']}" if j["steps"] else str(j["step"] or "-")
    gpus = gpus_cell(j)
    label = j["name"] or j["model"] or " ".join(j["command"])[:20]
    rate = f"{j['rate']:.3g}" if j.get("rate") else "-"
    eta = eta_text(j, forecast, ends)
    return (f"{j['id']:>5} {label[:20]:<20} {(j['model'] or '-')[:14]:<14} {j['state']:<10} "
            f"{(j['role'] or '-'):<9} {j['demand']:>4} {gpus:<{gpus_width}} {steps:>12} {rate:>8} "
            f"{eta:>7} {j['suspensions']:>4}")


def ended_text(counts: dict[str, int], failed: list[dict]) -> list[str]:
    """The jobs that ended since the broker started, under `marble status`'s table: each
    failed one (up to FAILED_SHOWN) with its reason, and a count of the rest, as squeue
    users look for them (`sacct`, `hq job list --filter failed`)."""
    lines = []
    for j in failed:
        label = f" ({j['name']})" if j["name"] else ""
        lines.append(f"job {j['id']}{label} failed: {(j['reason'] or 'no reason')[:120]}")
    ended = [f"{counts[s]} {s}" for s in ("failed", "cancelled", "done") if counts.get(s)]
    if ended:
        # Worded so that no line under the table starts with a number, as a job's row does
        lines.append("ended since the broker started: " + ", ".join(ended)
                     + " (marble status --all lists them, marble explain JOB says why)")
    return lines


def storage_text(storage: dict | None) -> str:
    """What `status` says while the broker's store refuses writes (lifecycle I4); "" while
    it takes them."""
    if not storage or storage.get("ok", True):
        return ""
    return (f"STORAGE: {storage.get('reason') or 'the state directory refuses writes'}; "
            f"{storage.get('held', 0)} write(s) held in memory, written once it takes them "
            "again. Running jobs go on; submissions are refused (503) meanwhile.")
