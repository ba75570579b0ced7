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

With --plain N it runs N plain commands instead (`sh -c 'echo start; sleep 0.3; echo end'`,
no worker protocol, each appending a line to its own files as it begins and as it
completes), --kills kills spread over them, and prints how many completed twice (I2 of
docs/lifecycle.md: a command completes at most once), how many began twice (none may: a
run outlives its broker, and one is run again only when it never began), how many never
completed, and the records that are not done or not true to the exit. With --slurm-job J
every command is a job step of the running Slurm job J (e.g. `salloc --no-shell
--gres=gpu:6 -c 12`), the broker outside it.

    .venv/bin/python benchmarks/fault_injection.py [--kills 300] [--seed 1 [2 ...]]
        [--time-scale 0.2] [--max-gap 0.8] [--policy marble] [--broker-flags FLAGS]
    .venv/bin/python benchmarks/fault_injection.py --plain 300 --kills 10 --seed 1 2
    .venv/bin/python benchmarks/fault_injection.py --plain 60 --kills 5 --slurm-job J
    .venv/bin/python benchmarks/fault_injection.py --disk-full 5 --plain 60 --seed 1 2

With --disk-full N (as root) the state directory is a small tmpfs that is filled N times
while the job sets and the --plain commands run (I4: the broker stays up, answers 503, and
recovers by itself): it prints the fills, the 503s, the broker's deaths, the time from a
freed disk to an accepted submission, plain commands completed twice, the GPU-seconds a
run was recorded running more than 1 s after its command exited, and the job sets' checks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # tests.conftest (appended: PYTHONPATH wins)

from marbled.cli.client import ApiError, BrokerClient  # noqa: E402
from marbled.core.policy import POLICIES  # noqa: E402
from marbled.demo import start_broker  # noqa: E402
from marbled.paths import DB_NAME, socket_path  # noqa: E402
from marbled.resources import load_job_file, workload_path  # noqa: E402
from tests.conftest import kill_left_runs  # noqa: E402

FINAL = {"done", "failed", "cancelled"}


@dataclass
class ChaosResult:
    kills: int = 0  # kills while jobs were unfinished
    restarts: list[float] = field(default_factory=list)  # seconds until a new broker serves
    adopted: int = 0
    runs: int = 0
    suspensions: int = 0  # suspend requests (only kills here: each a policy's)
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


_brokers: list[subprocess.Popen] = []  # the brokers started, for `left_clean`
BROKER_FLAGS: list[str] = []  # more marbled flags for every broker (--broker-flags)


def start(state: Path, time_scale: float, slurm_job: str | None = None,
          policy: str = "marble") -> tuple[subprocess.Popen, float]:
    """A broker on the state directory (on 6 emulated GPUs, or every run a step of Slurm
    job `slurm_job`) with `policy`; how long it took to serve."""
    t0 = time.monotonic()
    if slurm_job:
        proc = start_broker(state, policy, None, time_scale,
                            ("--launcher", "slurm", *BROKER_FLAGS),
                            {**os.environ, "SLURM_JOB_ID": slurm_job})
    else:
        proc = start_broker(state, policy, 6, time_scale, tuple(BROKER_FLAGS))
    _brokers.append(proc)
    return proc, time.monotonic() - t0


@contextlib.contextmanager
def left_clean(state: Path):
    """However a schedule ends (the benchmark's own failure too: an ENOSPC of its filler
    once left brokers and jobs running), no broker of it and no run of theirs is left."""
    try:
        yield
    finally:
        for proc in _brokers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        _brokers.clear()
        kill_left_runs(state)


def unfinished(state: Path) -> int:
    con = sqlite3.connect(state / DB_NAME)
    try:
        return con.execute("SELECT count(*) FROM jobs WHERE state NOT IN "
                           "('done', 'failed', 'cancelled')").fetchone()[0]
    finally:
        con.close()


