"""The GPU check: what only a machine with NVIDIA GPUs can show, run on one.

1. discovery: the GPUs the broker finds without Slurm or LSF (CUDA_VISIBLE_DEVICES,
   else NVML), their count and names;
2. a real broker (local launcher, NVML samples every --sample-interval) trains
   jobscripts/train_torch.py on the GPU; `marble suspend` stops it half-way
   (SIGTSTP -> checkpoint -> acknowledgement -> exit), the broker resumes it and it
   trains on from the checkpointed step to its last step; figures: steps/s,
   suspend latency, resume (launch -> first step), the gpu_samples rows of the job;
3. `marble profile` of the same model on 1 GPU: its curve names the NVML GPU;
4. where the tree has DDP support (jobscripts/train_ddp.py and torch.distributed in
   marbled/worker/torch.py), a 1-rank NCCL run of train_ddp.py suspended and resumed,
   the resumed run in its prestarted rank: the gap, and go -> first step (what the GPU
   idles when the rank waits ahead, as a promoted secondary's does).

The profile (step 3) runs before the broker (step 2): its steps/s sizes the broker's
job to train about --train-seconds. Each step's result, figures and error go to
gpu_check.json, and what is printed to gpu_check.log, in $OUT (else --out, else a
temporary directory). Exit status 0 when every check passed, 1 when one failed.

--dry-run checks THIS SCRIPT on a machine without a GPU: NVML is the stand-in of
tests/integration/standin_nvml (4 made-up GPUs, made-up readings) and torch trains
on the CPU. Its figures are no GPU's.

    bash benchmarks/gpu_check.sh                            # the GPU machine, offline
    .venv/bin/python benchmarks/gpu_check.py --dry-run      # here, on the CPU
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # marbled and benchmarks.* from the checkout (PYTHONPATH wins)

from benchmarks.suspend_resume import progress, summarize  # noqa: E402
from marbled import examples  # noqa: E402
from marbled.paths import DB_NAME, socket_path  # noqa: E402

STANDIN = ROOT / "tests" / "integration" / "standin_nvml"
TRAIN = examples.SCRIPTS / examples.EXAMPLES["torch"].file
TRAIN_DDP = examples.SCRIPTS / "train_ddp.py"
MODEL = {"lenet": "lenet", "resnet": "resnet-50"}  # the profile's model for each --arch
REPORT = ("--report-interval", "0.2")  # progress reports 5 a second: finer than the default


class CheckFailed(RuntimeError):
    pass


class Skipped(Exception):  # noqa: N818 (not an error: the check does not apply)
    pass


class Checker:
    """Runs the checks one after another, each recorded however it ends, within a deadline."""

    def __init__(self, out: Path, timeout: float, dry_run: bool):
        self.out, self.dry_run = out, dry_run
        self.deadline = time.monotonic() + timeout
        self.log = open(out / "gpu_check.log", "w", buffering=1)  # noqa: SIM115
        self.results: list[dict] = []

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.log.write(line + "\n")

    def left(self, at_most: float = 1e9) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise CheckFailed("out of time (the overall --timeout)")
        return min(left, at_most)

    def run(self, name: str, check, *args) -> dict | None:
        began = time.monotonic()
        self.say(f"== {name}")
        row: dict = {"check": name}
        try:
            row["figures"] = check(self, *args)
            row["ok"] = True
        except Skipped as why:
            row.update(ok=None, skipped=str(why))
        except Exception as exc:  # any failure is this check's result, not the script's end
            row.update(ok=False, error=f"{type(exc).__name__}: {exc}")
            if not isinstance(exc, CheckFailed):
                row["traceback"] = traceback.format_exc()
        row["seconds"] = round(time.monotonic() - began, 2)
        verdict = {True: "OK", False: "FAILED", None: "SKIPPED"}[row["ok"]]
        detail = row.get("error") or row.get("skipped") or ""
        self.say(f"-> {verdict} ({row['seconds']} s){': ' + detail if detail else ''}")
        self.results.append(row)
        return row.get("figures")

    def env(self) -> dict[str, str]:
        """The environment of every process started: marbled from this checkout; in a dry
        run the NVML stand-in, and no CUDA_VISIBLE_DEVICES so that NVML is asked."""
        paths = [str(STANDIN)] if self.dry_run else []
        paths += [str(ROOT), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        if self.dry_run:
            env["CUDA_VISIBLE_DEVICES"] = ""
        return env

    def marble(self, *args: str, at_most: float = 120) -> subprocess.CompletedProcess:
        """The `marble` command, as a user types it."""
        return subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", *args],
                              env=self.env(), capture_output=True, text=True,
                              timeout=self.left(at_most), cwd=self.out)


def need(ok: bool, why: str) -> None:
    if not ok:
        raise CheckFailed(why)


# -- the checks


def check_torch(c: Checker) -> dict:
    """What torch sees, in a process of its own (this one keeps no CUDA context)."""
    probe = ("import json, torch, torch.distributed as dist; c = torch.cuda.is_available(); "
             "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
             "'cuda_available': c, 'devices': [torch.cuda.get_device_name(i) for i in "
             "range(torch.cuda.device_count())] if c else [], "
             "'nccl': dist.is_available() and dist.is_nccl_available()}))")
    done = subprocess.run([sys.executable, "-c", probe], env=c.env(), capture_output=True,
                          text=True, timeout=c.left(120))
    need(done.returncode == 0, f"torch does not import: {done.stderr.strip()[-500:]}")
    seen = json.loads(done.stdout)
    c.say(f"python {platform.python_version()}, torch {seen['torch']} (CUDA {seen['cuda']}): "
          f"cuda available {seen['cuda_available']}, devices {seen['devices']}, "
          f"NCCL {seen['nccl']}")
    if not c.dry_run:
        need(seen["cuda_available"], "torch sees no CUDA device: the jobs would train on "
             "the CPU (a CPU build of torch, or no driver)")
    return {"python": platform.python_version(), **seen}


def check_discovery(c: Checker) -> dict:
    """The broker's own discovery (marbled/batch/gpus.py), then NVML's name for each GPU."""
    from marbled.batch.gpus import discover_gpus
    from marbled.profiler import gpu_name

    devices, source = discover_gpus(None)
    names = [gpu_name((d,), emulated=False) for d in devices]
    c.say(f"{len(devices)} GPU(s) from {source}: "
          + ", ".join(f"{d}: {n}" for d, n in zip(devices, names, strict=True)))
    need(source in ("NVML", "CUDA_VISIBLE_DEVICES"), f"GPUs from {source}, not NVML")
    need(not any(n.startswith(("cpu", "emulated")) for n in names),
         f"NVML names no GPU: {names} (is nvidia-ml-py installed?)")
    return {"count": len(devices), "devices": list(devices), "source": source, "names": names}


def check_profile(c: Checker, model: str, command: list[str], steps: int,
                  gpu: str | None) -> dict:
    """`marble profile` on 1 GPU; the curve it writes names the GPU NVML names."""
    out = c.out / "profile.yaml"
    with tempfile.TemporaryDirectory(prefix="gpu-check-profile-") as work:
        try:
            done = c.marble("profile", "--model", model, "--gpus", "1", "--steps", str(steps),
                            "--warmup", str(max(2, steps // 10)), "--output", str(out),
                            "--workdir", work, "--json", "--", *command, at_most=180)
        except subprocess.TimeoutExpired:
            c.say(tails(Path(work)))
            raise CheckFailed(f"marble profile took over {c.left(180):.0f} s") from None
    need(done.returncode == 0, f"marble profile failed: {done.stderr.strip()[-800:]}")
    result = json.loads(done.stdout)
    (count,) = result["counts"]
    measured = result["entry"]["measured"]
    c.say(f"{model} on 1 GPU ({measured['gpu']}): {count['steps_per_second']:.1f} steps/s "
          f"(spread {count['spread']:.1%}), start-up {_num(count['startup_s'], 2)} s, suspend "
          f"{_num(count['suspend_s'], 3)} s, resume {_num(result['resume_s'], 2)} s; curve "
          f"written to {out.name}")
    need(gpu is None or measured["gpu"] == gpu,
         f"the profile names {measured['gpu']!r}, NVML named {gpu!r}")
    need(out.exists() and model in out.read_text(), f"{out} holds no curve of {model}")
    return {"model": model, "gpu": measured["gpu"], "steps_per_second": count["steps_per_second"],
            "spread": count["spread"], "startup_s": count["startup_s"],
            "suspend_s": count["suspend_s"], "resume_s": result["resume_s"],
            "curve": result["entry"]["steps_per_second"], "output": out.name}


def check_broker(c: Checker, name: str, command: list[str], model: str, steps: int,
                 sample_interval: float, device_text: str, per_gpu: bool = False,
                 env: dict | None = None) -> dict:
    """A real broker on the GPUs: the job trains, is suspended by `marble suspend` half-way,
    resumes from its checkpoint and ends at its last step; its runs, events and NVML
    samples as the store has them."""
    from marbled.cli.client import BrokerClient
    from marbled.demo import start_broker

    state = Path(tempfile.mkdtemp(prefix=f"gpu-check-{name}-"))
    proc = start_broker(state, "marble", None, 1.0,
                        ("--launcher", "local", "--sample-interval", repr(sample_interval)),
                        env={**c.env(), **(env or {})})
    client = BrokerClient(socket_path(state))
    job = None
    try:
        job = client.post("/v1/jobs", {"model": model, "steps": steps, "command": command,
                                       "chdir": str(c.out), "per_gpu": per_gpu})["jobs"][0]["id"]
        c.say(f"job {job}: {model}, {steps} steps"
              f"{', one process per GPU' if per_gpu else ''}: {' '.join(command[1:])}")
        # run 1 trains to about 40% of its steps; its rate from two progress reports
        first = last = None
        while True:
            p = progress(state, job)
            if p.get("run_id") and "first_step" in p.get("phases", {}):
                first = first or (p["step"], p["time"])
                last = (p["step"], p["time"])
                if p["step"] >= 0.4 * steps:
                    break
            j = client.get(f"/v1/jobs/{job}")
            need(j["state"] in ("queued", "running"),
                 f"job {job} ended {j['state']} before it was suspended: {j.get('reason')}")
            time.sleep(min(0.2, c.left()))
        rate = (last[0] - first[0]) / (last[1] - first[1]) if last[1] > first[1] else None
        suspended = c.marble("--state-dir", str(state), "suspend", str(job))
        need(suspended.returncode == 0, f"marble suspend: {suspended.stderr.strip()}")
        c.say(f"marble suspend {job} at step {last[0]}: {suspended.stdout.strip()}")
        while (j := client.get(f"/v1/jobs/{job}"))["state"] not in ("done", "failed",
                                                                      "cancelled"):
            time.sleep(min(0.5, c.left()))
        need(j["state"] == "done", f"job {job} ended {j['state']}: {j.get('reason')}")
        client.post("/v1/shutdown")
        proc.wait(timeout=c.left(120))
    except Exception:
        c.say(tails(state))
        raise
    finally:
        if proc.poll() is None:
            with contextlib.suppress(Exception):  # the job may have ended meanwhile
                client.post(f"/v1/jobs/{job}/cancel")
            with contextlib.suppress(Exception):
                client.post("/v1/shutdown")
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    figures = store_figures(c, state, job, steps, rate, device_text)
    shutil.rmtree(state, ignore_errors=True)
    return figures


def tails(state: Path, lines: int = 15) -> str:
    """The ends of the broker's log and of every run's stderr, for a failure's record."""
    out = []
    for path in [state / "marbled.log", *sorted(state.glob("jobs/*/run-*.stderr.log")),
                 *sorted(state.glob("*/*/stderr.log"))]:  # the last: marble profile's
        if path.exists():
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.relative_to(state)}:\n" + "\n".join(text))
    return "\n".join(out) or f"(no logs in {state})"


