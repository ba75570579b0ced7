"""A large job file: `marble submit --file` of a 50,000-job hyper-parameter sweep.

Generates the sweep (one model, each job its own name and arguments; every tenth job
runs `after` the one before it, by name, so dependencies cross the requests' bounds)
into a temporary directory, starts a real broker (`marbled --gpus 6`, policy marble)
whose GPUs are held by one job so that nothing submitted starts, runs `marble submit
--file` on it, and prints:

  parse     the client's parse of the file (read_job_file, in this process)
  wall      the whole `marble submit` process: parse, requests, answers
  jobs/s    jobs accepted per second of wall time
  requests  POST /v1/jobs requests the broker answered (its `requests` table: one row
            per Idempotency-Key, one key per request)

    .venv/bin/python benchmarks/submit_large.py [--jobs 50000] [--json F]
    .venv/bin/python benchmarks/submit_large.py --parse-only   # no broker
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from marbled.cli.client import BrokerClient
from marbled.demo import start_broker
from marbled.paths import DB_NAME, socket_path

HOLDER = {"gpus": 6, "command": ["sleep", "100000"], "name": "holder"}
LEARNING_RATES = ("0.1", "0.03", "0.01", "0.003", "0.001")


def sweep_file(path: Path, jobs: int) -> Path:
    """A sweep of `jobs` jobs: resnet-50 with varying learning rate, batch size and seed."""
    lines = []
    for i in range(jobs):
        lines.append(f"- name: sweep-{i:05d}\n  model: resnet-50\n  gpus: 1\n  steps: 1000\n"
                     f"  command: [python, train.py, --lr, '{LEARNING_RATES[i % 5]}', "
                     f"--batch, '{32 << (i % 4)}', --seed, '{i}']\n"
                     + (f"  after: sweep-{i - 1:05d}\n" if i % 10 == 9 else ""))
    path.write_text("".join(lines))
    return path


def parse_seconds(path: Path) -> float:
    from marbled.resources import read_job_file

    t0 = time.perf_counter()
    read_job_file(path)
    return time.perf_counter() - t0


def run(jobs: int, parse_only: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="marble-large-") as tmp_name:
        tmp = Path(tmp_name)
        path = sweep_file(tmp / "sweep.yaml", jobs)
        out: dict = {"jobs": jobs, "file_bytes": path.stat().st_size,
                     "parse_s": round(parse_seconds(path), 2)}
        if parse_only:
            return out
        state = tmp / "state"
        proc = start_broker(state, "marble", 6, 1.0)
        try:
            BrokerClient(socket_path(state)).post("/v1/jobs", HOLDER)
            t0 = time.perf_counter()
            done = subprocess.run(  # its text answer, as a user reads it (not --json)
                [sys.executable, "-m", "marbled.cli.client_cmd", "submit", "--file", str(path)],
                env={**os.environ, "MARBLE_STATE_DIR": str(state)}, capture_output=True,
                text=True)
            wall = time.perf_counter() - t0
            if done.returncode != 0:
                raise SystemExit(f"marble submit failed ({done.returncode}): {done.stderr}")
            accepted = done.stdout.count("submitted job ")
            con = sqlite3.connect(state / DB_NAME)
            try:
                stored = con.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] - 1
                requests = con.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
            finally:
                con.close()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        out.update({"accepted": accepted, "stored": stored, "wall_s": round(wall, 2),
                    "jobs_per_s": round(accepted / wall), "requests": requests,
                    "progress": done.stderr.strip().splitlines()[-3:]})
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--parse-only", action="store_true", help="only the client's parse")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    out = run(args.jobs, args.parse_only)
    print(f"{out['jobs']} jobs, {out['file_bytes'] / 1e6:.1f} MB: parse {out['parse_s']} s"
          + ("" if args.parse_only else
             f", wall {out['wall_s']} s, {out['jobs_per_s']} jobs/s, "
             f"{out['requests']} requests, {out['stored']} stored"))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
