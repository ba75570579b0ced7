"""What the DDP ranks' stop agreement costs per step (issue 25): marbled.worker.torch's
StopAgreement, checked at every step (k=1) against its adaptive k, in the real loop.

    .venv/bin/python benchmarks/ddp_agreement.py [--world 2] [--steps 1000] [--rounds 3]
        [--sleep-ms 0 50] [--json FILE]

Starts `--world` ranks (gloo on the CPU, one thread each, the env:// variables as a
launcher sets them). Each rank trains a small MLP (32-64-64-10, global batch 16) through
`Suspendable(...).steps()`, under three settings, interleaved in `--rounds` rounds:
`never` (a check only at the start: the loop without the agreement), `k=1` and
`adaptive` (the default). `--sleep-ms S` adds S ms to every step (`0 50`: the bare CPU
step of ~2 ms, and an emulated 50 ms GPU step). Per setting, the median over rounds of:
the step time (the slowest rank's), the checks per 100 steps, one check's time (starting
the vote and waiting for it a step later; the all-reduce itself runs in gloo's thread
meanwhile) and the agreement's time per step as a share of the step. A
check's time is the least over ranks: the rank that comes last to a check waits for no
one; the others also wait out the skew between ranks, which the step's gradient
all-reduce would absorb anyway. The step-time difference against `never` is noise-bound
on a shared machine; the time in the checks is direct.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from marbled.batch.ranks import free_ports

SETTINGS = {"never": 10**9, "k=1": 1, "adaptive": None}  # Suspendable(agree_every=...)


def worker(steps: int, rounds: int, sleep_ms: float, scratch: str) -> None:
    import torch
    from torch import distributed as dist

    from marbled.worker.torch import Suspendable, init_distributed

    torch.set_num_threads(1)
    ranks = init_distributed(timeout=120)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    net = torch.nn.parallel.DistributedDataParallel(model)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
    results = []
    for round_ in range(rounds):
        for name, every in SETTINGS.items():
            directory = os.path.join(scratch, f"{name}-{round_}")
            run = Suspendable(model, optimizer, steps=steps, directory=directory,
                              global_batch=16, agree_every=every)
            xs, ys = run.batch.take(x, y)
            before = run.agreement.seconds  # the start-up check waited for the restores
            dist.barrier()
            start = time.perf_counter()
            for _ in run.steps():
                optimizer.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(net(xs), ys).backward()
                optimizer.step()
                if sleep_ms:
                    time.sleep(sleep_ms / 1000)
            took = time.perf_counter() - start
            checks, seconds = run.agreement.checks - 1, run.agreement.seconds - before
            results.append({"setting": name, "round": round_, "step_s": took / steps,
                            "checks": checks, "k": run.agreement.k,
                            "check_s": seconds / max(1, checks),
                            "agree_per_step_s": seconds / steps})
    print("RESULT " + json.dumps({"rank": ranks.rank, "results": results}), flush=True)
    sys.stdout.flush()
    os._exit(0)


def measure(world: int, steps: int, rounds: int, sleep_ms: float) -> dict:
    (port,) = free_ports(1)
    with tempfile.TemporaryDirectory(prefix="ddp-agreement-") as scratch:
        procs = []
        for rank in range(world):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world),
                   "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
            env = {k: v for k, v in env.items() if not k.startswith("MARBLE_")}
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", "--steps", str(steps), "--rounds",
                 str(rounds), "--sleep-ms", str(sleep_ms), "--scratch", scratch],
                env=env, stdout=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a rank failed: exit codes {[p.returncode for p in procs]}")
    per_rank = [json.loads(line[len("RESULT "):])["results"] for out in outs
                for line in out.splitlines() if line.startswith("RESULT ")]
    table = {}
    for name in SETTINGS:
        rows = [[r for r in results if r["setting"] == name] for results in per_rank]
        by_round = list(zip(*rows, strict=True))  # each round: every rank's row
        table[name] = {
            "step_ms": statistics.median(1e3 * max(r["step_s"] for r in rnd) for rnd in by_round),
            "checks_per_100": statistics.median(100 * rnd[0]["checks"] / steps
                                                for rnd in by_round),
            "k_last": statistics.median(rnd[0]["k"] for rnd in by_round),
            # the rank that came last to a check waited for no one: the collective's cost
            "check_us": statistics.median(1e6 * min(r["check_s"] for r in rnd)
                                          for rnd in by_round),
            "agree_share": statistics.median(
                min(r["agree_per_step_s"] for r in rnd) / max(r["step_s"] for r in rnd)
                for rnd in by_round),
        }
    return table


def steps_for(steps: int, sleep_ms: float) -> int:
    """Steps per setting: `steps` bare (~2 ms each), about as long in all with slower steps."""
    return steps if sleep_ms == 0 else max(100, int(steps * 2 / (sleep_ms + 2)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sleep-ms", type=float, nargs="+", default=[0.0, 50.0])
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--scratch", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.steps, args.rounds, args.sleep_ms[0], args.scratch)
    figures = {}
    print(f"{args.world} ranks, gloo, CPU; {args.steps} steps x {args.rounds} rounds per "
          f"setting; medians over rounds")
    print(f"{'step':>10} {'setting':>9} {'step ms':>8} {'vs never':>9} {'checks/100':>10} "
          f"{'k last':>6} {'check us':>9} {'agreement/step':>15}")
    for sleep_ms in args.sleep_ms:
        steps = steps_for(args.steps, sleep_ms)
        table = measure(args.world, steps, args.rounds, sleep_ms)
        figures[f"sleep_{sleep_ms:g}ms"] = table
        base = table["never"]["step_ms"]
        for name, row in table.items():
            label = "bare" if sleep_ms == 0 else f"+{sleep_ms:g} ms"
            k, check = ("-", "-") if name == "never" else (f"{row['k_last']:.0f}",
                                                           f"{row['check_us']:.0f}")
            print(f"{label:>10} {name:>9} {row['step_ms']:8.3f} "
                  f"{100 * (row['step_ms'] / base - 1):+8.1f}% {row['checks_per_100']:10.1f} "
                  f"{k:>6} {check:>9} {100 * row['agree_share']:14.2f}%")
    print("load (1/5/15 min): " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