def store_figures(c: Checker, state: Path, job: int, steps: int, rate: float | None,
                  device_text: str) -> dict:
    con = sqlite3.connect(state / DB_NAME)
    con.row_factory = sqlite3.Row
    runs = [dict(r) for r in con.execute("SELECT * FROM runs WHERE job_id = ? ORDER BY id",
                                         (job,))]
    chain = [(r["start_step"], r["end_step"], r["end_reason"]) for r in runs]
    c.say(f"runs (start step, end step, end): {chain}")
    need(len(runs) == 2 and runs[0]["end_reason"] == "suspended"
         and runs[1]["end_reason"] == "done", f"not one suspended run then one done: {chain}")
    need(0 < runs[0]["end_step"] < steps and runs[1]["start_step"] == runs[0]["end_step"]
         and runs[1]["end_step"] == steps,
         f"the runs do not chain from the checkpointed step to step {steps}: {chain}")
    costs = summarize(state / DB_NAME, 0)
    costs.pop("checkpoint_mb")
    logs = state / "jobs" / str(job)
    nccl = 0  # NCCL's own lines (NCCL_DEBUG=INFO), in either log
    for r in runs:
        stderr = (logs / f"run-{r['id']}.stderr.log").read_text()
        need(device_text in stderr,
             f"run {r['id']} does not say {device_text!r}:\n{stderr[-1500:]}")
        stdout = (logs / f"run-{r['id']}.stdout.log").read_text()
        nccl += (stdout + stderr).count("NCCL INFO")
    need(f"steps={steps} (this run {runs[0]['end_step']}->{steps})" in stdout,
         f"the last run's output does not end at step {steps}:\n{stdout[-500:]}")
    samples = [dict(r) for r in con.execute("SELECT * FROM gpu_samples ORDER BY id")]
    mine = [s for s in samples if s["job_id"] == job]
    gpu = {"rows": len(samples), "rows_with_job": len(mine)}
    if mine:
        gpu.update(util_gpu_mean=round(statistics.mean(s["util_gpu"] for s in mine), 1),
                   util_gpu_max=max(s["util_gpu"] for s in mine),
                   util_mem_mean=round(statistics.mean(s["util_mem"] for s in mine), 1),
                   mem_used_max_mib=max(s["mem_used"] for s in mine) >> 20,
                   mem_total_mib=mine[0]["mem_total"] >> 20,
                   devices=sorted({s["device"] for s in mine}))
    second = runs[1]
    (done,) = con.execute("SELECT data FROM events WHERE run_id = ? AND kind = 'done'",
                          (second["id"],)).fetchall()
    first_step = json.loads(done["data"])["phases"]["first_step"]
    trained = (second["end_step"] - second["start_step"] - 1) / (second["ended_at"] - first_step)
    c.say(f"steps/s: run 1 {_num(rate)} (progress reports), run 2 {_num(trained)} "
          "(runs table, after its first step)")
    c.say("suspend: SIGTSTP -> acknowledgement {suspend:.3f} s (checkpoint save {save:.3f} s), "
          "-> exit {exit:.3f} s; relaunch {relaunch:.3f} s; resume: launch -> first step "
          "{resume:.3f} s (python {python:.2f}, import {imported:.2f}, build {built:.2f}, "
          "restore {restored:.2f}, first step {first_step:.2f}); GPU idle (SIGTSTP -> first "
          "step) {gap:.3f} s".format(**costs))
    prestart = prestart_figures(con, job, runs[0]["id"], second["id"])
    c.say(prestart["text"])
    c.say("gpu_samples: {rows} rows, {rows_with_job} with the job".format(**gpu) + (
        "; utilisation mean {util_gpu_mean}% (max {util_gpu_max}%), memory {util_mem_mean}%, "
        "used up to {mem_used_max_mib} of {mem_total_mib} MiB".format(**gpu) if mine else ""))
    need(len(mine) >= 2, f"{len(mine)} NVML samples recorded with job {job} on its GPU")
    if not c.dry_run:
        need(gpu["util_gpu_max"] > 0 and gpu["mem_used_max_mib"] > 0,
             f"NVML saw the job's GPU idle and empty: {gpu}")
    return {"runs": chain, "steps_per_second": rate, "steps_per_second_run2": trained,
            **costs, "gpu_samples": gpu, "nccl_info_lines": nccl, "prestart": prestart}


