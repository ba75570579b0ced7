"""Every policy on a long-job trace on 1 to 16 nodes of 4 GPUs (simulated).

160 jobs of six models, hours to days long, arriving over two days; each policy's
makespan against the LSF way (rigid), GPU utilization, suspensions, and moves that
kept a job's GPU count (a reshape that pays nothing). The curves are ASSUMED
shapes for 4-GPU nodes (not measured): two models peak at 2 GPUs, two at 3, two at 4.

    .venv/bin/python benchmarks/across_nodes.py [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random

from marbled.core.policy import POLICIES, get_policy
from marbled.core.profiles import ProfileBook
from marbled.core.spec import JobSpec
from marbled.sim.engine import Simulator
from marbled.sim.workloads import Arrival

BOOK = ProfileBook.from_mapping({"system": "assumed-4gpu", "gpus_per_node": 4, "models": {
    "cnn-small": {"steps_per_second": [10.0, 16.0, 15.5, 15.0]},
    "cnn-mid": {"steps_per_second": [4.0, 7.2, 7.0, 6.8]},
    "resnet": {"steps_per_second": [3.3, 6.0, 6.5, 6.4]},
    "inception": {"steps_per_second": [2.0, 3.8, 5.0, 4.9]},
    "vgg": {"steps_per_second": [1.3, 2.5, 3.4, 4.0]},
    "transformer": {"steps_per_second": [1.0, 1.9, 2.7, 3.4]},
}})


def trace(seed: int = 0, jobs: int = 160) -> list[Arrival]:
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(jobs):
        t += rng.expovariate(jobs / (2 * 86400))  # arrivals over about two days
        model = rng.choice(sorted(BOOK.models))
        hours = rng.choice([1, 2, 4, 8, 12, 24, 48, 96])  # on one GPU
        steps = int(hours * 3600 * BOOK.lookup(model).throughput(1))
        out.append(Arrival(t, JobSpec(emulate=True, model=model, steps=steps)))
    return out


def same_count_moves(result) -> int:
    runs = sorted(result.runs, key=lambda r: (r.job, r.start))
    return sum(1 for a, b in itertools.pairwise(runs) if a.job == b.job
               and a.reason == "suspended" and (len(a.gpus), a.share) == (len(b.gpus), b.share))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    arrivals = trace(args.seed)
    rows = []
    for nodes in (1, 2, 4, 8, 16):
        rigid = Simulator(BOOK, get_policy("rigid"), 4, nodes).run(arrivals).makespan
        for name in sorted(POLICIES):
            r = Simulator(BOOK, get_policy(name), 4, nodes).run(arrivals)
            rows.append({"nodes": nodes, "policy": name, "makespan_h": r.makespan / 3600,
                         "vs_rigid": r.makespan / rigid, "average_jct_h": r.average_jct / 3600,
                         "utilization": r.utilization, "suspensions": r.suspensions,
                         "same_count_moves": same_count_moves(r)})
    print(f"{'nodes':>5} {'policy':<10} {'makespan h':>10} {'vs rigid':>8} {'avg JCT h':>9} "
          f"{'util':>6} {'susp':>5} {'same':>5}")
    for row in rows:
        print(f"{row['nodes']:>5} {row['policy']:<10} {row['makespan_h']:>10.1f} "
              f"{row['vs_rigid']:>8.2f} {row['average_jct_h']:>9.1f} {row['utilization']:>6.1%} "
              f"{row['suspensions']:>5} {row['same_count_moves']:>5}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
