"""End to end, side by side in one run: marbled against HyperQueue on trivial jobs, the paper's
job sets through the real daemon beside the simulator, and (when the Slurm test cluster is up)
job set 3 packed by hand with `srun --exact` steps beside marbled's Slurm launcher.

1. Trivial jobs on 6 slots: `true` x1000 and `sleep 0.1` x200, through a real marbled
   (`--gpus 6` emulated GPUs, `--gpus 1` jobs, one batch POST) and through HyperQueue
   (`hyperqueue.cluster.LocalCluster`: the server and one worker with 6 CPUs in this process,
   one task per CPU, HyperQueue's default per-task stdout/stderr files, as marbled keeps
   per-run logs). Each system is warmed up by one job first. Per system: wall time from the
   submission to the last end, jobs/s, the scheduler's own CPU time per job (marbled's: the
   broker and its shared supervisor, which starts the runs; HyperQueue's: this process,
   its server and worker), and how many jobs ran at once. Concurrency is sampled the same
   way for both: a separate process counts the scheduler's descendants named as the
   command every --sample-ms (a lower
   bound for `true`, whose processes live about 1 ms; the time-average of the samples is
   the mean concurrency). For marbled the runs table gives it exactly as well (from the
   broker's launch decision to its recording of the exit). HyperQueue's Python API gives
   no task times: its "last end" is when `wait_for_jobs` returns.
2. Paper job sets 1-3 (Table II) through two real brokers, the MARBLE way (`marble`) and the
   LSF way (`rigid`), emulated jobs at --time-scale, beside `Simulator`'s prediction and the
   paper (benchmarks/paper_jobsets.py).
3. With the Slurm test cluster up (`bash tests/slurm/cluster.sh up`, as root): job set 3
   in one allocation of 6 GPUs, packed by hand (a shell script: every job an
   `srun --exact` step, all started at once, Slurm holding a step until its GPUs are
   free; each job on its profile's fastest count, and all on 3 GPUs) beside marbled's
   Slurm launcher (policies marble and rigid), and the simulator. Skipped, saying so,
   when no cluster answers.

    .venv/bin/python benchmarks/end_to_end.py [--repeat 3] [--jobsets 1,2,3]
        [--time-scale 0.02] [--slurm auto|on|off] [--slurm-time-scale 0.05] [--json out.json]
    .venv/bin/python benchmarks/end_to_end.py --smoke     # CI: a few seconds, no Slurm

--only trivial|jobsets|slurm (repeatable) runs some parts. Every figure is printed with the
machine's load (`uptime`): the trivial-job figures depend on free cores.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from marbled.cli.client import BrokerClient
from marbled.core.policy import get_policy
from marbled.demo import start_broker
from marbled.paths import DB_NAME, socket_path
from marbled.resources import load_job_file, load_profile, workload_path
from marbled.sim.engine import Simulator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paper_jobsets import measure as measure_jobsets  # noqa: E402
from paper_jobsets import print_table as print_jobsets  # noqa: E402

FINAL = {"done", "failed", "cancelled"}
SLOTS = 6
TRIVIAL = {"true": (["true"], 1000), "sleep 0.1": (["sleep", "0.1"], 200)}
TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- the machine and its load

def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> dict:
    model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f
                      if line.startswith("model name")), "")
    hq = None
    with contextlib.suppress(ImportError):
        from hyperqueue.ffi import get_version
        hq = get_version()
    return {"cpus": os.cpu_count(), "cpu_model": model, "kernel": platform.release(),
            "python": platform.python_version(), "hyperqueue": hq,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "load_at_start": load_avg()}


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads; not its children)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def broker_cpu_seconds(pid: int) -> tuple[float, float]:
    """cpu_seconds of a broker, and of its shared supervisor (marbled.batch.spawner), which
    starts and reaps the runs, as HyperQueue's worker does in its figure."""
    supervisor = 0.0
    for child in _children(pid):
        with contextlib.suppress(OSError):
            if b"shared_supervisor.py" in Path(f"/proc/{child}/cmdline").read_bytes():
                supervisor += cpu_seconds(int(child))
    return cpu_seconds(pid), supervisor


# ---------------------------------------------------------------- concurrency sampler

