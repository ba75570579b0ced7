"""Suspend and resume costs of real training jobs, measured through the real daemon.

For each framework and model, one job runs as a secondary on 1 of 2 emulated GPUs
(a rigid filler holds the other) and is suspended (`POST /v1/jobs/{id}/suspend`)
--cycles times; each time it checkpoints, exits, and is relaunched at once. From the broker's
SQLite log and the job's start-up marks it reports medians of:

  suspend    SIGTSTP sent -> acknowledgement written (step boundary + checkpoint save)
  save       the checkpoint save alone (as the job timed it)
  exit       acknowledgement -> process gone (teardown)
  relaunch   process gone -> next run launched (the broker's reaction)
  resume     launch -> first step completed, split into python start, framework
             import, model build, restore, first step
  gap        SIGTSTP sent -> first step of the resumed run (what the GPUs sit idle)

DDP rows (`--ddp-ranks`, `--ddp-rows`, issue 25): train_ddp.py as a --per-gpu job whose
best count is N, gloo on the CPU. "cold": the only job on N emulated GPUs, suspended and
resumed at once on N ranks with --prestart off; "at suspend": the same with prestart, whose
N ranks start only at the suspension; "promoted": a secondary on N-1 GPUs (a rigid filler
holds one), whose next run's N ranks start ahead, promoted to N by the filler's cancel
once they wait in ready() (one promotion per broker, --cycles brokers); "miss": the same
secondary suspended and resumed on N-1, so that the go takes N-1 of the N ranks started
ahead (the last exits). Then the stop agreement's cost per step, as benchmarks/ddp_agreement.py
measures it, for N >= 2.

    .venv/bin/python benchmarks/suspend_resume.py [--cycles 5] [--framework [tf torch]]
        [--arch lenet resnet] [--ddp-ranks [1 2 4]] [--ddp-rows cold suspend promotion miss]
        [--agreement-steps 1000]
        [--prestart ahead|suspend|off] [--run-seconds 6] [--slow-exit]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # benchmarks.* from the checkout (PYTHONPATH wins)

from benchmarks.ddp_agreement import measure as measure_agreement  # noqa: E402
from benchmarks.ddp_agreement import steps_for  # noqa: E402
from marbled import examples  # noqa: E402
from marbled.cli.client import BrokerClient  # noqa: E402
from marbled.demo import start_broker  # noqa: E402
from marbled.paths import DB_NAME, socket_path  # noqa: E402
from marbled.worker.protocol import PROGRESS_FILE, STANDBY_VAR, read_json  # noqa: E402

SCRIPTS = {fw: examples.SCRIPTS / examples.EXAMPLES[fw].file for fw in ("tf", "torch")}
DDP_SCRIPT = examples.SCRIPTS / examples.EXAMPLES["ddp"].file
PHASES = ("python", "imported", "built", "restored", "first_step")
# DDP rows: (label, --prestart for it (None: the command line's), how measure_ddp runs it)
DDP_ROWS = {"cold": ("ddp/{n} cold", "off", "alone"),
            "suspend": ("ddp/{n} at suspend", None, "alone"),
            "promotion": ("ddp/{m}->{n} promoted", None, "promotion"),
            "miss": ("ddp/{n}->{m} miss", None, "miss")}
DDP_ONE = ("cold", "suspend")  # the rows that 1 rank has (the others need a second GPU)


def progress(state: Path, job: int) -> dict:
    return read_json(state / "jobs" / str(job) / PROGRESS_FILE) or {}


def wait_first_step(client: BrokerClient, state: Path, job: int, after_run: int | None,
                    timeout: float = 300) -> int:
    """Wait until a run newer than `after_run` has trained a few steps; its run id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = progress(state, job)
        run = p.get("run_id")
        if run and run != after_run and "first_step" in p.get("phases", {}) \
                and p["step"] >= (p.get("start_step") or 0) + 3:
            return run
        time.sleep(0.05)
    raise RuntimeError(f"job {job} did not resume within {timeout} s; see {state}")