def chaos(state: Path, kills: int, seed: int = 0, time_scale: float = 0.02,
          gap: tuple[float, float] = (0.05, 0.8), policy: str = "marble") -> ChaosResult:
    """Run the workload through `kills` SIGKILLed brokers, then check it (ChaosResult)."""
    rng = random.Random(seed)
    state.mkdir(parents=True, exist_ok=True)
    logs = state.parent / "steps"
    logs.mkdir(exist_ok=True)
    jobs = workload(logs, time_scale)
    result = ChaosResult()
    t0 = time.monotonic()
    proc, _ = start(state, time_scale, policy=policy)
    BrokerClient(socket_path(state)).post("/v1/jobs", {"jobs": jobs})
    while result.kills < kills:
        time.sleep(rng.uniform(*gap))
        if unfinished(state) == 0:
            break  # the queue ended first: a longer workload or shorter gaps are needed
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        result.kills += 1
        proc, took = start(state, time_scale, policy=policy)
        result.restarts.append(took)
    finish(state, proc, result.violations, "the last kill")
    result.seconds = time.monotonic() - t0
    check(state, jobs, logs, result)
    return result


def finish(state: Path, proc: subprocess.Popen, violations: list[str], since: str) -> None:
    """Wait until every job has ended (at most 600 s, else a violation), then stop the
    broker."""
    deadline = time.monotonic() + 600
    while unfinished(state):
        if time.monotonic() > deadline:
            violations.append(f"jobs not finished 600 s after {since}")
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


def check(state: Path, jobs: list[dict], logs: Path, result: ChaosResult) -> None:
    v = result.violations
    con = sqlite3.connect(state / DB_NAME)
    con.row_factory = sqlite3.Row
    rows = {r["id"]: r for r in con.execute("SELECT * FROM jobs")}
    runs = list(con.execute("SELECT * FROM runs ORDER BY id"))
    result.runs = len(runs)
    result.suspensions = con.execute("SELECT count(*) FROM events WHERE kind = "
                                     "'suspend-requested'").fetchone()[0]
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


@dataclass
class PlainResult:
    kills: int = 0
    adopted: int = 0  # runs a new broker adopted (alive or ended)
    completed_twice: int = 0  # jobs whose command ran to its end more than once
    started_twice: int = 0  # jobs whose command began more than once (runs outlive brokers)
    never_completed: int = 0
    runs: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0


def plain_workload(marks: Path, n: int, sleep: float = 0.3) -> list[dict]:
    """`n` plain commands; each appends a line to its own files in `marks` as it begins
    (`i.start`) and as it completes (`i.done`)."""
    return [{"name": f"plain{i}", "gpus": 1, "command": [
        "sh", "-c", f"echo start >> {marks}/{i}.start; echo start; sleep {sleep}; echo end; "
                    f"echo done >> {marks}/{i}.done"]}
        for i in range(1, n + 1)]


def marked(marks: Path, i: int, kind: str) -> int:
    """How many times plain command `i` wrote its `kind` mark ("start" or "done")."""
    mark = marks / f"{i}.{kind}"
    return len(mark.read_text().split()) if mark.exists() else 0


def plain_chaos(state: Path, n: int, kills: int, seed: int = 0,
                gap: tuple[float, float] = (0.3, 2.0),
                slurm_job: str | None = None, policy: str = "marble") -> PlainResult:
    """`n` plain commands on 6 emulated GPUs (or as steps of Slurm job `slurm_job`) through
    `kills` SIGKILLed brokers (each restarted at once), then count the commands that
    completed twice or never."""
    rng = random.Random(seed)
    state.mkdir(parents=True, exist_ok=True)
    marks = state.parent / "marks"
    marks.mkdir(exist_ok=True)
    jobs = plain_workload(marks, n)
    result = PlainResult()
    t0 = time.monotonic()
    proc, _ = start(state, 1.0, slurm_job, policy)
    BrokerClient(socket_path(state)).post("/v1/jobs", {"jobs": jobs})
    while result.kills < kills:
        time.sleep(rng.uniform(*gap))
        if unfinished(state) == 0:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        result.kills += 1
        proc, _ = start(state, 1.0, slurm_job, policy)
    finish(state, proc, result.violations, "the last kill")
    result.seconds = time.monotonic() - t0
    con = sqlite3.connect(state / DB_NAME)
    con.row_factory = sqlite3.Row
    rows = {r["id"]: r for r in con.execute("SELECT * FROM jobs")}
    result.runs = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    result.adopted = con.execute("SELECT count(*) FROM events WHERE kind = 'adopted'"
                                 ).fetchone()[0]
    for job_id in range(1, n + 1):
        times = marked(marks, job_id, "done")
        result.completed_twice += times > 1
        result.started_twice += marked(marks, job_id, "start") > 1
        result.never_completed += times == 0
        row = rows.get(job_id)
        if row is None or row["state"] != "done":
            result.violations.append(f"job {job_id}: {row['state'] if row else 'missing'}")
    for run in con.execute("SELECT * FROM runs WHERE ended_at IS NULL"):
        result.violations.append(f"run {run['id']} still open")
    con.close()
    return result


