"""Submission: how many jobs a broker accepts per second, and how long each answer takes.

Every part runs against a fresh real broker (`marbled --gpus 6`, policy marble) whose GPUs
are held by one job, so nothing submitted starts; each submitted job is `true` on 1 GPU.

  api-1       one job per request, 1 client
  api-20      one job per request, 20 concurrent clients (threads, a connection a request)
              while a probe asks for /v1/status every 50 ms; then every job must be in the
              database exactly once, ids 1..N+1 without a gap (the original load test)
  api-20-ka   the same with keep-alive: each client sends all its requests on one
              connection (http.client, as HTTP client libraries do), with the same checks
  batch-100   POST /v1/jobs with {"jobs": [100 jobs]}, one client
  batch-1000  the same with 1,000 jobs a request
  cli         `marble submit -- true`, one process per job, from a shell loop (`sh -c 'for
              ...'`): ms per call; and the import time of `marble submit` (python -X importtime)
  cli-file    `marble submit --file` with a 10,000-job YAML file: one process

Latencies are per request (per call for `cli`), as the client sees them: p50 and p99.

    .venv/bin/python benchmarks/submit_load.py [--parts api-1,api-20,...] [--json F]
    .venv/bin/python benchmarks/submit_load.py --smoke     # CI: small counts, a few seconds
    .venv/bin/python benchmarks/submit_load.py --only-load [--clients 20] [--jobs 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from marbled.cli import client as client_module
from marbled.cli.client import BrokerClient
from marbled.demo import start_broker
from marbled.paths import DB_NAME, socket_path

ONE = {"gpus": 1, "command": ["true"]}
HOLDER = {"gpus": 6, "command": ["sleep", "100000"], "name": "holder"}


def _ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))], 2)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass
class LoadResult:
    submitted: int = 0
    seconds: float = 0.0
    latency: list[float] = field(default_factory=list)  # per submission request
    status_latency: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        lat = self.status_latency
        return {
            "jobs": self.submitted, "seconds": round(self.seconds, 2),
            "jobs_per_second": round(self.submitted / self.seconds) if self.seconds else None,
            "p50_ms": _ms(self.latency, 0.5), "p99_ms": _ms(self.latency, 0.99),
            "status_probes": len(lat),
            "status_p50_ms": _ms(lat, 0.5), "status_p99_ms": _ms(lat, 0.99),
            "status_max_ms": _ms(lat, 1.0),
            "errors": self.errors[:5], "violations": self.violations[:5],
        }


def load(state: Path, clients: int = 20, jobs: int = 10_000,
         keepalive: bool = False) -> LoadResult:
    """`clients` threads submit `jobs` jobs one per request, each on a connection of its
    own, or with `keepalive` all on one; every job recorded once?"""
    result = LoadResult()
    proc = start_broker(state, "marble", 6, 1.0)
    try:
        holder = BrokerClient(socket_path(state))
        holder.post("/v1/jobs", HOLDER)
        done = threading.Event()

        def probe() -> None:
            client = BrokerClient(socket_path(state), timeout=30)
            while not done.is_set():
                t0 = time.perf_counter()
                client.get("/v1/status")
                result.status_latency.append(time.perf_counter() - t0)
                time.sleep(0.05)

        def submit(k: int) -> None:
            post = _kept_alive(socket_path(state)) if keepalive else \
                BrokerClient(socket_path(state), timeout=60).post
            for i in range(k, jobs, clients):
                try:
                    t0 = time.perf_counter()
                    post("/v1/jobs", {**ONE, "name": f"j{i}"})
                    result.latency.append(time.perf_counter() - t0)
                except Exception as exc:  # noqa: BLE001 (counted, reported)
                    result.errors.append(f"job j{i}: {exc}")

        threads = [threading.Thread(target=submit, args=(k,)) for k in range(clients)]
        prober = threading.Thread(target=probe)
        prober.start()
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        result.seconds = time.perf_counter() - t0
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


def _kept_alive(path: Path) -> Callable[[str, dict], dict]:
    """A POST over one HTTP/1.1 connection that stays open between requests."""
    connection = client_module._UnixConnection(str(path), 60.0)

    def post(url: str, body: dict) -> dict:
        connection.request("POST", url, json.dumps(body),
                           {"Content-Type": "application/json"})
        answer = connection.getresponse()
        doc = json.loads(answer.read())
        if answer.status != 201:
            raise RuntimeError(f"{answer.status}: {doc.get('error')}")
        return doc

    return post


def _with_broker(tmp: Path, name: str, body: Callable[[Path], dict]) -> dict:
    state = tmp / name
    proc = start_broker(state, "marble", 6, 1.0)
    try:
        BrokerClient(socket_path(state)).post("/v1/jobs", HOLDER)
        figures = body(state)
        con = sqlite3.connect(state / DB_NAME)
        figures["recorded"] = con.execute("SELECT count(*) FROM jobs").fetchone()[0] - 1
        con.close()
        return figures
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        shutil.rmtree(state, ignore_errors=True)


def _requests(state: Path, requests: int, per_request: int) -> dict:
    """One client, `requests` POSTs of `per_request` jobs each (1: a bare job object)."""
    client = BrokerClient(socket_path(state), timeout=120)
    body = ONE if per_request == 1 else {"jobs": [ONE] * per_request}
    latency = []
    t0 = time.perf_counter()
    for _ in range(requests):
        t = time.perf_counter()
        client.post("/v1/jobs", body)
        latency.append(time.perf_counter() - t)
    seconds = time.perf_counter() - t0
    return {"jobs": requests * per_request, "seconds": round(seconds, 3),
            "jobs_per_second": round(requests * per_request / seconds),
            "requests": requests, "p50_ms": _ms(latency, 0.5), "p99_ms": _ms(latency, 0.99)}


def _marble(state: Path) -> list[str]:
    return [str(Path(sys.executable).with_name("marble")), "--state-dir", str(state)]


def _cli_loop(state: Path, calls: int) -> dict:
    """`marble submit` one process a job from a shell loop; each call timed by the shell."""
    marble = " ".join(_marble(state))
    script = (f'for i in $(seq {calls}); do s=$(date +%s%N); {marble} submit --gpus 1 -- true '
              f'>/dev/null || exit 1; e=$(date +%s%N); echo $((e - s)); done')
    t0 = time.perf_counter()
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - t0
    per_call = [int(x) / 1e9 for x in out.stdout.split()]
    return {"jobs": calls, "seconds": round(seconds, 3),
            "jobs_per_second": round(calls / seconds, 1),
            "p50_ms": _ms(per_call, 0.5), "p99_ms": _ms(per_call, 0.99)}


def import_time_ms(state: Path, repeat: int = 5) -> dict:
    """What `marble submit --gpus 1 -- true` imports, by `python -X importtime` (median of
    `repeat`; it submits to the broker of `state`): the marbled.cli.entry import tree plus
    what the submission imports. Beside it, a whole `marble submit --help` process (click's
    command, which the everyday form no longer imports)."""
    def code(*args: str) -> str:
        return (f"import sys; sys.argv={['marble', '--state-dir', str(state), *args]!r}; "
                "from marbled.cli.entry import marble\n"
                "try:\n    marble()\nexcept SystemExit:\n    pass")
    totals, startup = [], []
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-X", "importtime", "-c",
                               code("submit", "--gpus", "1", "--", "true")],
                              capture_output=True, text=True, check=True)
        cumulative = [int(line.split("|")[1]) for line in done.stderr.splitlines()
                      if line.startswith("import time:") and line.split("|")[2].startswith(" ")
                      and not line.split("|")[2].startswith("  ")
                      and line.split("|")[1].strip().isdigit()]
        totals.append(sum(cumulative) / 1000)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code("submit", "--help")], capture_output=True,
                       check=True)
        startup.append(time.perf_counter() - t0)
    return {"imports_ms": round(statistics.median(totals), 1),
            "help_process_ms": round(1000 * statistics.median(startup), 1)}


def _cli_file(state: Path, tmp: Path, jobs: int) -> dict:
    path = tmp / "jobs.yaml"
    path.write_text("".join(f"- gpus: 1\n  command: 'true'\n  name: f{i}\n" for i in range(jobs)))
    t0 = time.perf_counter()
    subprocess.run([*_marble(state), "submit", "--file", str(path)], check=True,
                   stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    return {"jobs": jobs, "seconds": round(seconds, 3),
            "jobs_per_second": round(jobs / seconds)}


PARTS = ("api-1", "api-20", "api-20-ka", "batch-100", "batch-1000", "cli", "cli-file")


def suite(parts: tuple[str, ...], smoke: bool, clients: int = 20) -> dict:
    n = {"api-1": 200 if smoke else 3_000, "api-20": 400 if smoke else 10_000,
         "api-20-ka": 400 if smoke else 10_000,
         "batch-100": 5 if smoke else 200, "batch-1000": 2 if smoke else 20,
         "cli": 5 if smoke else 50, "cli-file": 300 if smoke else 10_000}
    out: dict = {"load_before": load_average(), "smoke": smoke, "parts": {}}
    with tempfile.TemporaryDirectory(prefix="marble-submit-") as tmp_name:
        tmp = Path(tmp_name)
        for part in parts:
            if part in ("api-20", "api-20-ka"):
                r = load(tmp / part, clients, n[part], keepalive=part == "api-20-ka")
                fig = r.summary()
                shutil.rmtree(tmp / part, ignore_errors=True)
            elif part == "api-1":
                fig = _with_broker(tmp, part, lambda s: _requests(s, n["api-1"], 1))
            elif part.startswith("batch-"):
                size = int(part.split("-")[1])
                fig = _with_broker(tmp, part, lambda s, k=size, r=n[part]: _requests(s, r, k))
            elif part == "cli":
                fig = _with_broker(tmp, part, lambda s: _cli_loop(s, n["cli"]))
                # on a broker of its own: its submissions are not the loop's
                fig["import_ms"] = _with_broker(tmp, "imports", import_time_ms)
            elif part == "cli-file":
                fig = _with_broker(tmp, part, lambda s: _cli_file(s, tmp, n["cli-file"]))
            else:
                raise SystemExit(f"unknown part {part!r}; parts: {', '.join(PARTS)}")
            fig["load"] = load_average()
            out["parts"][part] = fig
            print(_row(part, fig), flush=True)
    out["load_after"] = load_average()
    return out


def _row(part: str, fig: dict) -> str:
    extra = ""
    if "import_ms" in fig:
        extra = (f"  imports {fig['import_ms']['imports_ms']} ms, "
                 f"'marble submit --help' {fig['import_ms']['help_process_ms']} ms")
    if fig.get("violations") or fig.get("errors"):
        extra += f"  ERRORS {fig.get('errors')} {fig.get('violations')}"
    return (f"{part:<11} {fig['jobs']:>6} jobs {fig['seconds']:>8.2f} s "
            f"{fig['jobs_per_second']:>8} jobs/s  p50 {fig.get('p50_ms', '-')} ms  "
            f"p99 {fig.get('p99_ms', '-')} ms  load {fig['load']}{extra}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default=",".join(PARTS),
                    help=f"comma list of: {', '.join(PARTS)}")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=10_000, help="with --only-load")
    ap.add_argument("--only-load", action="store_true",
                    help="only the original load test (api-20 with its checks), as JSON")
    ap.add_argument("--smoke", action="store_true", help="small counts (CI)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    if args.only_load:
        with tempfile.TemporaryDirectory(prefix="marble-load-") as tmp:
            r = load(Path(tmp) / "state", args.clients, args.jobs)
        print(json.dumps(r.summary(), indent=1))
        return
    print(f"submission to a real broker (6 emulated GPUs, held); load {load_average()}")
    out = suite(tuple(p for p in args.parts.split(",") if p), args.smoke, args.clients)
    print(f"load at end {out['load_after']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