def prestart_figures(con: sqlite3.Connection, job: int, first: int, second: int) -> dict:
    """Whether run `second` was a prestarted process (its ranks, for a per-GPU job), when it
    was started against run `first`'s SIGTSTP, and its go -> first step: the GPU's idle
    time where the process waits ahead of the suspension (a promotion of a secondary)."""
    def event(kind: str, run_id: int | None) -> dict | None:
        row = con.execute("SELECT at, data FROM events WHERE job_id = ? AND kind = ? AND "
                          "run_id IS ? ORDER BY id DESC LIMIT 1", (job, kind, run_id)).fetchone()
        return {"at": row[0], **(json.loads(row[1] or "{}") or {})} if row else None

    go, asked = event("go", second), event("suspend-requested", first)
    started = event("prestarted", None)
    if go is None or asked is None or started is None:
        return {"prestarted": False, "text": "prestart: none, the resumed run started cold"}
    (done,) = con.execute("SELECT data FROM events WHERE run_id = ? AND kind = 'done'",
                          (second,)).fetchall()
    phases = json.loads(done[0])["phases"]
    figures = {"prestarted": True, "ranks": go.get("ranks"), "ranks_started": go.get("prestarted"),
               "started_after_sigtstp_s": started["at"] - asked["at"],
               "go_to_first_step_s": phases["first_step"] - phases["go"]}
    ranks = (f", {figures['ranks']} rank(s) of {figures['ranks_started']} started"
             if go.get("ranks") else "")
    figures["text"] = (
        f"prestart: the resumed run was the prestarted process{ranks}, started "
        "{started_after_sigtstp_s:.3f} s after the SIGTSTP; its go -> first step "
        "{go_to_first_step_s:.3f} s (the GPU's idle time when it waits ahead)").format(**figures)
    return figures


