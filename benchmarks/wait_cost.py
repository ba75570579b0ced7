"""What `marble wait` costs a broker that has seen many jobs, and how late it returns.

A fresh broker (`marbled --gpus 6`, policy marble, emulated GPUs) runs N `true` jobs (in
batches of 1,000) to their end. Then, on that state:

1. `GET /v1/jobs` (every job), timed with the broker's CPU for it;
2. `marble wait --quiet` on the ended state (every job done): wall time, broker CPU;
3. `marble wait --quiet --interval I` (I = 30 s: the batch scripts' default) started
   with 600 `sleep 0.05` jobs: wall time, how long after the last run's end it returned,
   the broker's CPU meanwhile.

The client runs as a user's does (`python -m marbled.cli.client_cmd`, one process), so
`PYTHONPATH=<other tree>` measures another tree with this script.

    .venv/bin/python benchmarks/wait_cost.py [--jobs 20000] [--interval 30] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # benchmarks.*

from benchmarks.end_to_end import FINAL, cpu_seconds, start_broker  # noqa: E402
from marbled.cli.client import BrokerClient  # noqa: E402
from marbled.paths import DB_NAME, socket_path  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20_000, help="jobs run before the waits")
    ap.add_argument("--interval", type=float, default=30.0,
                    help="marble wait --interval in part 3 (the batch scripts' default)")
    ap.add_argument("--calls", type=int, default=5, help="calls timed in parts 1 and 2")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    state = Path(tempfile.mkdtemp(prefix="marble-wait-")) / "state"
    proc = start_broker(state, "marble", 6, 1.0)
    api = BrokerClient(socket_path(state), timeout=300)
    env = {**os.environ, "MARBLE_STATE_DIR": str(state)}
    marble = [sys.executable, "-m", "marbled.cli.client_cmd"]
    out: dict = {"jobs": args.jobs}
    try:
        began = time.time()
        for k in range(0, args.jobs, 1000):
            api.post("/v1/jobs", {"jobs": [{"gpus": 1, "command": ["true"]}]
                                  * min(1000, args.jobs - k)})
        while any(n for s, n in api.get("/v1/status")["jobs"].items() if s not in FINAL):
            time.sleep(0.5)
        out["run_s"] = round(time.time() - began, 1)

        def timed(call) -> tuple[float, float]:
            cpu, t = cpu_seconds(proc.pid), time.perf_counter()
            call()
            return 1000 * (time.perf_counter() - t), 1000 * (cpu_seconds(proc.pid) - cpu)

        for name, call in (
                ("get_jobs", lambda: api.get("/v1/jobs")),
                ("wait_ended", lambda: subprocess.run([*marble, "wait", "--quiet"], env=env,
                                                      check=True, capture_output=True))):
            walls, cpus = zip(*(timed(call) for _ in range(args.calls)), strict=True)
            out[name] = {"p50_ms": round(statistics.median(walls), 1),
                         "broker_cpu_p50_ms": round(statistics.median(cpus), 1)}

        api.post("/v1/jobs", {"jobs": [{"gpus": 1, "command": ["sleep", "0.05"]}] * 600})
        cpu, t = cpu_seconds(proc.pid), time.time()
        subprocess.run([*marble, "wait", "--quiet", "--interval", f"{args.interval:g}"],
                       env=env, check=True, capture_output=True)
        returned = time.time()
        with sqlite3.connect(state / DB_NAME) as con:
            last_end = con.execute("SELECT max(ended_at) FROM runs").fetchone()[0]
        out["wait_through_600"] = {
            "interval_s": args.interval, "wall_s": round(returned - t, 2),
            "after_last_end_ms": round(1000 * (returned - last_end), 1),
            "broker_cpu_s": round(cpu_seconds(proc.pid) - cpu, 2)}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(f"{args.jobs} jobs run in {out['run_s']} s")
    print(f"GET /v1/jobs (every job): p50 {out['get_jobs']['p50_ms']} ms, broker CPU "
          f"{out['get_jobs']['broker_cpu_p50_ms']} ms")
    print(f"marble wait, every job ended: p50 {out['wait_ended']['p50_ms']} ms, broker CPU "
          f"{out['wait_ended']['broker_cpu_p50_ms']} ms")
    w = out["wait_through_600"]
    print(f"marble wait --interval {w['interval_s']:g} through 600 `sleep 0.05`: {w['wall_s']} s,"
          f" returned {w['after_last_end_ms']} ms after the last end, broker CPU "
          f"{w['broker_cpu_s']} s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