def process_environ(pid: int | str) -> dict[str, str]:
    """A process's environment as it was at exec ({} if it is gone or not ours)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def standby_ranks(job_dir: Path) -> dict[int, int]:
    """pid -> rank of the prestarted ranks of the job in `job_dir` still running (what their
    environment at exec names as their go file), waiting or since given a run."""
    found = {}
    for entry in os.listdir("/proc"):
        go = Path(process_environ(entry).get(STANDBY_VAR, "/"))
        rank = re.fullmatch(r"go-\d+-rank-(\d+)\.json", go.name)
        if go.parent == job_dir and rank and not gone(int(entry)):
            found[int(entry)] = int(rank[1])
    return found


def gone(pid: int) -> bool:
    """The process ended (a zombie no one has reaped yet counts as ended)."""
    fields = _stat(pid)
    return not fields or fields[0] == "Z"


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields from the state on (field 3 is [0]); [] if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return []


def cpu_seconds(pid: int) -> float:
    """The CPU time a process has used (0 if it is gone)."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else 0.0


def newest_standby(job_dir: Path) -> list[int]:
    """The ranks of the job's newest prestarted process: the running run's may have been
    prestarted too, and its ranks still name their go files."""
    by_parent: dict[int, list[int]] = {}
    for pid in standby_ranks(job_dir):
        if fields := _stat(pid):
            by_parent.setdefault(int(fields[1]), []).append(pid)
    started = {parent: int(f[19]) if (f := _stat(parent)) else -1 for parent in by_parent}
    return by_parent[max(started, key=started.get)] if by_parent else []


def wait_standby_idle(job_dir: Path, ranks: int, timeout: float = 300) -> float:
    """Wait until `ranks` prestarted ranks of the job's next run wait in ready() (each used
    under 1% of a core over two seconds: imports done); the seconds waited."""
    t0 = deadline = time.monotonic()
    deadline += timeout
    while time.monotonic() < deadline:
        pids = newest_standby(job_dir)
        before = [cpu_seconds(pid) for pid in pids]
        time.sleep(2.0)
        if len(pids) == ranks and all(cpu_seconds(pid) - used < 0.02
                                      for pid, used in zip(pids, before, strict=True)):
            return time.monotonic() - t0
    raise RuntimeError(f"no {ranks} idle prestarted ranks in {job_dir} within {timeout} s")


def checkpoint_bytes(ckpt_dir: Path) -> int:
    """Size of the newest checkpoint (TF: ckpt-N.* files; torch: the newest .pt)."""
    files = sorted((p for p in ckpt_dir.iterdir() if p.name.startswith("ckpt-")),
                   key=lambda p: p.stat().st_mtime)
    if not files:
        return 0
    newest = files[-1].name.split(".")[0]
    return sum(p.stat().st_size for p in files if p.name.split(".")[0] == newest)


def measure(framework: str, arch: str, cycles: int, prestart: str, run_seconds: float,
            job_args: tuple[str, ...] = ()) -> dict:
    model = "lenet" if arch == "lenet" else "resnet-50"
    job = {"model": model, "steps": 10**9, "command": [
        sys.executable, str(SCRIPTS[framework]), "--arch", arch, "--steps", str(10**9),
        *job_args]}
    # 2 GPUs, one held by a rigid filler: the job (optimal 2) runs as a secondary on
    # the other, the kind of run MARBLE suspends, and stays one after each resume.
    return cycle(job, 2, ("--prestart", prestart), cycles, run_seconds, filler=True)


def measure_ddp(world: int, cycles: int, prestart: str, run_seconds: float,
                how: str = "alone") -> dict:
    """train_ddp.py as a per-GPU job (a profile whose best count is `world`, on `world`
    GPUs). `how`: "alone", the only job, each suspension resumes it at once on its `world`
    ranks; "miss", a rigid filler holds one GPU: a secondary on `world` - 1, whose next
    run's `world` ranks (its best count) start ahead and the go takes `world` - 1;
    "promotion", the same secondary, promoted to `world` ranks when the filler is
    cancelled once those ranks wait (one promotion per broker, `cycles` brokers)."""
    with tempfile.TemporaryDirectory(prefix="marble-bench-ddp-") as tmp:
        profile = Path(tmp) / "ddp.yaml"
        curve = [round(1 + 0.9 * g, 2) for g in range(world)]  # rising: the best is all
        profile.write_text(f"system: ddp\ngpus_per_node: {world}\n"
                           f"models:\n  ddp: {{steps_per_second: {curve}}}\n")
        job = {"model": "ddp", "steps": 10**9, "per_gpu": True, "command": [
            sys.executable, str(DDP_SCRIPT), "--steps", str(10**9), "--batch", "16"]}
        extra = ("--profile", str(profile), "--prestart", prestart)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if how != "promotion":
            return cycle(job, world, extra, cycles, run_seconds, how == "miss", env,
                         standby=world if how == "miss" else 0)
        rows = [promote(job, world, extra, run_seconds, env) for _ in range(cycles)]
        return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