def ddp_support() -> str | None:
    """Why DDP is not checked, or None where the tree has it (another part adds it)."""
    if not TRAIN_DDP.exists():
        return f"no {TRAIN_DDP.name} in this tree"
    if "def init_distributed" not in (ROOT / "marbled" / "worker" / "torch.py").read_text():
        return "marbled/worker/torch.py has no init_distributed (DDP) yet"
    return None


def check_ddp(c: Checker, train_s: float, floor: int, sample_interval: float) -> dict:
    """train_ddp.py as a per-GPU job (its ranks' rendezvous from the broker: one rank per
    GPU, NCCL on CUDA), suspended and resumed; sized by a `marble profile` of the script
    started alone (rank 0 of 1). NCCL_DEBUG=INFO: the ranks' stderr says whether NCCL ran."""
    why = ddp_support()
    if why:
        raise Skipped(why)
    command = [sys.executable, str(TRAIN_DDP), *REPORT]
    rate = check_profile(c, "train-ddp", command, 200, None)["steps_per_second"]
    figures = check_broker(c, "ddp", command, "lenet", max(floor, round(rate * train_s)),
                           sample_interval, "train_ddp: rank 0 of", per_gpu=True,
                           env={"NCCL_DEBUG": "INFO"})
    c.say(f"NCCL_DEBUG=INFO lines in the runs' logs: {figures['nccl_info_lines']}")
    need(figures["prestart"]["prestarted"], "the resumed per-GPU run was not the prestarted "
         "ranks (the broker's --prestart and JobProtocol.ready() decide)")
    if not c.dry_run:
        need(figures["nccl_info_lines"] > 0, "the ranks printed no NCCL line: they did "
             "not train through NCCL")
    return figures