def _children(pid: int) -> list[str]:
    out: list[str] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
            out.extend(f.read().split())
    return out


def count_running(pid: int, name: str, depth: int = 2) -> int:
    """Descendants of `pid` (to `depth`) whose command name is `name`."""
    n, frontier = 0, [pid]
    for _ in range(depth):
        deeper = []
        for parent in frontier:
            for child in _children(parent):
                try:
                    with open(f"/proc/{child}/comm") as f:
                        comm = f.read().strip()
                except OSError:
                    continue
                if comm == name:
                    n += 1
                else:
                    deeper.append(int(child))
        frontier = deeper
    return n


def sample_main(pid: int, name: str, interval: float) -> None:
    """The sampler process: count until SIGTERM, then print the counts' summary as JSON."""
    stop = False

    def on_term(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    print("ready", flush=True)  # the SIGTERM of a short run must not find the default handler
    counts: dict[int, int] = {}
    first = last = None  # the sampled span: first to last sample with a job running
    last_seen = None
    samples = []
    while not stop:
        n = count_running(pid, name)
        samples.append(n)
        counts[n] = counts.get(n, 0) + 1
        if n:
            last, last_seen = len(samples), time.time()
            first = first or last
        time.sleep(interval)
    busy = samples[first - 1:last] if first else []
    print(json.dumps({"samples": len(samples), "max": max(samples, default=0),
                      "mean_busy": statistics.fmean(busy) if busy else 0.0,
                      "last_seen": last_seen, "histogram": counts}))


class Sampler:
    def __init__(self, pid: int, name: str, interval_ms: float):
        self.proc = None
        if interval_ms > 0:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, "--_sample", str(pid), name, str(interval_ms / 1000)],
                stdout=subprocess.PIPE, text=True)
            self.proc.stdout.readline()  # "ready": it counts, and a SIGTERM stops it cleanly

    def stop(self) -> dict | None:
        if not self.proc:
            return None
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=30)
        return json.loads(out)


# ---------------------------------------------------------------- trivial jobs

