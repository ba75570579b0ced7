"""What running every run as a Slurm job step costs, against local processes.

Needs the test cluster (`sudo tests/slurm/cluster.sh up`). For each launcher a
broker runs one emulated job, suspends it --cycles times through the API (each
time it checkpoints, exits, and is started again at once), then runs paper job
set 3 (Figure 5). From the broker's SQLite log it prints medians of:

  launch    the broker's decision (run row) -> the job's Python is running
  signal    SIGTSTP asked -> the job's handler saw it (scancel under Slurm)
  suspend   SIGTSTP asked -> the broker has the acknowledgement
  relaunch  the old run's exit recorded -> the new run's decision
  gap       SIGTSTP asked -> first step of the resumed run (GPUs idle)
  makespan  job set 3 at --time-scale, in profiled seconds

With --readers (alone, in seconds) it compares the two ways marbled reads Slurm
(`marbled --slurm-api`), pyslurm and the commands, side by side, medians of --repeats:

  discovery  the allocation: nodes, GPUs, CPUs, end time (reader.allocation)
  end        the allocation's end again, as the broker polls it (reader.end)
  step gone  `scancel J.S` -> the reader no longer lists the step (polled back to back:
             pyslurm.jobstep().get() against `scontrol show step`)
  srun exit  `scancel J.S` -> srun has exited and Slurm's record of the end (state
             CANCELLED) is read from the step's stderr, which both paths use

pyslurm is taken from the Slurm tier's build (tests/slurm/pyslurm.sh, beside the venv).

    .venv/bin/python benchmarks/slurm_overhead.py [--cycles 10] [--time-scale 0.02]
    .venv/bin/python benchmarks/slurm_overhead.py --readers [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from marbled.batch.slurm_api import CliReader, PyslurmReader, pyslurm_problem, step_end
from marbled.cli.client import BrokerClient
from marbled.demo import start_broker
from marbled.paths import DB_NAME, socket_path
from marbled.resources import load_job_file, workload_path


def allocate() -> str:
    done = subprocess.run(["salloc", "--no-shell", "--nodes=1", "--ntasks-per-node=1",
                           "--cpus-per-task=12", "--gres=gpu:6"],
                          capture_output=True, text=True, timeout=60, check=True)
    return re.search(r"Granted job allocation (\d+)", done.stderr).group(1)


def start(state: Path, launcher: str, time_scale: float, env: dict) -> subprocess.Popen:
    return start_broker(state, "marble", 6 if launcher == "local" else None, time_scale,
                        ("--launcher", launcher, "--prestart", "off"), env)


def wait(predicate, timeout: float = 120.0, pause: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(pause)
    raise RuntimeError("timed out")


def cycles(client: BrokerClient, n: int) -> None:
    """One emulated job alone on the node (primary, malleable), suspended `n` times."""
    (job,) = client.post("/v1/jobs", {"model": "resnet-50", "steps": 10**9,
                                      "emulate": True})["jobs"]
    path, step = f"/v1/jobs/{job['id']}", 0
    for i in range(n + 1):
        view = wait(lambda i=i, step=step: (v := client.get(path))["state"] == "running"
                    and len(v["runs"]) == i + 1 and v["step"] > step + 5 and v)
        step = view["step"]
        client.post(f"{path}/{'suspend' if i < n else 'cancel'}")
    wait(lambda: client.get(path)["state"] == "cancelled")


def figures(db: Path, scale: float) -> dict:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    events = [dict(r, data=json.loads(r["data"] or "null"))
              for r in con.execute("SELECT * FROM events ORDER BY id")]
    runs = {r["id"]: dict(r) for r in con.execute("SELECT * FROM runs")}
    asked = {e["run_id"]: e["at"] for e in events if e["kind"] == "suspend-requested"}
    out: dict[str, list[float]] = {k: [] for k in ("launch", "signal", "suspend", "relaunch",
                                                   "gap")}
    for e in events:
        phases = (e["data"] or {}).get("phases") if e["run_id"] else None
        if phases and "python" in phases:
            out["launch"].append(phases["python"] - runs[e["run_id"]]["started_at"])
        if e["kind"] == "acknowledged" and e["run_id"] in asked:
            out["suspend"].append(e["at"] - asked[e["run_id"]])
        if e["kind"] == "suspended" and e["run_id"] in asked:
            later = [r for r in runs.values() if r["job_id"] == e["job_id"]
                     and r["id"] > e["run_id"]]
            if later:
                out["relaunch"].append(min(r["started_at"] for r in later) - e["at"])
    for e in events:  # the signal's arrival and the resumed run's first step
        if e["kind"] == "acknowledged" and e["run_id"] in asked and e["data"].get("latency"):
            seen = e["at"] - e["data"]["latency"]
            out["signal"].append(seen - asked[e["run_id"]])
        phases = (e["data"] or {}).get("phases") if e["run_id"] else None
        if phases and "first_step" in phases:
            before = [r for r in asked if runs[r]["job_id"] == e["job_id"] and r < e["run_id"]]
            if before:
                out["gap"].append(phases["first_step"] - asked[max(before)])
    con.close()
    return {k: statistics.median(v) if v else None for k, v in out.items()} | {
        "n": len(out["suspend"])}


def makespan(client: BrokerClient, scale: float) -> float:
    specs = load_job_file(workload_path("paper-jobset3"))
    ids = [j["id"] for j in client.post("/v1/jobs", {"jobs": [s.to_mapping() for s in specs]})
           ["jobs"]]
    wait(lambda: all(client.get(f"/v1/jobs/{i}")["state"] == "done" for i in ids), 300)
    runs = [r for r in client.get("/v1/runs")["runs"] if r["job_id"] in ids]
    return (max(r["ended_at"] for r in runs) - min(r["started_at"] for r in runs)) / scale


def timed(action) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def step_end_times(job: str, gone) -> tuple[float, float, str]:
    """One step of `job` cancelled: seconds until `gone(step)` holds, until srun has exited
    with Slurm's record read, and the state that record gives."""
    with tempfile.NamedTemporaryFile("w+", suffix=".err") as err:
        name = f"bench-{time.monotonic_ns()}"  # the steps cancelled before may linger
        srun = subprocess.Popen(["srun", f"--jobid={job}", "--exact", "-n1", "--gpus=1",
                                 f"--job-name={name}", "sleep", "60"],
                                stdout=subprocess.DEVNULL, stderr=err)
        step = wait(lambda: next((line.split()[0] for line in subprocess.run(
            ["squeue", "-h", "-s", "-j", job, "-o", "%i %j"], capture_output=True,
            text=True).stdout.splitlines() if line.endswith(f" {name}")), None), 30)
        time.sleep(0.3)  # its task running: a step cancelled while it starts has no record
        began = time.perf_counter()
        subprocess.run(["scancel", step], check=True)
        wait(lambda: gone(step), 30, 0)
        seen = time.perf_counter() - began
        srun.wait(30)
        end = step_end(Path(err.name).read_text(), step)
        return seen, time.perf_counter() - began, end["state"] if end else "-"