@contextlib.contextmanager
def broker(state: Path, gpus: int, extra: tuple[str, ...], env: dict | None, filler: bool):
    """A broker in `state` on `gpus` emulated GPUs (with `filler`: a rigid job on one of
    them first), its client; left with every job cancelled, stopped (its store complete)."""
    proc = start_broker(state, "marble", gpus, 1.0, extra, env=env)
    try:
        client = BrokerClient(socket_path(state))
        if filler:
            client.post("/v1/jobs", {"gpus": 1, "command": ["sleep", "100000"]})
        yield client
        for job in client.get("/v1/jobs")["jobs"]:
            if job["state"] not in ("done", "failed", "cancelled"):
                client.post(f"/v1/jobs/{job['id']}/cancel")
        client.post("/v1/shutdown")
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()


def cycle(job: dict, gpus: int, extra: tuple[str, ...], cycles: int, run_seconds: float,
          filler: bool, env: dict | None = None, standby: int = 0) -> dict:
    """`job` on a broker of `gpus` emulated GPUs (with `filler`: a rigid job on one of
    them first), suspended `cycles` times (with `standby`, each time once that many ranks
    of its next run wait); the medians of `summarize`."""
    with tempfile.TemporaryDirectory(prefix="marble-bench-") as tmp:
        state = Path(tmp) / "state"
        with broker(state, gpus, extra, env, filler) as client:
            job_id = client.post("/v1/jobs", job)["jobs"][0]["id"]
            run = wait_first_step(client, state, job_id, None)
            for _ in range(cycles):
                time.sleep(run_seconds)  # a run trains a while before it is suspended
                if standby:
                    wait_standby_idle(state / "jobs" / str(job_id), standby)
                client.post(f"/v1/jobs/{job_id}/suspend")
                run = wait_first_step(client, state, job_id, run)
            size = checkpoint_bytes(state / "jobs" / str(job_id) / "checkpoint")
        return summarize(state / DB_NAME, size)


def promote(job: dict, gpus: int, extra: tuple[str, ...], run_seconds: float,
            env: dict | None = None) -> dict:
    """`job` a secondary beside a rigid filler (job 1) on `gpus` emulated GPUs, promoted
    to all of them when the filler is cancelled, once it has trained `run_seconds` and its
    next run's `gpus` ranks wait; `summarize` of that one promotion."""
    with tempfile.TemporaryDirectory(prefix="marble-bench-") as tmp:
        state = Path(tmp) / "state"
        with broker(state, gpus, extra, env, filler=True) as client:
            job_id = client.post("/v1/jobs", job)["jobs"][0]["id"]
            run = wait_first_step(client, state, job_id, None)
            time.sleep(run_seconds)
            wait_standby_idle(state / "jobs" / str(job_id), gpus)
            promoted = time.time()
            client.post("/v1/jobs/1/cancel")
            wait_first_step(client, state, job_id, run)
            late = progress(state, job_id)["phases"]["imported"] - promoted  # rank 0's
            if late > 0:
                print(f"  (a promotion's rank 0 was still starting: it waited for its go "
                      f"{late:.1f} s after the promotion)", flush=True)
            size = checkpoint_bytes(state / "jobs" / str(job_id) / "checkpoint")
        return summarize(state / DB_NAME, size)