def _sweep(intervals: list[tuple[float, float]]) -> tuple[int, float]:
    """(most at once, mean at once over first start .. last end) of closed intervals."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                   key=lambda x: (x[0], x[1]))  # an end before a start at the same instant
    most = now = 0
    for _, d in edges:
        now += d
        most = max(most, now)
    span = max(e for _, e in intervals) - min(s for s, _ in intervals)
    return most, (sum(e - s for s, e in intervals) / span if span > 0 else float(most))


def _last(sampled: dict | None, t0: float) -> float | None:
    return sampled["last_seen"] - t0 if sampled and sampled["last_seen"] else None


def trivial_marbled(command: list[str], n: int, tmp: Path, sample_ms: float) -> dict:
    state = tmp / "marbled"
    proc = start_broker(state, "marble", SLOTS, 1.0)
    client = BrokerClient(socket_path(state), timeout=300)

    def wait_all() -> float:
        # the long poll `marble wait` makes: answered as the last job ends, and no CPU of
        # the broker's before (a status poll every 20 ms counted in its CPU a job)
        while not client.get("/v1/wait?timeout=60")["ended"]:
            pass
        return time.time()

    try:
        client.post("/v1/jobs", {"gpus": 1, "command": ["true"], "name": "warm-up"})
        wait_all()
        sampler = Sampler(proc.pid, Path(command[0]).name, sample_ms)
        (broker0, supervisor0), load0 = broker_cpu_seconds(proc.pid), load_avg()
        t0 = time.time()
        ids = [j["id"] for j in client.post(
            "/v1/jobs", {"jobs": [{"gpus": 1, "command": command}] * n})["jobs"]]
        accepted = time.time()
        seen = wait_all()
        broker, supervisor = broker_cpu_seconds(proc.pid)
        broker, supervisor = broker - broker0, supervisor - supervisor0
        cpu = broker + supervisor
        sampled = sampler.stop()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    con = sqlite3.connect(state / DB_NAME)
    runs = con.execute(f"SELECT started_at, ended_at FROM runs WHERE job_id >= {min(ids)}"
                       ).fetchall()
    states = dict(con.execute(f"SELECT state, count(*) FROM jobs WHERE id >= {min(ids)} "
                              "GROUP BY state").fetchall())
    con.close()
    last_end = max(e for _, e in runs)
    most, mean = _sweep(runs)
    return {"system": "marbled", "jobs": n, "wall_s": last_end - t0,
            "jobs_per_s": n / (last_end - t0), "sampled_last_s": _last(sampled, t0),
            "submit_s": accepted - t0, "first_start_s": min(s for s, _ in runs) - t0,
            "seen_done_s": seen - t0, "cpu_ms_per_job": 1000 * cpu / n,
            "supervisor_cpu_ms_per_job": 1000 * supervisor / n,
            "cpu_share": cpu / (last_end - t0), "most_at_once": most, "mean_at_once": mean,
            "sampled": sampled, "not_done": {k: v for k, v in states.items() if k != "done"},
            "load": load0}


@contextlib.contextmanager
def fd1_to_devnull():
    """HyperQueue's server prints its info table on fd 1 (from Rust): keep it off our output."""
    sys.stdout.flush()
    saved = os.dup(1)
    with open(os.devnull, "wb") as null:
        os.dup2(null.fileno(), 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def trivial_hq(command: list[str], n: int, tmp: Path, sample_ms: float) -> dict:
    from hyperqueue import Job
    from hyperqueue.cluster import LocalCluster, WorkerConfig

    work = tmp / "hq-work"
    work.mkdir(parents=True, exist_ok=True)
    with fd1_to_devnull():
        cluster = LocalCluster(str(tmp / "hq-server"))
        cluster.start_worker(WorkerConfig(cores=SLOTS))
    try:
        client = cluster.client()

        def run(job: Job) -> int:
            submitted = client.submit(job)
            failed = client.connection.wait_for_jobs([submitted.id], lambda _: None)
            return len(failed)

        warm = Job(default_workdir=work)
        warm.program(["true"])
        run(warm)  # the worker has registered and run a task
        job = Job(default_workdir=work, max_fails=None)
        tasks = [job.program(command) for _ in range(n)]
        # wait_for_jobs answers on a 1 s tick: the last end is when this task, which needs
        # all the others, starts (HyperQueue's reaction to the last end included)
        marker = tmp / "hq-last-end"
        job.program(["sh", "-c", "date +%s.%N"], deps=tasks, stdout=str(marker))
        sampler = Sampler(os.getpid(), Path(command[0]).name, sample_ms)
        cpu0, load0 = cpu_seconds(os.getpid()), load_avg()
        t0 = time.time()
        failed = run(job)
        seen = time.time()
        end = float(marker.read_text())
        cpu = cpu_seconds(os.getpid()) - cpu0
        sampled = sampler.stop()
    finally:
        with fd1_to_devnull():
            cluster.stop()
    return {"system": "hyperqueue", "jobs": n, "wall_s": end - t0, "jobs_per_s": n / (end - t0),
            "seen_done_s": seen - t0, "sampled_last_s": _last(sampled, t0),
            "cpu_ms_per_job": 1000 * cpu / n, "cpu_share": cpu / (end - t0),
            "most_at_once": None, "mean_at_once": None, "sampled": sampled,
            "not_done": {"failed jobs": failed} if failed else {}, "load": load0}


def trivial(repeat: int, counts: dict[str, int], sample_ms: float) -> list[dict]:
    rows = []
    for label, (command, _) in TRIVIAL.items():
        for i in range(repeat):
            # alternate who goes first, so neither always runs on the warmer machine
            order = (trivial_marbled, trivial_hq) if i % 2 == 0 else (trivial_hq, trivial_marbled)
            for fn in order:
                with tempfile.TemporaryDirectory(prefix="marble-e2e-") as tmp:
                    row = fn(command, counts[label], Path(tmp), sample_ms)
                rows.append({"workload": label, "repeat": i} | row)
                print_trivial_row(rows[-1])
    return rows


def _fmt_sampled(s: dict | None) -> str:
    return f"{s['max']:>3} {s['mean_busy']:>5.1f}" if s else f"{'-':>3} {'-':>5}"


def print_trivial_header() -> None:
    print(f"{'workload':<10} {'system':<11} {'jobs':>5} {'wall s':>7} {'jobs/s':>7} "
          f"{'cpu ms/job':>10} {'runs: max':>9} {'mean':>5}  {'sampled: max':>12} "
          f"{'mean':>5}  load")


def print_trivial_row(r: dict) -> None:
    most = f"{r['most_at_once']:>9} {r['mean_at_once']:>5.1f}" if r["most_at_once"] else \
        f"{'-':>9} {'-':>5}"
    bad = f"  NOT DONE {r['not_done']}" if r["not_done"] else ""
    print(f"{r['workload']:<10} {r['system']:<11} {r['jobs']:>5} {r['wall_s']:>7.2f} "
          f"{r['jobs_per_s']:>7.1f} {r['cpu_ms_per_job']:>10.2f} {most}  "
          f"{_fmt_sampled(r['sampled']):>18}  {r['load']}{bad}", flush=True)


def trivial_summary(rows: list[dict]) -> list[dict]:
    out = []
    for label in TRIVIAL:
        for system in ("marbled", "hyperqueue"):
            mine = [r for r in rows if r["workload"] == label and r["system"] == system]
            if not mine:
                continue
            rates = [r["jobs_per_s"] for r in mine]
            sampled = [r["sampled"]["max"] for r in mine if r["sampled"]]
            out.append({"workload": label, "system": system, "jobs": mine[0]["jobs"],
                        "jobs_per_s_median": statistics.median(rates),
                        "jobs_per_s_range": [min(rates), max(rates)],
                        "cpu_ms_per_job_median": statistics.median(r["cpu_ms_per_job"]
                                                                   for r in mine),
                        "most_at_once_runs": max((r["most_at_once"] or 0) for r in mine) or None,
                        "most_at_once_sampled": max(sampled) if sampled else None,
                        "loads": [r["load"] for r in mine]})
    return out


# ---------------------------------------------------------------- Slurm: srun by hand

def slurm_up() -> str | None:
    """None if the Slurm test cluster answers with idle nodes, else why not."""
    if not shutil.which("srun") or not shutil.which("sinfo"):
        return "no srun/sinfo on PATH"
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                              timeout=10)
    except subprocess.TimeoutExpired:
        return "sinfo timed out (no slurmctld answering)"
    states = done.stdout.split()
    if done.returncode != 0 or not any(s.startswith(("idle", "mix")) for s in states):
        return f"no idle Slurm node (sinfo: {done.stderr.strip() or ' '.join(states) or '-'})"
    return None