@dataclass
class DiskResult:
    fills: int = 0  # times the state directory's disk was filled while jobs were unfinished
    refused: int = 0  # submissions answered 503 while it was full
    accepted_full: int = 0  # ... and answered 201 (the store could not have kept them)
    broker_died: int = 0  # the broker exited while the disk was full (I4: it must not)
    recovered_s: list[float] = field(default_factory=list)  # freed -> submissions accepted
    completed_twice: int = 0  # plain commands that ran to their end more than once
    started_twice: int = 0  # plain commands that began more than once
    held_by_nothing_s: float = 0.0  # GPU-seconds a run was recorded running after its exit
    chaos: ChaosResult = field(default_factory=ChaosResult)


def disk_chaos(root: Path, fills: int, plain: int, seed: int = 0, time_scale: float = 0.05,
               size: str = "4m", hold: tuple[float, float] = (0.5, 3.0),
               policy: str = "marble") -> DiskResult:
    """The job sets (emulated, step logs) and `plain` commands on a broker whose state
    directory is a `size` tmpfs (as root), filled `fills` times for `hold` seconds: check
    the job sets as `chaos` does, count the plain commands completed twice, the 503s and
    the broker's deaths, and how long a run's GPUs were recorded held after it exited; every
    broker runs `policy`. The jobs' own directories are elsewhere (a link): the fault is the
    broker's store's."""
    rng = random.Random(seed)
    state, jobs_dir, logs, marks = (root / n for n in ("state", "jobs", "steps", "marks"))
    for d in (state, jobs_dir, logs, marks):
        d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                    str(state)], check=True)
    try:
        (state / "jobs").symlink_to(jobs_dir)
        with left_clean(state):  # before the unmount: the runs are read from its store
            return _fill_while_running(state, logs, marks, fills, plain, rng, time_scale, hold,
                                       policy)
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def _fill_while_running(state: Path, logs: Path, marks: Path, fills: int, plain: int,
                        rng: random.Random, time_scale: float,
                        hold: tuple[float, float], policy: str) -> DiskResult:
    result = DiskResult()
    jobs = workload(logs, time_scale)
    plain_jobs = plain_workload(marks, plain)
    t0 = time.monotonic()
    proc, _ = start(state, time_scale, policy=policy)
    client = BrokerClient(socket_path(state), timeout=10)
    client.post("/v1/jobs", {"jobs": jobs + plain_jobs})
    probe = {"gpus": 1, "command": ["true"], "name": "probe"}
    while result.fills < fills and unfinished(state):
        time.sleep(rng.uniform(0.2, 1.5))
        filler = state / "filler"
        # to the last byte the tmpfs has; unbuffered, so that no byte is left for close()
        with open(filler, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass
        result.fills += 1
        time.sleep(0.3)  # the next commit finds the disk full
        try:
            client.post("/v1/jobs", {**probe, "name": f"probe{result.fills}"})
            result.accepted_full += 1
        except ApiError as exc:
            result.refused += exc.status == 503
        except OSError:
            pass
        time.sleep(rng.uniform(*hold))
        if proc.poll() is not None:
            result.broker_died += 1
        filler.unlink()
        freed = time.monotonic()
        if proc.poll() is not None:
            proc, _ = start(state, time_scale, policy=policy)
            client = BrokerClient(socket_path(state), timeout=10)
        while time.monotonic() - freed < 60:
            try:
                client.post("/v1/jobs", {**probe, "name": f"after{result.fills}"})
                result.recovered_s.append(time.monotonic() - freed)
                break
            except ApiError:
                time.sleep(0.1)
    finish(state, proc, result.chaos.violations, "the last fill")
    result.chaos.seconds = time.monotonic() - t0
    check(state, jobs, logs, result.chaos)
    con = sqlite3.connect(state / DB_NAME)
    con.row_factory = sqlite3.Row
    first_plain = len(jobs) + 1
    for i in range(1, plain + 1):
        mark = marks / f"{i}.done"
        times = marked(marks, i, "done")
        result.completed_twice += times > 1
        result.started_twice += marked(marks, i, "start") > 1
        if times == 0:
            result.chaos.violations.append(f"plain command {i} never completed")
        (ended,) = con.execute("SELECT max(ended_at) FROM runs WHERE job_id = ?",
                               (first_plain + i - 1,)).fetchone()
        if times and ended is not None:  # the mark is written just before the command exits
            result.held_by_nothing_s += max(0.0, ended - mark.stat().st_mtime - 1.0)
    con.close()
    return result


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
    ap.add_argument("--plain", type=int, default=0, metavar="N",
                    help="N plain commands (no worker protocol) instead of the job sets")
    ap.add_argument("--slurm-job", metavar="J",
                    help="with --plain: every run a job step of the running Slurm job J "
                         "(srun), not a process on 6 emulated GPUs")
    ap.add_argument("--policy", default="marble", choices=sorted(POLICIES),
                    help="every broker's policy (kills, --plain and --disk-full)")
    ap.add_argument("--broker-flags", default="", metavar="FLAGS",
                    help="more marbled flags for every broker, e.g. --policy malleable "
                         "--broker-flags '--preempt-guard 0': malleable then reshapes runs "
                         "of any length (with its 300 s guard, none of these job sets')")
    ap.add_argument("--disk-full", type=int, default=0, metavar="N",
                    help="fill the state directory's disk (a tmpfs: as root) N times while "
                         "the job sets and --plain commands run, instead of kills")
    args = ap.parse_args()
    BROKER_FLAGS[:] = shlex.split(args.broker_flags)
    summaries = []
    if args.disk_full:
        for seed in args.seed:
            with tempfile.TemporaryDirectory(prefix="marble-disk-") as tmp:
                d = disk_chaos(Path(tmp), args.disk_full, args.plain, seed, args.time_scale,
                               policy=args.policy)
            summaries.append({
                "seed": seed, "fills": d.fills, "refused_503": d.refused,
                "accepted_while_full": d.accepted_full, "broker_died": d.broker_died,
                "recovered_median_s": round(statistics.median(d.recovered_s), 2)
                if d.recovered_s else None, "runs": d.chaos.runs,
                "completed_twice": d.completed_twice, "started_twice": d.started_twice,
                "gpu_seconds_held_by_nothing": round(d.held_by_nothing_s, 2),
                "seconds": round(d.chaos.seconds, 1), "violations": d.chaos.violations[:20]})
            print(json.dumps(summaries[-1], indent=1), flush=True)
        sys.exit(1 if any(s["violations"] or s["completed_twice"] or s["started_twice"]
                          or s["broker_died"] for s in summaries) else 0)
    if args.plain:
        for seed in args.seed:
            with tempfile.TemporaryDirectory(prefix="marble-chaos-") as tmp, \
                    left_clean(Path(tmp) / "state"):
                p = plain_chaos(Path(tmp) / "state", args.plain, args.kills, seed,
                                slurm_job=args.slurm_job, policy=args.policy)
            summaries.append({
                "seed": seed, "jobs": args.plain, "kills": p.kills, "runs": p.runs,
                "adopted": p.adopted, "completed_twice": p.completed_twice,
                "started_twice": p.started_twice,
                "never_completed": p.never_completed, "seconds": round(p.seconds, 1),
                "violations": p.violations[:20]})
            print(json.dumps(summaries[-1], indent=1), flush=True)
        sys.exit(1 if any(s["violations"] or s["completed_twice"] or s["started_twice"]
                          for s in summaries) else 0)
    for seed in args.seed:
        with tempfile.TemporaryDirectory(prefix="marble-chaos-") as tmp, \
                left_clean(Path(tmp) / "state"):
            r = chaos(Path(tmp) / "state", args.kills, seed, args.time_scale,
                      (0.05, args.max_gap), args.policy)
        summaries.append({
            "seed": seed, "kills": r.kills, "runs": r.runs, "adopted": r.adopted,
            "suspensions": r.suspensions,
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
