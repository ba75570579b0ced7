"""The demo: one paper job set through two real brokers, the MARBLE way and the LSF way.

Both brokers run at the same time on their own 6 EMULATED GPUs and state
directories; the jobs are emulated training jobs (they sleep through their steps
at the profiled rate, scaled by --time-scale) that speak the real suspend/resume
protocol. Times are printed in profiled seconds, beside the simulator's
prediction from the same policy code and the paper's measurement.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from marbled.cli.client import BrokerClient, wait_until_serving
from marbled.cli.schedule import format_gantt, format_table, schedule_rows
from marbled.core.policy import get_policy
from marbled.paths import socket_path
from marbled.resources import load_job_file, load_profile, workload_path
from marbled.sim.engine import Simulator

# Table II and Section VII-B1 of the paper: total time of each job set in seconds.
PAPER_SECONDS = {
    "paper-jobset1": {"rigid": 958, "marble": 496},
    "paper-jobset2": {"rigid": 940, "marble": 608},
    "paper-jobset3": {"rigid": 707, "marble": 501},
}


def start_broker(state_dir: Path, policy: str, gpus: int | None, time_scale: float,
                 extra: tuple[str, ...] = (), env: dict | None = None) -> subprocess.Popen:
    """A marbled on `gpus` emulated GPUs (None: the GPUs its launcher finds)."""
    argv = [sys.executable, "-m", "marbled.cli.daemon_cmd", "--state-dir", str(state_dir),
            *(["--gpus", str(gpus)] if gpus else []), "--policy", policy,
            "--time-scale", repr(time_scale), "--monitor-interval", "0.1",
            "--log-level", "warning", *extra]
    state_dir.mkdir(parents=True, exist_ok=True)
    log = open(state_dir / "marbled.log", "ab")  # noqa: SIM115 (the child keeps it)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
    try:
        wait_until_serving(BrokerClient(socket_path(state_dir)), proc)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}: {(state_dir / 'marbled.log').read_text()}") from None
    return proc


TITLES = {"marble": "MARBLE", "rigid": "LSF way"}


def progress_line(elapsed: float, left: dict[str, int], total: int) -> str:
    """The demo's progress: the jobs still to finish on each broker, each of which runs
    the whole set of `total` jobs (`  12.3 s: jobs still to finish: MARBLE 1 of 3, LSF
    way 2 of 3`), not their sum."""
    per = ", ".join(f"{TITLES.get(p, p)} {n} of {total}" for p, n in left.items())
    return f"  {elapsed:5.1f} s: jobs still to finish: {per}"


def total_seconds(runs: list[dict], scale: float) -> float:
    start = min(r["started_at"] for r in runs)
    end = max(r["ended_at"] for r in runs)
    return (end - start) / scale


def compare_policies(jobset: str = "paper-jobset1", gpus: int = 6, time_scale: float = 0.02,
                     progress: bool = False) -> dict:
    """Run `jobset` through a `marble` and a `rigid` broker at once; return both schedules."""
    path = workload_path(jobset)
    specs = load_job_file(path)
    book = load_profile()
    out = {"jobset": path.stem, "gpus": gpus, "time_scale": time_scale, "policies": {}}
    tty = progress and sys.stderr.isatty()
    with tempfile.TemporaryDirectory(prefix="marble-demo-") as tmp:
        procs, clients = {}, {}
        try:
            for policy in ("marble", "rigid"):
                sdir = Path(tmp) / policy
                procs[policy] = start_broker(sdir, policy, gpus, time_scale)
                clients[policy] = BrokerClient(socket_path(sdir))
                clients[policy].post("/v1/jobs", {"jobs": [s.to_mapping() for s in specs]})
            t0 = last = time.monotonic()
            while True:
                left = {policy: sum(1 for j in c.get("/v1/jobs")["jobs"]
                                    if j["state"] not in ("done", "failed", "cancelled"))
                        for policy, c in clients.items()}
                now = time.monotonic()
                if progress and (tty or now - last >= 5 or not any(left.values())):
                    prefix = "\r" if tty else ""
                    print(prefix + progress_line(now - t0, left, len(specs)),
                          end="" if tty else "\n", file=sys.stderr, flush=True)
                    last = now
                if not any(left.values()):
                    break
                time.sleep(0.25)
            if tty:
                print(file=sys.stderr)
            for policy, client in clients.items():
                runs = client.get("/v1/runs")["runs"]
                jobs = {j["id"]: j for j in client.get("/v1/jobs")["jobs"]}
                rows = schedule_rows(runs, jobs, min(r["started_at"] for r in runs), time_scale)
                out["policies"][policy] = {
                    "total_s": total_seconds(runs, time_scale),
                    "simulated_s": Simulator(book, get_policy(policy), gpus).run(specs).makespan,
                    "paper_s": PAPER_SECONDS.get(path.stem, {}).get(policy),
                    "failed": [j["id"] for j in jobs.values() if j["state"] != "done"],
                    "runs": rows,
                }
        finally:
            for proc in procs.values():
                proc.terminate()
            for proc in procs.values():
                proc.wait(timeout=60)
    m, r = out["policies"]["marble"], out["policies"]["rigid"]
    out["speedup"] = r["total_s"] / m["total_s"]
    out["reduction"] = 1 - m["total_s"] / r["total_s"]
    return out


def run_demo(gpus: int = 6, time_scale: float = 0.02, jobset: str = "paper-jobset1",
             as_json: bool = False) -> int:
    if not as_json:
        print(f"Job set {workload_path(jobset).stem} on {gpus} emulated GPUs, emulated jobs, "
              f"time scale {time_scale} (1 profiled second = {time_scale} s real)")
    out = compare_policies(jobset, gpus, time_scale, progress=not as_json)
    m, r = out["policies"]["marble"], out["policies"]["rigid"]
    if as_json:
        print(json.dumps(out, indent=2))
        return 0 if not (m["failed"] or r["failed"]) else 1
    for policy, title in (("marble", "MARBLE"), ("rigid", "LSF way (rigid: all GPUs, FIFO)")):
        rows = out["policies"][policy]["runs"]
        print(f"\n=== {title}: schedule (times in profiled seconds) ===")
        print(format_table(rows))
        print()
        print(format_gantt(rows, {rows[0]["node"]: gpus}, unit="profiled s"))
    print(f"\n{'total time':22}{'measured':>10}{'simulated':>11}{'paper':>8}")
    for name, p in (("LSF way (rigid)", r), ("MARBLE", m)):
        paper = f"{p['paper_s']:>7}s" if p["paper_s"] else f"{'-':>8}"
        print(f"{name:22}{p['total_s']:>9.0f}s{p['simulated_s']:>10.0f}s{paper}")
    print(f"\nLSF-way / MARBLE-way total time: {out['speedup']:.2f}x "
          f"({out['reduction']:.1%} less time with MARBLE)")
    return 0 if not (m["failed"] or r["failed"]) else 1


if __name__ == "__main__":
    sys.exit(run_demo())