def _num(v: float | None, digits: int = 1) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def main() -> int:
    ap = argparse.ArgumentParser(
        description="Check marbled on this machine's NVIDIA GPUs: discovery, a real broker "
                    "training, suspending and resuming a PyTorch job, NVML samples, marble "
                    "profile, DDP where the tree has it. --dry-run: the same flow on a "
                    "machine WITHOUT a GPU (stand-in NVML, torch on the CPU).")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the script here: NVML stand-in, CPU torch; no GPU figures")
    ap.add_argument("--out", type=Path,
                    help="where gpu_check.json and gpu_check.log go [default: $OUT, else a "
                         "temporary directory]")
    ap.add_argument("--timeout", type=float, default=360,
                    help="seconds for every check together [default: 360]")
    ap.add_argument("--arch", choices=sorted(MODEL), default=None,
                    help="train_torch.py's model [default: resnet; lenet with --dry-run]")
    ap.add_argument("--train-seconds", type=float, default=None,
                    help="how long the broker's job trains in all [default: 25; 10 with "
                         "--dry-run]")
    ap.add_argument("--sample-interval", type=float, default=0.5,
                    help="marbled --sample-interval [default: 0.5]")
    args = ap.parse_args()
    arch = args.arch or ("lenet" if args.dry_run else "resnet")
    train_s = args.train_seconds or (10 if args.dry_run else 25)
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else
                       Path(tempfile.mkdtemp(prefix="gpu-check-")))
    out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        sys.path.insert(0, str(STANDIN))  # this process's discovery reads the stand-in too
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    c = Checker(out, args.timeout, args.dry_run)
    c.say("marbled GPU check" + (" -- DRY RUN: stand-in NVML (made-up GPUs and readings), "
                                 "torch on the CPU; no figure below is a GPU's"
                                 if args.dry_run else "")
          + f"; {time.strftime('%Y-%m-%d %H:%M:%S %Z')} on {platform.node()}, output in {out}")
    c.run("torch", check_torch)
    found = c.run("discovery", check_discovery)
    name = found["names"][0] if found else None
    command = [sys.executable, str(TRAIN), "--arch", arch, *REPORT]
    prof = c.run("profile", check_profile, f"train-torch-{arch}", command,
                 60 if args.dry_run else 300, name)
    # the broker's job trains about train_s in all, at the rate the profile measured
    floor = 100  # steps: a run of fewer may end before the suspension reaches it
    steps = max(floor, round((prof["steps_per_second"] if prof else 50) * train_s))
    device_text = "training on the CPU" if args.dry_run else "training on GPU"
    c.run("broker", check_broker, "torch", command, MODEL[arch], steps,
          args.sample_interval, device_text)
    c.run("ddp", check_ddp, train_s, floor, args.sample_interval)
    failed = [r["check"] for r in c.results if r["ok"] is False]
    summary = {"dry_run": args.dry_run, "host": platform.node(),
               "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "arch": arch,
               "passed": not failed, "failed": failed, "checks": c.results}
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=1, default=str))
    c.say(f"{'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'}"
          f"{' (dry run)' if args.dry_run else ''}; {out / 'gpu_check.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