ALLOC = ("--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=12", "--gres=gpu:6")


def fastest_gpus(spec) -> int:
    """The GPU count a user without a broker would first ask for: the profile's fastest."""
    return min(load_profile().lookup(spec.model).optimal_gpus(), SLOTS)


# How the user picks each job's GPU count: the profile's fastest, or half the node for all
# (so that two jobs run side by side: a choice that needs knowing the whole job set).
BY_HAND = {"fastest count": fastest_gpus, "3 GPUs each": lambda spec: SLOTS // 2}


def by_hand_script(specs, counts: list[int], time_scale: float, workdir: Path) -> str:
    """What a user without a broker writes: each job one step on a GPU count of its own,
    all started at once; Slurm starts a step when its GPUs are free."""
    lines = ["#!/bin/bash", "# job set 3 packed by hand: one srun --exact step per job",
             'echo "start $(date +%s.%N)"']
    for i, (spec, gpus) in enumerate(zip(specs, counts, strict=True)):
        lines.append(
            f"MARBLE_CHECKPOINT_DIR={workdir}/ckpt{i} srun --exact -n1 -c2 --gres=gpu:{gpus} "
            f"{sys.executable} -m marbled.worker.emulate --model {spec.model} "
            f"--steps {spec.steps} --time-scale {time_scale} &")
    lines += ["wait", 'echo "end $(date +%s.%N)"']
    return "\n".join(lines) + "\n"


def slurm_by_hand(how: str, time_scale: float, tmp: Path) -> dict:
    specs = load_job_file(workload_path("paper-jobset3"))
    counts = [BY_HAND[how](s) for s in specs]
    work = tmp / f"by-hand-{list(BY_HAND).index(how)}"
    work.mkdir()
    script = work / "by-hand.sh"
    script.write_text(by_hand_script(specs, counts, time_scale, work))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    load0 = load_avg()
    done = subprocess.run(["salloc", "--job-name=by-hand", *ALLOC, "bash", str(script)],
                          capture_output=True, text=True, timeout=3600, env=env, cwd=work)
    marks = dict(re.findall(r"^(start|end) ([\d.]+)$", done.stdout, re.M))
    if done.returncode != 0 or set(marks) != {"start", "end"}:
        raise RuntimeError(f"by-hand script failed ({done.returncode}): {done.stderr[-2000:]}")
    wall = float(marks["end"]) - float(marks["start"])
    retries = done.stderr.count("temporarily disabled")
    # its prediction: the same jobs made rigid on those counts, FIFO (no suspension)
    fixed = [dataclasses.replace(s, gpus=g) for s, g in zip(specs, counts, strict=True)]
    simulated = Simulator(load_profile(), get_policy("marble"), SLOTS).run(fixed).makespan
    return {"way": f"srun --exact by hand, {how}", "makespan_s": wall / time_scale,
            "real_s": wall, "simulated_s": simulated, "gpus": counts, "step_retries": retries,
            "script": script.read_text(), "load": load0}


def slurm_marbled(policy: str, time_scale: float, tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    done = subprocess.run(["salloc", "--no-shell", "--job-name=marbled", *ALLOC],
                          capture_output=True, text=True, timeout=60, check=True, env=env)
    job = re.search(r"Granted job allocation (\d+)", done.stderr).group(1)
    env["SLURM_JOB_ID"] = job
    state = tmp / f"state-{policy}"
    load0 = load_avg()
    proc = None
    try:
        proc = start_broker(state, policy, None, time_scale, ("--launcher", "slurm"), env)
        client = BrokerClient(socket_path(state))
        specs = load_job_file(workload_path("paper-jobset3"))
        t0 = time.time()
        client.post("/v1/jobs", {"jobs": [s.to_mapping() for s in specs]})
        deadline = time.monotonic() + 3600
        while time.monotonic() < deadline:
            jobs = client.get("/v1/jobs")["jobs"]
            if all(j["state"] in FINAL for j in jobs):
                break
            time.sleep(0.1)
        runs = client.get("/v1/runs")["runs"]
        first = min(r["started_at"] for r in runs)
        last = max(r["ended_at"] for r in runs)
        failed = [j["id"] for j in jobs if j["state"] != "done"]
        client.post("/v1/shutdown")
        proc.wait(timeout=120)
    finally:
        if proc and proc.poll() is None:
            proc.kill()
        subprocess.run(["scancel", job], check=False)
    return {"way": f"marbled --launcher slurm --policy {policy}", "makespan_s":
            (last - first) / time_scale, "real_s": last - first,
            "submit_to_end_s": (last - t0) / time_scale, "runs": len(runs),
            "failed": failed, "load": load0}


def slurm_part(time_scale: float) -> list[dict]:
    specs = load_job_file(workload_path("paper-jobset3"))
    book = load_profile()
    rows = []
    with tempfile.TemporaryDirectory(prefix="marble-e2e-slurm-") as tmp:
        for how in BY_HAND:
            rows.append(slurm_by_hand(how, time_scale, Path(tmp)))
            print_slurm_row(rows[-1])
        for policy in ("marble", "rigid"):
            rows.append(slurm_marbled(policy, time_scale, Path(tmp)))
            rows[-1]["simulated_s"] = Simulator(book, get_policy(policy), SLOTS).run(
                specs).makespan
            print_slurm_row(rows[-1])
    return rows


def print_slurm_row(r: dict) -> None:
    sim = f"{r['simulated_s']:>9.0f}" if "simulated_s" in r else f"{'-':>9}"
    print(f"{r['way']:<40} {r['makespan_s']:>9.0f} {sim} {r['real_s']:>7.1f}  {r['load']}",
          flush=True)


# ---------------------------------------------------------------- main

def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--_sample":
        sample_main(int(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help="CI: 50 `true` and 20 `sleep 0.1` jobs each way once, job set 3 at "
                         "time scale 0.005, no Slurm")
    ap.add_argument("--repeat", type=int, default=3, help="repeats of each trivial workload")
    ap.add_argument("--true-jobs", type=int, default=1000)
    ap.add_argument("--sleep-jobs", type=int, default=200)
    ap.add_argument("--sample-ms", type=float, default=1.0,
                    help="concurrency sampling interval (0: no sampler)")
    ap.add_argument("--jobsets", default="1,2,3")
    ap.add_argument("--jobset-repeat", type=int, default=1)
    ap.add_argument("--time-scale", type=float, default=0.02)
    ap.add_argument("--slurm", choices=("auto", "on", "off"), default="auto",
                    help="auto: run part 3 when the Slurm test cluster answers")
    ap.add_argument("--slurm-time-scale", type=float, default=0.05)
    ap.add_argument("--only", action="append", choices=("trivial", "jobsets", "slurm"))
    ap.add_argument("--json", help="write every figure to this file")
    args = ap.parse_args()
    if args.smoke:
        args.repeat, args.true_jobs, args.sleep_jobs = 1, 50, 20
        args.jobsets, args.jobset_repeat, args.time_scale = "3", 1, 0.005
        if args.slurm == "auto":
            args.slurm = "off"
    parts = set(args.only or ("trivial", "jobsets", "slurm"))
    out = {"machine": machine(), "args": vars(args)}
    m = out["machine"]
    print(f"machine: {m['cpus']} CPUs ({m['cpu_model']}), Linux {m['kernel']}, Python "
          f"{m['python']}, HyperQueue {m['hyperqueue']}; {m['date']}; load {m['load_at_start']}")
    ok = True

    if "trivial" in parts:
        counts = {"true": args.true_jobs, "sleep 0.1": args.sleep_jobs}
        print(f"\n== 1. trivial jobs on {SLOTS} slots (marbled --gpus {SLOTS}, --gpus 1 jobs, "
              f"one batch POST; HyperQueue local server + worker, {SLOTS} CPUs), "
              f"{args.repeat} repeat(s)")
        print("   runs: from marbled's runs table; sampled: child processes every "
              f"{args.sample_ms:g} ms (a lower bound for `true`); load: 1/5/15-min uptime")
        print_trivial_header()
        rows = trivial(args.repeat, counts, args.sample_ms)
        out["trivial"] = rows
        out["trivial_summary"] = trivial_summary(rows)
        print("\nmedian jobs/s (range)   most at once (runs table / sampled)")
        for s in out["trivial_summary"]:
            lo, hi = s["jobs_per_s_range"]
            print(f"  {s['workload']:<10} x{s['jobs']:<5} {s['system']:<11} "
                  f"{s['jobs_per_s_median']:>7.1f} ({lo:.1f}-{hi:.1f})   "
                  f"{s['most_at_once_runs'] or '-'} / {s['most_at_once_sampled'] or '-'}   "
                  f"cpu {s['cpu_ms_per_job_median']:.2f} ms/job")
        ok &= not any(r["not_done"] for r in rows)

    if "jobsets" in parts:
        sets = [int(n) for n in args.jobsets.split(",")]
        print(f"\n== 2. paper job sets {args.jobsets}: real brokers on {SLOTS} emulated GPUs, "
              f"emulated jobs at time scale {args.time_scale}, in profiled seconds "
              f"(median of {args.jobset_repeat}); load {load_avg()}")
        rows = measure_jobsets(sets, args.jobset_repeat, args.time_scale)
        print_jobsets(rows)
        out["jobsets"] = rows
        ok &= not any(r["failed"] for r in rows)

    if "slurm" in parts and args.slurm != "off":
        why = slurm_up()
        print(f"\n== 3. job set 3 in one Slurm allocation of {SLOTS} GPUs, emulated jobs at "
              f"time scale {args.slurm_time_scale}")
        if why:
            msg = (f"SKIPPED: the Slurm test cluster is not up ({why}); start it with "
                   "`bash tests/slurm/cluster.sh up` as root")
            print(msg)
            out["slurm"] = {"skipped": msg}
            ok &= args.slurm != "on"
        else:
            print(f"{'way':<40} {'makespan':>9} {'simulated':>9} {'real s':>7}  load")
            rows = slurm_part(args.slurm_time_scale)
            out["slurm"] = rows
            ok &= not any(r.get("failed") for r in rows)

    out["load_at_end"] = load_avg()
    print(f"\nload at end: {out['load_at_end']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
