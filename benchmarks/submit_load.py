"""Many clients submitting at once: is every job recorded exactly once, and does the broker
stay responsive?

A broker on 6 emulated GPUs, its GPUs held by one job, takes --jobs jobs from
--clients concurrent clients (one job per request, each with a unique name),
while a probe asks for /v1/status every 50 ms. Then every name must be in the
database exactly once, with ids 1..N+1 and no gap.

    .venv/bin/python benchmarks/submit_load.py [--clients 20] [--jobs 10000]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from marbled.cli.client import BrokerClient
from marbled.demo import start_broker
from marbled.paths import DB_NAME, socket_path


@dataclass
class LoadResult:
    submitted: int = 0
    seconds: float = 0.0
    status_latency: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        lat = sorted(self.status_latency)
        return {
            "jobs": self.submitted, "seconds": round(self.seconds, 2),
            "jobs_per_second": round(self.submitted / self.seconds) if self.seconds else None,
            "status_probes": len(lat),
            "status_p50_ms": round(1000 * statistics.median(lat), 1) if lat else None,
            "status_p99_ms": round(1000 * lat[int(0.99 * (len(lat) - 1))], 1) if lat else None,
            "status_max_ms": round(1000 * lat[-1], 1) if lat else None,
            "errors": self.errors[:5], "violations": self.violations[:5],
        }


def load(state: Path, clients: int = 20, jobs: int = 10_000) -> LoadResult:
    result = LoadResult()
    proc = start_broker(state, "marble", 6, 1.0)
    try:
        holder = BrokerClient(socket_path(state))
        holder.post("/v1/jobs", {"gpus": 6, "command": ["sleep", "100000"], "name": "holder"})
        done = threading.Event()

        def probe() -> None:
            client = BrokerClient(socket_path(state), timeout=30)
            while not done.is_set():
                t0 = time.monotonic()
                client.get("/v1/status")
                result.status_latency.append(time.monotonic() - t0)
                time.sleep(0.05)

        def submit(k: int) -> None:
            client = BrokerClient(socket_path(state), timeout=60)
            for i in range(k, jobs, clients):
                try:
                    client.post("/v1/jobs", {"gpus": 1, "command": ["true"], "name": f"j{i}"})
                except Exception as exc:  # noqa: BLE001 (counted, reported)
                    result.errors.append(f"job j{i}: {exc}")

        threads = [threading.Thread(target=submit, args=(k,)) for k in range(clients)]
        prober = threading.Thread(target=probe)
        prober.start()
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        result.seconds = time.monotonic() - t0
        done.set()
        prober.join()
        result.submitted = jobs - len(result.errors)
        listed = holder.get("/v1/jobs")["jobs"]
        if len(listed) != jobs + 1:
            result.violations.append(f"/v1/jobs lists {len(listed)} jobs, not {jobs + 1}")
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    con = sqlite3.connect(state / DB_NAME)
    names = [n for (n,) in con.execute("SELECT name FROM jobs WHERE name != 'holder'")]
    ids = [i for (i,) in con.execute("SELECT id FROM jobs ORDER BY id")]
    events = con.execute("SELECT count(*) FROM events WHERE kind = 'submitted'").fetchone()[0]
    integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
    con.close()
    if sorted(names) != sorted(f"j{i}" for i in range(jobs)):
        result.violations.append(f"{len(names)} names recorded, {len(set(names))} distinct, "
                                 f"for {jobs} jobs")
    if ids != list(range(1, jobs + 2)):
        result.violations.append("job ids are not 1..N without gaps")
    if events != jobs + 1:
        result.violations.append(f"{events} 'submitted' events for {jobs + 1} jobs")
    if integrity != "ok":
        result.violations.append(f"integrity_check: {integrity}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=10_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="marble-load-") as tmp:
        r = load(Path(tmp) / "state", args.clients, args.jobs)
    print(json.dumps(r.summary(), indent=1))


if __name__ == "__main__":
    main()
