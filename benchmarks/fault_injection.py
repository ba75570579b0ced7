"""Kill the broker (SIGKILL) at random moments while it runs a job set, and check afterwards.

A broker on 6 emulated GPUs runs paper job sets 2 and 3 as emulated jobs that log
every step they train. After a random time the broker is killed with SIGKILL and
a new one is started on the same state directory, --kills times; the last one
runs the queue to its end. Then, from the step logs and the broker's database:

  * every job is done at exactly its steps, and trained every step once
    (none lost, none repeated);
  * no job ever had two runs at once, and no GPU was held by two runs at once;
  * every run records its end step, each of a job's runs starts where the one before
    ended, the last ends at the job's steps, and no run is launched with nothing to
    train (`run_chain`);
  * no run is left open, and PRAGMA integrity_check is ok.

    .venv/bin/python benchmarks/fault_injection.py [--kills 300] [--seed 1 [2 ...]]
        [--time-scale 0.2] [--max-gap 0.8]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from marbled.cli.client import BrokerClient
from marbled.demo import start_broker
from marbled.paths import DB_NAME, socket_path
from marbled.resources import load_job_file, workload_path

FINAL = {"done", "failed", "cancelled"}


@dataclass
class ChaosResult:
    kills: int = 0  # kills while jobs were unfinished
    restarts: list[float] = field(default_factory=list)  # seconds until a new broker serves
    adopted: int = 0
    runs: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0


def workload(logs: Path, time_scale: float) -> list[dict]:
    jobs = []
    for n in (3, 2):
        for spec in load_job_file(workload_path(f"paper-jobset{n}")):
            log = logs / f"job{len(jobs) + 1}.steps"
            jobs.append({"model": spec.model, "steps": spec.steps, "command": [
                sys.executable, "-m", "marbled.worker.emulate", "--time-scale", str(time_scale),
                "--step-log", str(log)]})
    return jobs


def start(state: Path, time_scale: float) -> tuple[subprocess.Popen, float]:
    """A broker on the state directory; how long it took to serve."""
    t0 = time.monotonic()
    return start_broker(state, "marble", 6, time_scale), time.monotonic() - t0


def unfinished(state: Path) -> int:
    con = sqlite3.connect(state / DB_NAME)
    try:
        return con.execute("SELECT count(*) FROM jobs WHERE state NOT IN "
                           "('done', 'failed', 'cancelled')").fetchone()[0]
    finally:
        con.close()


def chaos(state: Path, kills: int, seed: int = 0, time_scale: float = 0.02,
          gap: tuple[float, float] = (0.05, 0.8)) -> ChaosResult:
    """Run the workload through `kills` SIGKILLed brokers, then check it (ChaosResult)."""
    rng = random.Random(seed)
    state.mkdir(parents=True, exist_ok=True)
    logs = state.parent / "steps"
    logs.mkdir(exist_ok=True)
    jobs = workload(logs, time_scale)
    result = ChaosResult()
    t0 = time.monotonic()
    proc, _ = start(state, time_scale)
    BrokerClient(socket_path(state)).post("/v1/jobs", {"jobs": jobs})
    while result.kills < kills:
        time.sleep(rng.uniform(*gap))
        if unfinished(state) == 0:
            break  # the queue ended first: a longer workload or shorter gaps are needed
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        result.kills += 1
        proc, took = start(state, time_scale)
        result.restarts.append(took)
    client = BrokerClient(socket_path(state))
    deadline = time.monotonic() + 600
    while any(j["state"] not in FINAL for j in client.get("/v1/jobs")["jobs"]):
        if time.monotonic() > deadline:
            result.violations.append("jobs not finished 600 s after the last kill")
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    result.seconds = time.monotonic() - t0
    check(state, jobs, logs, result)
    return result


def check(state: Path, jobs: list[dict], logs: Path, result: ChaosResult) -> None:
    v = result.violations
    con = sqlite3.connect(state / DB_NAME)
    con.row_factory = sqlite3.Row
    rows = {r["id"]: r for r in con.execute("SELECT * FROM jobs")}
    runs = list(con.execute("SELECT * FROM runs ORDER BY id"))
    result.runs = len(runs)
    result.adopted = con.execute("SELECT count(*) FROM events WHERE kind = 'adopted'"
                                 ).fetchone()[0]
    for job_id, job in enumerate(jobs, start=1):
        row = rows.get(job_id)
        if row is None or (row["state"], row["step"]) != ("done", job["steps"]):
            v.append(f"job {job_id}: {dict(row) if row else 'missing'}, "
                     f"expected done at {job['steps']}")
        steps = [int(s) for s in (logs / f"job{job_id}.steps").read_text().split()]
        if sorted(steps) != list(range(1, job["steps"] + 1)):
            repeated = len(steps) - len(set(steps))
            missing = job["steps"] - len(set(steps) & set(range(1, job["steps"] + 1)))
            v.append(f"job {job_id}: {repeated} steps trained twice, {missing} never")
    fell_back = {r[0] for r in con.execute(
        "SELECT run_id FROM events WHERE kind = 'checkpoint-fallback'")}
    for job_id, job in enumerate(jobs, start=1):
        v += run_chain(job_id, job["steps"], [r for r in runs if r["job_id"] == job_id],
                       fell_back)
    for a in runs:
        if a["ended_at"] is None:
            v.append(f"run {a['id']} still open")
            continue
        for b in runs:
            if b["id"] <= a["id"] or b["ended_at"] is None:
                continue
            together = a["started_at"] < b["ended_at"] and b["started_at"] < a["ended_at"]
            if together and a["job_id"] == b["job_id"]:
                v.append(f"job {a['job_id']}: runs {a['id']} and {b['id']} at once")
            if together and a["node"] == b["node"] and \
                    set(a["gpu_ids"].split(",")) & set(b["gpu_ids"].split(",")):
                v.append(f"runs {a['id']} and {b['id']} shared GPUs")
    integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
    if integrity != "ok":
        v.append(f"integrity_check: {integrity}")
    con.close()


def run_chain(job_id: int, steps: int, runs: list, fell_back: set[int]) -> list[str]:
    """What is wrong with a job's run records: every run has its end step; each starts
    where the one before ended -- or earlier, after a failed run or one that resumed from
    an older checkpoint than expected (`checkpoint-fallback`), whose steps since its
    checkpoint are trained again; the first starts at 0 and the last ends at the job's
    steps (so the steps of its runs sum to its steps, less what was trained again); and no
    run is launched at the job's last step (a relaunch that trains nothing)."""
    v = []
    before = None
    for run in runs:
        name = f"job {job_id} run {run['id']}"
        start, end = run["start_step"], run["end_step"]
        if end is None:
            v.append(f"{name}: {run['end_reason']} with no end step")
        if start is not None and start >= steps:
            v.append(f"{name}: launched at step {start} of {steps}, with nothing to train")
        expected = before["end_step"] if before is not None else 0
        may_lose = before is not None and (before["end_reason"] == "failed"
                                           or run["id"] in fell_back)
        if None not in (start, expected) and not (
                start == expected or (may_lose and start < expected)):
            v.append(f"{name}: starts at step {start}, its run before ended at {expected}")
        before = run
    last = before["end_step"] if before is not None else None
    if last != steps:
        v.append(f"job {job_id}: its last run ended at step {last}, not {steps}")
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=300)
    ap.add_argument("--seed", type=int, nargs="+", default=[1],
                    help="one schedule of kills per seed, each on a new state directory")
    ap.add_argument("--time-scale", type=float, default=0.2,
                    help="slower jobs leave room for more kills before the queue ends")
    ap.add_argument("--max-gap", type=float, default=0.8,
                    help="seconds between kills: uniform from 0.05 to this")
    args = ap.parse_args()
    summaries = []
    for seed in args.seed:
        with tempfile.TemporaryDirectory(prefix="marble-chaos-") as tmp:
            r = chaos(Path(tmp) / "state", args.kills, seed, args.time_scale,
                      (0.05, args.max_gap))
        summaries.append({
            "seed": seed, "kills": r.kills, "runs": r.runs, "adopted": r.adopted,
            "seconds": round(r.seconds, 1),
            "restart_median_s": round(statistics.median(r.restarts), 3) if r.restarts else None,
            "restart_max_s": round(max(r.restarts), 3) if r.restarts else None,
            "violations": r.violations,
        })
        print(json.dumps(summaries[-1], indent=1), flush=True)
    sys.exit(1 if any(s["violations"] for s in summaries) else 0)


if __name__ == "__main__":
    os.environ.pop("MARBLE_STATE_DIR", None)
    main()
