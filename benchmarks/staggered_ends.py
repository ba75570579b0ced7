"""Runs that end a few ms apart, in a real daemon: one decision, or a reshape at each end?
(issue 21, coalesced wakes)

Five short jobs and a long one submitted together to `marbled --policy adaptive --no-learn`
on 6 emulated GPUs (time scale 0.01, real processes): the short jobs run three at a time on
2 GPUs each, the long one waits; the first three end some 20-40 ms apart (their processes
started a few ms apart), where the simulator has them end at one instant. Each end that is
a decision of its own starts a short job on the GPUs it frees and reshapes it, or the long
job, at the next. Printed per repeat and in total: the runs (launches) and suspensions per
job, the long job's runs suspended at step 0, and how long after an end its decision came
(a run's end to the next run's start, median and max), for jobs given as `--emulate` jobs
and as plain commands (the emulator run as the job's own command).

    .venv/bin/python benchmarks/staggered_ends.py [--repeats 5] [--kind emulate|command] [--json F]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from marbled.cli.client import BrokerClient
from marbled.demo import start_broker
from marbled.paths import DB_NAME, socket_path

SCALE = 0.01
LONG = {"model": "inception-v3", "steps": 3000}
SHORT = {"model": "resnet-50", "steps": 400}


def as_command(job: dict) -> dict:
    """The same job as a plain command: the emulator is its program, the broker knows only
    its model and steps."""
    return {**job, "command": [sys.executable, "-m", "marbled.worker.emulate", "--model",
                               job["model"], "--steps", str(job["steps"]),
                               "--time-scale", repr(SCALE)]}


def one(state: Path, kind: str) -> dict:
    proc = start_broker(state, "adaptive", 6, SCALE, ("--no-learn",))
    try:
        client = BrokerClient(socket_path(state))
        jobs = [*[SHORT] * 5, LONG]
        jobs = [{**j, "emulate": True} for j in jobs] if kind == "emulate" else \
            [as_command(j) for j in jobs]
        client.post("/v1/jobs", {"jobs": jobs})
        deadline = time.monotonic() + 180
        while any(j["state"] not in ("done", "failed", "cancelled")
                  for j in client.get("/v1/jobs")["jobs"]):
            if time.monotonic() > deadline:
                raise SystemExit(f"{kind}: jobs not done after 180 s; see {state}")
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    con = sqlite3.connect(state / DB_NAME)
    con.row_factory = sqlite3.Row
    runs = con.execute("SELECT * FROM runs ORDER BY started_at, id").fetchall()
    con.close()
    per_job: dict[int, list] = {}
    for r in runs:
        per_job.setdefault(r["job_id"], []).append(r)
    ends = sorted(r["ended_at"] for r in runs if r["ended_at"] is not None)
    starts = sorted(r["started_at"] for r in runs)
    # the decision that followed an end: the first run started after it (within 2 s)
    waits = [min(s for s in starts if s >= e) - e for e in ends
             if any(e <= s < e + 2 for s in starts)]
    long = per_job[max(per_job)]
    return {"kind": kind, "runs": {j: [r["gpu_count"] for r in rs] for j, rs in per_job.items()},
            "launches": len(runs), "suspensions": sum(r["end_reason"] == "suspended"
                                                      for r in runs),
            "long_at_step_0": sum(r["end_reason"] == "suspended" and not r["end_step"]
                                  for r in long),
            "decision_after_end_ms": [round(w * 1000, 1) for w in waits]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--kind", action="append", choices=("emulate", "command"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kind or ("emulate", "command"):
            for i in range(args.repeats):
                r = one(Path(tmp) / f"{kind}{i}", kind)
                out.append(r)
                print(f"{kind:<8} GPUs per run {r['runs']}  launches {r['launches']}  "
                      f"suspensions {r['suspensions']}  long at step 0 {r['long_at_step_0']}",
                      flush=True)
    print(f"\n{'kind':<8} {'launches/job':>13} {'suspensions/job':>16} {'step-0':>7} "
          f"{'end->decision ms median':>24} {'max':>6}")
    for kind in args.kind or ("emulate", "command"):
        rows = [r for r in out if r["kind"] == kind]
        waits = [w for r in rows for w in r["decision_after_end_ms"]]
        print(f"{kind:<8} {statistics.mean(r['launches'] for r in rows) / 6:>13.2f} "
              f"{statistics.mean(r['suspensions'] for r in rows) / 6:>16.2f} "
              f"{sum(r['long_at_step_0'] for r in rows):>7} "
              f"{statistics.median(waits):>24.1f} {max(waits):>6.1f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
