"""Suspend and resume latency of jobscripts/train_torch.py (PyTorch on the CPU), no broker.

    .venv/bin/python benchmarks/torch_suspend_resume.py [--cycles 5] [--arch lenet resnet]

For each architecture, one job is started, suspended with SIGTSTP a random 0.3-0.8 s
after its first step, resumed, and so on: `cycles` suspensions (runs 1..N) and
`cycles` resumptions (runs 2..N+1; run N+1 is suspended too, to end it). Measured:

  suspend latency  SIGTSTP sent -> ack.json 'time' (the checkpoint is on disk), made of:
  to handler       SIGTSTP sent -> the job's Python handler ran ('signalled_at')
  to step end      the rest of the step under way (what remains of the latency)
  save             the ack's save_seconds (torch.save + fsync + rename + dir fsync)
  exit after ack   ack 'time' -> the process has exited (waitpid returned)
  resume phases    from progress.json 'phases' of the resumed runs:
                   launch -> python -> imported -> built -> restored -> first_step
  checkpoint       size of the acknowledged checkpoint file

Figures are medians with [min-max]. The machine's load average is printed as well:
other processes on the same cores make every figure larger.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from importlib.metadata import version
from itertools import pairwise
from pathlib import Path

from marbled.resources import PROJECT_ROOT
from marbled.worker.protocol import ACK_FILE, PROGRESS_FILE, read_json

TRAIN = PROJECT_ROOT / "jobscripts" / "train_torch.py"
PHASES = ("launch", "python", "imported", "built", "restored", "first_step")


def _wait_for(predicate, timeout: float, what: str, ended: list):
    """Poll `predicate` until true; fail if the job exits first (`ended` gets its exit)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = bool(ended)
        value = predicate()
        if value:
            return value
        if done:
            raise RuntimeError(f"the job ended before {what}")
        time.sleep(0.001)
    raise RuntimeError(f"timed out waiting for {what}")


def one_run(arch: str, work: Path, run_id: int, delay: float, threads: int | None) -> dict:
    """Start run `run_id`, suspend it `delay` s after its first step; what was measured."""
    for stale in (ACK_FILE, PROGRESS_FILE):
        (work / stale).unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARBLE_")}
    argv = [sys.executable, str(TRAIN), "--arch", arch, "--steps", "100000000",
            "--report-interval", "0.05"]
    if threads:
        argv += ["--threads", str(threads)]
    env.update(MARBLE_RUN_DIR=str(work), MARBLE_CHECKPOINT_DIR=str(work / "checkpoint"),
               MARBLE_RUN_ID=str(run_id), CUDA_VISIBLE_DEVICES="0",
               MARBLE_LAUNCH_TIME=repr(time.time()))
    with open(work / "stderr.log", "ab") as err:
        proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    exited: list[float] = []
    waiter = threading.Thread(target=lambda: (proc.wait(), exited.append(time.time())))
    waiter.start()  # exit time to the ms; Popen.poll() returns None while it waits
    try:
        def started() -> dict | None:
            p = read_json(work / PROGRESS_FILE)
            ok = p and p.get("run_id") == run_id and "first_step" in p.get("phases", {})
            return p if ok else None

        progress = _wait_for(started, 300, "the first step", exited)
        time.sleep(delay)
        sent = time.time()
        os.killpg(proc.pid, signal.SIGTSTP)  # as the broker does: the whole group

        def acked() -> dict | None:
            a = read_json(work / ACK_FILE)
            return a if a and a.get("run_id") == run_id else None

        ack = _wait_for(acked, 120, "the acknowledgement", exited)
    finally:
        waiter.join(timeout=60)
        if not exited:
            proc.kill()
            waiter.join()
    if ack is None or proc.returncode != 0:
        raise RuntimeError(f"run {run_id}: exit {proc.returncode}, ack {ack}; see {work}")
    phases = progress["phases"]
    ckpt = work / "checkpoint" / f"ckpt-{ack['step']:09d}.pt"
    return {
        "suspend": ack["time"] - sent,
        "to_handler": ack["signalled_at"] - sent,
        "save": ack["save_seconds"],
        "to_boundary": ack["time"] - ack["signalled_at"] - ack["save_seconds"],
        "exit_after_ack": exited[0] - ack["time"],
        "start_step": progress["start_step"],
        "step": ack["step"],
        "size": ckpt.stat().st_size,
        **{f"{a}->{b}": phases[b] - phases[a] for a, b in pairwise(PHASES)},
        "launch->first_step": phases["first_step"] - phases["launch"],
    }


def _fmt(values: list[float], scale: float = 1000.0, unit: str = "ms") -> str:
    v = [x * scale for x in values]
    digits = 0 if unit == "ms" else 2
    return (f"{statistics.median(v):.{digits}f} [{min(v):.{digits}f}-{max(v):.{digits}f}]"
            f" {unit}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--arch", nargs="+", default=["lenet", "resnet"],
                    choices=["lenet", "resnet"])
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads in the job (default: torch's choice)")
    ap.add_argument("--seed", type=int, default=1, help="for the random suspend delays")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    load_before = os.getloadavg()[0]
    rows = []
    for arch in args.arch:
        with tempfile.TemporaryDirectory(prefix=f"torch-sr-{arch}-") as tmp:
            runs = [one_run(arch, Path(tmp), i, rng.uniform(0.3, 0.8), args.threads)
                    for i in range(1, args.cycles + 2)]
        for a, b in pairwise(runs):
            assert a["step"] == b["start_step"], (a, b)
        rows.append((arch, runs))
    print(f"PyTorch {version('torch')}, train_torch.py on the CPU, {args.cycles} "
          f"suspend/resume cycles per model; load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    print(f"{'':28}" + "".join(f"{arch:>30}" for arch, _ in rows))

    def line(label: str, key: str, which: slice, scale: float = 1000.0,
             unit: str = "ms") -> None:
        cells = [_fmt([r[key] for r in runs[which]], scale, unit) for _, runs in rows]
        print(f"{label:28}" + "".join(f"{c:>30}" for c in cells))

    suspended, resumed = slice(0, args.cycles), slice(1, args.cycles + 1)
    line("suspend latency", "suspend", suspended)
    line("  SIGTSTP -> handler", "to_handler", suspended)
    line("  handler -> step end", "to_boundary", suspended)
    line("  save (ack)", "save", suspended)
    line("exit after ack", "exit_after_ack", suspended)
    for a, b in pairwise(PHASES):
        line(f"resume {a}->{b}", f"{a}->{b}", resumed, 1.0, "s")
    line("resume launch->first", "launch->first_step", resumed, 1.0, "s")
    line("fresh launch->first", "launch->first_step", slice(0, 1), 1.0, "s")
    line("checkpoint size", "size", suspended, 1e-6, "MB")


if __name__ == "__main__":
    main()