def pyslurm_step_gone(module):
    def gone(step: str) -> bool:
        job, _, number = step.partition(".")
        return int(number) not in module.jobstep().get().get(int(job), {})
    return gone


def cli_step_gone(step: str) -> bool:
    return subprocess.run(["scontrol", "show", "step", step], capture_output=True,
                          check=False).returncode != 0


def readers(repeats: int) -> None:
    """pyslurm and the commands side by side: what each read costs, in seconds."""
    lib = Path(sys.prefix) / "pyslurm-22.5" / "lib"
    sys.path.insert(0, str(lib))
    module, why = pyslurm_problem()
    print(f"pyslurm: {why}")
    ways = {"cli": (CliReader(), cli_step_gone)}
    if module is not None:
        ways = {"pyslurm": (PyslurmReader(module), pyslurm_step_gone(module)), **ways}
    job = allocate()
    rows = {}
    try:
        for name, (reader, gone) in ways.items():
            steps = [step_end_times(job, gone) for _ in range(max(3, repeats // 4))]
            rows[name] = {
                "discovery": statistics.median(
                    timed(lambda r=reader: r.allocation(job)) for _ in range(repeats)),
                "end": statistics.median(
                    timed(lambda r=reader: r.end(job)) for _ in range(repeats)),
                "step gone": statistics.median(s[0] for s in steps),
                "srun exit": statistics.median(s[1] for s in steps),
                "state": {st: sum(s[2] == st for s in steps) for st in {s[2] for s in steps}}}
    finally:
        subprocess.run(["scancel", job], check=False)
    keys = ("discovery", "end", "step gone", "srun exit")
    print(f"medians in ms ({repeats} reads, {max(3, repeats // 4)} steps cancelled each)")
    print(f"{'reader':<9}" + "".join(f"{k:>11}" for k in keys) + "  state")
    for name, r in rows.items():
        print(f"{name:<9}" + "".join(f"{r[k] * 1000:>11.2f}" for k in keys)
              + "  " + ", ".join(f"{st} x{n}" for st, n in sorted(r["state"].items())))
    if "pyslurm" in rows:
        print("cli / pyslurm: " + ", ".join(
            f"{k} {rows['cli'][k] / rows['pyslurm'][k]:.1f}x" for k in keys))
    print(json.dumps(rows, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--time-scale", type=float, default=0.02)
    ap.add_argument("--readers", action="store_true",
                    help="only compare pyslurm and the commands (--slurm-api)")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    if args.readers:
        readers(args.repeats)
        return
    rows = {}
    for launcher in ("local", "slurm"):
        job = allocate() if launcher == "slurm" else None
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        if job:
            env["SLURM_JOB_ID"] = job
        with tempfile.TemporaryDirectory(prefix="marble-slurm-bench-") as tmp:
            state = Path(tmp) / "state"
            proc = start(state, launcher, args.time_scale, env)
            client = BrokerClient(socket_path(state))
            try:
                cycles(client, args.cycles)
                span = makespan(client, args.time_scale)
                client.post("/v1/shutdown")
                proc.wait(timeout=120)
                rows[launcher] = figures(state / DB_NAME, args.time_scale) | {"makespan": span}
            finally:
                if proc.poll() is None:
                    proc.kill()
                if job:
                    subprocess.run(["scancel", job], check=False)
    keys = ("launch", "signal", "suspend", "relaunch", "gap")
    n = rows["slurm"]["n"]
    print(f"medians over {n} suspensions ({args.cycles} by the API, the rest job set 3's "
          "promotions), in seconds; job set 3 makespan in profiled seconds")
    print(f"{'launcher':<9}" + "".join(f"{k:>10}" for k in keys) + f"{'makespan':>10}")
    for name, r in rows.items():
        print(f"{name:<9}" + "".join(f"{r[k]:>10.3f}" if r[k] is not None else f"{'-':>10}"
                                     for k in keys) + f"{r['makespan']:>10.0f}")
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
