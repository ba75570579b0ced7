"""The loss trajectory of a DDP job suspended and resumed on other rank counts, against the
same job uninterrupted (issue 25): the figure and numbers of docs/distributed.md.

    .venv/bin/python benchmarks/ddp_trajectory.py [--steps 400] [--ranks 2 4 1]
        [--reference 2] [--batch 16] [--out docs/img]

jobscripts/train_ddp.py (gloo on the CPU, one thread a rank, a global batch of `--batch`
rows on any count) runs twice: uninterrupted on `--reference` ranks, and as one leg per
`--ranks` count, each leg but the last suspended by SIGTSTP to its ranks' process group at
an even share of the steps, then resumed from its checkpoint on the next count. Each leg
runs as marbled's local launcher runs a --per-gpu run (`python -m marbled.batch.ranks`);
a single rank runs alone, without a process group. Rank 0 logs the global batch's mean
loss of every step. Written to `--out`: ddp-trajectory.csv (step, both losses, their
difference), ddp-trajectory.png (matplotlib: the `plot` extra) and ddp-trajectory.json
(the legs and the figures printed). Prints the largest |difference| and its size in
float32 units in the last place (ulps) of the loss.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from marbled import examples
from marbled.batch.ranks import local_rank_envs
from marbled.worker.protocol import ACK_FILE, read_json

SCRIPT = examples.SCRIPTS / examples.EXAMPLES["ddp"].file
REPO = Path(__file__).resolve().parent.parent


def losses(path: Path) -> list[tuple[int, float]]:
    return [(int(step), float(loss)) for step, loss in
            (line.split() for line in path.read_text().splitlines())]


def leg(where: Path, run_id: int, world: int, args: list[str], stop_after: int | None,
        log: Path) -> int:
    """One run on `world` ranks from the job's checkpoint; with `stop_after`, SIGTSTP to its
    ranks once rank 0 has logged that step. The step it ended at."""
    run_dir = where / f"run{run_id}"
    run_dir.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARBLE_")}
    env |= {"MARBLE_CHECKPOINT_DIR": str(where / "checkpoint"), "MARBLE_RUN_DIR": str(run_dir),
            "MARBLE_RUN_ID": str(run_id), "MARBLE_LAUNCH_TIME": repr(time.time()),
            "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}  # gloo on the CPU
    command = [sys.executable, str(SCRIPT), *args, "--loss-log", str(log)]
    if world > 1:  # the local launcher's ranks, without GPUs
        ranks = [{k: v for k, v in e.items() if k != "CUDA_VISIBLE_DEVICES"}
                 for e in local_rank_envs((("node0", ("",) * world),))]
        command = [sys.executable, "-m", "marbled.batch.ranks", json.dumps(ranks), *command]
    with open(run_dir / "output", "wb") as out:
        proc = subprocess.Popen(command, env=env, cwd=where, stdout=out, stderr=out,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        while stop_after is not None and proc.poll() is None:
            if log.exists() and len(log.read_text().splitlines()) >= stop_after:
                os.killpg(proc.pid, signal.SIGTSTP)
                break
            time.sleep(0.01)
        code = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if code != 0:
        raise SystemExit(f"run {run_id} on {world} rank(s) exited with {code}:\n"
                         f"{(run_dir / 'output').read_text()[-3000:]}")
    ack = read_json(run_dir / ACK_FILE)
    return int(ack["step"]) if stop_after is not None else int(losses(log)[-1][0])


def job(where: Path, counts: list[int], args: list[str], steps: int) -> tuple[list, list]:
    """The job run as one leg per count: (rank 0's losses, the legs as (ranks, from, to))."""
    where.mkdir(parents=True)
    log, legs, start = where / "loss.log", [], 0
    for i, world in enumerate(counts):
        last = i == len(counts) - 1
        end = leg(where, i + 1, world, args, None if last else steps * (i + 1) // len(counts),
                  log)
        legs.append((world, start, end))
        start = end
    logged = losses(log)
    if [s for s, _ in logged] != list(range(1, steps + 1)):
        raise SystemExit(f"{where.name}: the steps did not run once each")
    return logged, legs


def draw(path: Path, steps: list[int], ref: np.ndarray, got: np.ndarray, legs: list,
         reference: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    top.plot(steps, ref, color="0.6", lw=3, label=f"uninterrupted, {reference} ranks")
    top.plot(steps, got, color="C1", lw=1,
             label="suspended and resumed: " + " -> ".join(f"{w}" for w, _, _ in legs)
             + " ranks")
    top.set_ylabel("loss (mean over the global batch)")
    top.legend(frameon=False)
    diff = np.abs(got - ref)
    bottom.plot(steps, np.where(diff > 0, diff, np.nan), ".", ms=2, color="C1")
    ulp = np.spacing(ref.astype(np.float32)).astype(np.float64)
    bottom.plot(steps, ulp, color="0.4", lw=1, label="1 float32 ulp of the loss")
    bottom.set_yscale("log")
    bottom.set_ylabel("|difference| (0: not drawn)")
    bottom.set_xlabel("step")
    bottom.legend(frameon=False, loc="lower left")
    for ax in (top, bottom):
        for _, start, _ in legs[1:]:
            ax.axvline(start + 0.5, color="0.8", lw=0.8, ls="--")
    for world, start, end in legs:
        top.annotate(f"{world} rank{'s' * (world > 1)}", ((start + end) / 2, 1.0),
                     xycoords=("data", "axes fraction"), ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 1],
                   help="the rank count of each leg of the suspended job")
    p.add_argument("--reference", type=int, default=2, help="ranks of the uninterrupted job")
    p.add_argument("--batch", type=int, default=16, help="the global batch (rows a step)")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    a = p.parse_args()
    if a.batch < max(a.ranks + [a.reference]) or a.steps < 2 * len(a.ranks):
        p.error("--batch must be at least the largest rank count, and --steps at least "
                "twice the legs")
    args = ["--steps", str(a.steps), "--batch", str(a.batch), "--report-interval", "0.05",
            "--timeout", "120"]
    with tempfile.TemporaryDirectory(prefix="ddp-trajectory-") as scratch:
        ref, _ = job(Path(scratch) / "uninterrupted", [a.reference], args, a.steps)
        got, legs = job(Path(scratch) / "resumed", a.ranks, args, a.steps)
    steps = [s for s, _ in ref]
    r, g = np.array([x for _, x in ref]), np.array([x for _, x in got])
    diff = np.abs(g - r)
    worst = int(diff.argmax())
    ulps = diff / np.spacing(r.astype(np.float32)).astype(np.float64)
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "ddp-trajectory.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", f"uninterrupted_{a.reference}_ranks", "resumed", "abs_diff"])
        for s, x, y, d in zip(steps, r, g, diff, strict=True):
            w.writerow([s, repr(float(x)), repr(float(y)), repr(float(d))])
    draw(a.out / "ddp-trajectory.png", steps, r, g, legs, a.reference)
    figures = {
        "steps": a.steps, "global_batch": a.batch, "reference_ranks": a.reference,
        "legs": [{"ranks": w, "from_step": s, "to_step": e} for w, s, e in legs],
        "max_abs_diff": float(diff.max()), "at_step": steps[worst],
        "max_ulps": float(ulps.max()), "max_ulps_at_step": steps[int(ulps.argmax())],
        "steps_bit_equal": int((diff == 0).sum()),
        "loss_first": float(r[0]), "loss_last": float(r[-1]),
    }
    (a.out / "ddp-trajectory.json").write_text(json.dumps(figures, indent=1) + "\n")
    print("legs: " + ", ".join(f"{w} rank(s) steps {s + 1}-{e}" for w, s, e in legs))
    print(f"loss {r[0]:.4f} -> {r[-1]:.4f} over {a.steps} steps (global batch {a.batch})")
    print(f"max |diff| {diff.max():.3g} at step {steps[worst]}; at most {ulps.max():.0f} "
          f"float32 ulps of the loss (step {steps[int(ulps.argmax())]}); "
          f"{figures['steps_bit_equal']} of {a.steps} steps bit-equal")
    print(f"wrote {a.out}/ddp-trajectory.png, .csv, .json")


if __name__ == "__main__":
    main()