def summarize(db: Path, size: int) -> dict:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    runs = con.execute("SELECT * FROM runs ORDER BY id").fetchall()
    events: dict[tuple[int, str], dict] = {}
    for e in con.execute("SELECT * FROM events WHERE run_id IS NOT NULL ORDER BY id"):
        events[(e["run_id"], e["kind"])] = {"at": e["at"], **json.loads(e["data"] or "{}")}
    rows = []
    for old, new in zip(runs, runs[1:], strict=False):
        asked = events.get((old["id"], "suspend-requested"))
        ack = events.get((old["id"], "acknowledged"))
        new_end = (events.get((new["id"], "suspended")) or events.get((new["id"], "cancelled"))
                   or events.get((new["id"], "done")))
        phases = (new_end or {}).get("phases") or {}
        if not (asked and ack and all(p in phases for p in ("launch", *PHASES))):
            continue
        row = {
            "suspend": ack["at"] - asked["at"],
            "save": ack.get("save_seconds"),
            "exit": old["ended_at"] - ack["at"],
            "relaunch": new["started_at"] - old["ended_at"],
            "gap": phases["first_step"] - asked["at"],
        }
        # A prestarted process did its early phases before the go: they cost nothing then.
        start = phases.get("go", phases["launch"])
        row["resume"] = phases["first_step"] - start
        marks = ("launch", *PHASES)
        for before, after in zip(marks, marks[1:], strict=False):
            row[after] = max(0.0, phases[after] - max(phases[before], start))
        rows.append(row)
    med = {k: statistics.median(r[k] for r in rows if r[k] is not None) for k in rows[0]}
    return {"cycles": len(rows), "checkpoint_mb": size / 1e6, **med}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--framework", nargs="*", choices=sorted(SCRIPTS), default=["tf", "torch"])
    ap.add_argument("--arch", nargs="+", choices=["lenet", "resnet"], default=["lenet", "resnet"])
    ap.add_argument("--ddp-ranks", nargs="*", type=int, default=[1, 2, 4], metavar="N",
                    help="DDP rows: train_ddp.py with --per-gpu on N emulated GPUs (none: skip)")
    ap.add_argument("--ddp-rows", nargs="+", choices=list(DDP_ROWS), default=list(DDP_ROWS),
                    help="which DDP rows: cold (--prestart off), suspend (the only job: its "
                         "ranks start at the suspension), promotion (a secondary's ranks "
                         "started ahead, promoted from N-1 to N), miss (N started ahead, the "
                         "go takes N-1)")
    ap.add_argument("--agreement-steps", type=int, default=1000,
                    help="steps per setting of the stop agreement's cost (ddp_agreement.py)")
    ap.add_argument("--prestart", choices=["ahead", "suspend", "off"], default="ahead",
                    help="the broker's --prestart mode")
    ap.add_argument("--run-seconds", type=float, default=6.0,
                    help="how long each run trains before it is suspended")
    ap.add_argument("--slow-exit", action="store_true",
                    help="jobs leave through the interpreter teardown instead of os._exit")
    args = ap.parse_args()
    cols = ("suspend", "save", "exit", "relaunch", "python", "imported", "built", "restored",
            "first_step", "resume", "gap")
    print(f"medians in seconds over {args.cycles} cycles, --prestart {args.prestart}"
          + (", slow exit" if args.slow_exit else ""))
    print(f"{'job':16}{'ckpt MB':>8}" + "".join(f"{c:>11}" for c in cols))

    def row(label: str, r: dict) -> None:
        print(f"{label:16}{r['checkpoint_mb']:>8.2f}" + "".join(f"{r[c]:>11.3f}" for c in cols),
              flush=True)

    for fw in args.framework:
        for arch in args.arch:
            row(f"{fw}/{arch}", measure(fw, arch, args.cycles, args.prestart, args.run_seconds,
                                        ("--no-fast-exit",) if args.slow_exit else ()))
    for world in args.ddp_ranks:
        for how in args.ddp_rows if world > 1 else [r for r in args.ddp_rows if r in DDP_ONE]:
            label, prestart, how_run = DDP_ROWS[how]
            row(label.format(n=world, m=world - 1),
                measure_ddp(world, args.cycles, prestart or args.prestart, args.run_seconds,
                            how_run))
    if args.ddp_ranks:
        agreement(sorted({w for w in args.ddp_ranks if w > 1}), args.agreement_steps)


def agreement(worlds: list[int], steps: int) -> None:
    """The stop agreement's cost per step, measured by benchmarks/ddp_agreement.py."""
    print("stop agreement (ddp_agreement.py, gloo on the CPU, medians of 3 rounds): "
          "share of a step spent agreeing")
    print(f"{'ranks':>5} {'step':>8} {'step ms':>8} {'k=1':>8} {'check us':>9} {'adaptive':>9} "
          f"{'k':>4}")
    for world in worlds:
        for sleep_ms in (0.0, 50.0):
            t = measure_agreement(world, steps_for(steps, sleep_ms), 3, sleep_ms)
            one, auto = t["k=1"], t["adaptive"]
            label = "bare" if sleep_ms == 0 else f"+{sleep_ms:g} ms"
            print(f"{world:>5} {label:>8} {t['never']['step_ms']:8.2f} "
                  f"{100 * one['agree_share']:7.2f}% {one['check_us']:9.0f} "
                  f"{100 * auto['agree_share']:8.2f}% {auto['k_last']:4.0f}", flush=True)


if __name__ == "__main__":
    main()
