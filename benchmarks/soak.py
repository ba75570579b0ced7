"""Soak: a real broker through tens of thousands of trivial jobs, read while it works.

A fresh broker (`marbled --gpus 6`, policy marble, emulated GPUs) takes N jobs (`true` on
1 GPU) in batches of 1,000 (`POST /v1/jobs`, one client), while two pollers run the real
CLI, one process per call, as users do: `marble status` and `marble logs JOB` (a job
submitted by then). Then a batch of 500 is submitted while the jobs run; the queue
drains; `status` and `logs` are timed again on the quiet broker; the broker stops
(SIGTERM) and a new one starts on the same state directory: its start is timed until it
answers `GET /v1/status`, and its memory.

Printed: batch throughput (jobs/s), `status` and `logs` p50/p95 under load and quiet, the
batch of 500's latency, the broker's RSS at start, at its peak, 2 s after the queue
drained, the restart's time and its RSS. With --tracemalloc DIR
both brokers write their top allocations there at exit (MARBLE_TRACEMALLOC,
`daemon/main.py`).

    .venv/bin/python benchmarks/soak.py [--jobs 20000] [--batch 1000] [--json F]
    .venv/bin/python benchmarks/soak.py --smoke        # CI: 500 jobs, under a minute
    .venv/bin/python benchmarks/soak.py --tracemalloc /tmp/soak-tm
    .venv/bin/python benchmarks/soak.py --restart-from STATE_DIR [--repeat 3]   # restarts only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # benchmarks.*

from benchmarks.monitoring import rss_mb  # noqa: E402
from benchmarks.submit_load import load_average  # noqa: E402
from marbled.cli.client import BrokerClient  # noqa: E402
from marbled.demo import start_broker  # noqa: E402
from marbled.paths import DB_NAME, socket_path  # noqa: E402

ONE = {"gpus": 1, "command": ["true"]}
UNFINISHED = ("queued", "running", "suspending", "suspended")


def _ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))], 1)


def _lat(values: list[float]) -> dict:
    return {"calls": len(values), "p50_ms": _ms(values, 0.5), "p95_ms": _ms(values, 0.95),
            "max_ms": _ms(values, 1.0)}


def _marble(state: Path) -> list[str]:
    return [str(Path(sys.executable).with_name("marble")), "--state-dir", str(state)]


def _timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[-2:])}: exit {done.returncode}: {done.stderr}")
    return took


class Poller(threading.Thread):
    """Runs `argv()` again and again (`pause` s apart) until stopped; its latencies."""

    def __init__(self, argv, pause: float):
        super().__init__(daemon=True)
        self.argv, self.pause = argv, pause
        self.latency: list[float] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            argv = self.argv()
            if argv is not None:
                try:
                    self.latency.append(_timed(argv))
                except RuntimeError as exc:
                    self.errors.append(str(exc))
            self.stop.wait(self.pause)


class RssSampler(threading.Thread):
    def __init__(self, pid: int, every: float = 0.1):
        super().__init__(daemon=True)
        self.pid, self.every, self.peak = pid, every, 0.0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, rss_mb(self.pid))
            except (OSError, RuntimeError):
                return
            self.stop.wait(self.every)


def _unfinished(client: BrokerClient) -> int:
    counts = client.get("/v1/status")["jobs"]
    return sum(counts.get(s, 0) for s in UNFINISHED)


def _quiet(argv: list[str], calls: int) -> list[float]:
    return [_timed(argv) for _ in range(calls)]


def _dashboard_poll(state: Path, since: float | None, calls: int) -> list[float]:
    """The web dashboard's reads at each poll (status, jobs, runs), over the API: with
    `since`, its window; None, every job and run (as it read before the window)."""
    client = BrokerClient(socket_path(state), timeout=300)
    window = "" if since is None else f"?since={since}"
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        for path in ("/v1/status", f"/v1/jobs{window}", f"/v1/runs{window}"):
            client.get(path)
        times.append(time.perf_counter() - t0)
    return times


def _start(state: Path, gpus: int, env: dict | None) -> tuple[subprocess.Popen, float]:
    t0 = time.perf_counter()
    proc = start_broker(state, "marble", gpus, 1.0, env=env)
    return proc, time.perf_counter() - t0


def _stop(proc: subprocess.Popen) -> float:
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=300)
    return time.perf_counter() - t0


def soak(state: Path, jobs: int, batch: int, gpus: int, pause: float, quiet_calls: int,
         tracemalloc: Path | None, drain_timeout: float) -> dict:
    env = None
    if tracemalloc is not None:
        tracemalloc.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "MARBLE_TRACEMALLOC": str(tracemalloc / "first.txt")}
    out: dict = {"jobs": jobs, "batch": batch, "gpus": gpus, "load_before": load_average()}
    proc, took = _start(state, gpus, env)
    out["start_s"] = round(took, 2)
    try:
        client = BrokerClient(socket_path(state), timeout=300)
        time.sleep(0.5)
        out["rss_start_mb"] = rss_mb(proc.pid)
        sampler = RssSampler(proc.pid)
        sampler.start()
        submitted: list[int] = []
        status = Poller(lambda: [*_marble(state), "status"], pause)
        logs = Poller(lambda: [*_marble(state), "logs", str(submitted[len(submitted) // 2])]
                      if submitted else None, pause)
        status.start()
        logs.start()
        per_batch: list[float] = []
        t0 = time.perf_counter()
        for first in range(0, jobs, batch):
            body = {"jobs": [ONE] * min(batch, jobs - first)}
            t = time.perf_counter()
            answer = client.post("/v1/jobs", body)
            per_batch.append(time.perf_counter() - t)
            submitted += [j["id"] for j in answer["jobs"]]
        seconds = time.perf_counter() - t0
        out["submit"] = {"seconds": round(seconds, 2),
                         "jobs_per_second": round(jobs / seconds),
                         "batch_p50_ms": _ms(per_batch, 0.5), "batch_max_ms": _ms(per_batch, 1.0)}
        t = time.perf_counter()
        client.post("/v1/jobs", {"jobs": [ONE] * 500})
        out["batch_500_while_running_ms"] = round(1000 * (time.perf_counter() - t), 1)
        out["unfinished_at_500"] = _unfinished(client)
        t0 = time.perf_counter()
        while _unfinished(client) and time.perf_counter() - t0 < drain_timeout:
            time.sleep(0.5)
        out["drain_s"] = round(time.perf_counter() - t0 + seconds, 1)
        out["left_unfinished"] = _unfinished(client)
        status.stop.set()
        logs.stop.set()
        status.join()
        logs.join()
        out["status_loaded"] = _lat(status.latency)
        out["logs_loaded"] = _lat(logs.latency)
        out["poll_errors"] = (status.errors + logs.errors)[:5]
        time.sleep(2.0)
        sampler.stop.set()
        sampler.join()
        out["rss_peak_mb"] = sampler.peak
        out["rss_drained_mb"] = rss_mb(proc.pid)
        job = str(submitted[len(submitted) // 2])
        out["status_quiet"] = _lat(_quiet([*_marble(state), "status"], quiet_calls))
        out["logs_quiet"] = _lat(_quiet([*_marble(state), "logs", job], quiet_calls))
        # every job ended in the last minutes: since=now is the window of an allocation
        # whose history ended over an hour ago (what the page asks for then)
        out["dashboard_all"] = _lat(_dashboard_poll(state, None, quiet_calls))
        out["dashboard_window"] = _lat(_dashboard_poll(state, time.time(), quiet_calls))
        out["stop_s"] = round(_stop(proc), 2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if tracemalloc is not None:
        env = {**os.environ, "MARBLE_TRACEMALLOC": str(tracemalloc / "restart.txt")}
    proc, took = _start(state, gpus, env)
    try:
        out["restart_s"] = round(took, 2)
        time.sleep(1.0)
        out["rss_restart_mb"] = rss_mb(proc.pid)
        out["status_restart"] = _lat(_quiet([*_marble(state), "status"], quiet_calls))
        out["stop_restart_s"] = round(_stop(proc), 2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out["load_after"] = load_average()
    return out


def restarts(source: Path, tmp: Path, gpus: int, repeat: int, calls: int) -> dict:
    """A broker started `repeat` times on a copy of `source`'s database (a state left by a
    soak: tens of thousands of ended jobs): until it answers, its RSS, `status` and `logs`."""
    out: dict = {"source": str(source), "load_before": load_average(), "restart_s": [],
                 "rss_restart_mb": []}
    status, logs = [], []
    for i in range(repeat):
        state = tmp / f"restart-{i}"
        state.mkdir(mode=0o700)
        shutil.copy(source / DB_NAME, state / DB_NAME)
        proc, took = _start(state, gpus, None)
        try:
            out["restart_s"].append(round(took, 2))
            time.sleep(1.0)
            out["rss_restart_mb"].append(rss_mb(proc.pid))
            status += _quiet([*_marble(state), "status"], calls)
            logs += _quiet([*_marble(state), "logs", "1"], calls)
            _stop(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(state, ignore_errors=True)
    out.update(restart_median_s=round(statistics.median(out["restart_s"]), 2),
               status_quiet=_lat(status), logs_quiet=_lat(logs), load_after=load_average())
    return out


def report(fig: dict) -> str:
    def lat(name: str) -> str:
        d = fig[name]
        return f"p50 {d['p50_ms']} ms, p95 {d['p95_ms']} ms, max {d['max_ms']} ms ({d['calls']})"

    s = fig["submit"]
    return "\n".join([
        f"jobs: {fig['jobs']} in batches of {fig['batch']} on {fig['gpus']} GPUs",
        f"submit: {s['jobs_per_second']} jobs/s ({s['seconds']} s; a batch p50 "
        f"{s['batch_p50_ms']} ms, max {s['batch_max_ms']} ms)",
        f"batch of 500 while {fig['unfinished_at_500']} jobs were unfinished: "
        f"{fig['batch_500_while_running_ms']} ms",
        f"queue drained after {fig['drain_s']} s ({fig['left_unfinished']} left)",
        f"marble status, under load: {lat('status_loaded')}",
        f"marble logs,   under load: {lat('logs_loaded')}",
        f"marble status, quiet:      {lat('status_quiet')}",
        f"marble logs,   quiet:      {lat('logs_quiet')}",
        f"dashboard poll, every job: {lat('dashboard_all')}",
        f"dashboard poll, window:    {lat('dashboard_window')}",
        f"RSS: start {fig['rss_start_mb']} MB, peak {fig['rss_peak_mb']} MB, drained "
        f"{fig['rss_drained_mb']} MB; after the restart {fig['rss_restart_mb']} MB",
        f"restart: answers after {fig['restart_s']} s (the first start: {fig['start_s']} s); "
        "marble status then: "
        f"{lat('status_restart')}",
        f"stop: {fig['stop_s']} s (restarted broker: {fig['stop_restart_s']} s)",
        f"load before {fig['load_before']}, after {fig['load_after']}",
    ] + ([f"POLL ERRORS {fig['poll_errors']}"] if fig["poll_errors"] else []))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=1_000, help="jobs per POST /v1/jobs")
    ap.add_argument("--gpus", type=int, default=6, help="emulated GPUs of the broker")
    ap.add_argument("--pause", type=float, default=0.2,
                    help="seconds between two calls of a poller")
    ap.add_argument("--quiet-calls", type=int, default=20,
                    help="calls of status and logs each on the quiet broker")
    ap.add_argument("--drain-timeout", type=float, default=900.0)
    ap.add_argument("--state-dir", type=Path, help="keep the state here (default: a "
                    "temporary directory, removed)")
    ap.add_argument("--tracemalloc", type=Path, metavar="DIR",
                    help="the brokers write their top allocations at exit here")
    ap.add_argument("--restart-from", type=Path, metavar="STATE_DIR",
                    help="only the restart: a broker started --repeat times on a copy of "
                    "this state directory's database")
    ap.add_argument("--repeat", type=int, default=3, help="with --restart-from")
    ap.add_argument("--smoke", action="store_true",
                    help="500 jobs, a poll a second, 5 quiet calls (CI: under a minute)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    if args.smoke:
        args.jobs, args.pause, args.quiet_calls = min(args.jobs, 500), 1.0, 5
    if args.restart_from:
        with tempfile.TemporaryDirectory(prefix="marble-soak-") as tmp:
            fig = restarts(args.restart_from, Path(tmp), args.gpus, args.repeat,
                           args.quiet_calls)
        print(f"restart on {args.restart_from}: {fig['restart_s']} s (median "
              f"{fig['restart_median_s']} s), RSS {fig['rss_restart_mb']} MB; marble status "
              f"p50 {fig['status_quiet']['p50_ms']} ms, p95 {fig['status_quiet']['p95_ms']} ms;"
              f" marble logs p50 {fig['logs_quiet']['p50_ms']} ms, p95 "
              f"{fig['logs_quiet']['p95_ms']} ms; load {fig['load_before']} -> "
              f"{fig['load_after']}")
        if args.json:
            args.json.write_text(json.dumps(fig, indent=1))
        return
    print(f"soak: a real broker, {args.jobs} jobs; load {load_average()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="marble-soak-") as tmp:
        state = args.state_dir or Path(tmp) / "state"
        fig = soak(state, args.jobs, args.batch, args.gpus, args.pause, args.quiet_calls,
                   args.tracemalloc, args.drain_timeout)
    fig["smoke"] = args.smoke
    print(report(fig))
    if args.json:
        args.json.write_text(json.dumps(fig, indent=1))


if __name__ == "__main__":
    main()
