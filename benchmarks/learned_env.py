"""Steps per second of the Gymnasium environment (`marbled.sim.env`, issue 23), and what
the shipped network adds to its packing rule.

    .venv/bin/python benchmarks/learned_env.py [--episodes 5] [--jobs 200] [--nodes 4]
    .venv/bin/python benchmarks/learned_env.py --against-fifo [--workload W ...]

Episodes of `--jobs` Poisson jobs (`policy_matrix.py`'s mix and steps, 60 jobs/h, seeds
0, 1, ...) on `--nodes` x 6 GPUs, stepped by two agents without learning: the FIFO
agent (`fifo_pick`: the first job that may start, on its most GPUs) and a random one
(uniform over the allowed actions, seeded); per agent the median over the episodes of
steps per second, and the median step in microseconds. A step is one decision: the
simulation runs in a thread up to the next decision, so a step includes the simulator's
work between two decisions.

`--against-fifo`: the learned policy beside the same policy with FIFO choices (`fifo_pick`:
the first job that may start, on the most GPUs it may; the packing rule unchanged) on
`policy_matrix.py`'s workloads (default: the held-out Poisson ones), costs 5/5 s: makespan
and average JCT, and the learned one's ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from benchmarks.policy_matrix import HELD_OUT, LOADS, MIX, PROFILE, WORKLOADS, arrivals_of  # noqa: E402
from marbled.core.policy.learned import LearnedPolicy, fifo_pick  # noqa: E402
from marbled.resources import load_profile  # noqa: E402
from marbled.sim.engine import Simulator  # noqa: E402
from marbled.sim.env import SchedulingEnv  # noqa: E402
from marbled.sim.workloads import poisson  # noqa: E402


def against_fifo(workloads: list[str]) -> None:
    book = load_profile(PROFILE)
    print(f"{'workload':14}{'FIFO makespan':>14}{'learned':>9}{'ratio':>7}"
          f"{'FIFO avg JCT':>14}{'learned':>9}{'ratio':>7}")
    for w in workloads:
        arrivals, nodes = arrivals_of(w)
        fifo, learned = (Simulator(book, p, book.gpus_per_node, nodes, 5.0, 5.0).run(arrivals)
                         for p in (LearnedPolicy(pick=fifo_pick), LearnedPolicy()))
        print(f"{w:14}{fifo.makespan:>14.0f}{learned.makespan:>9.0f}"
              f"{learned.makespan / fifo.makespan:>7.3f}{fifo.average_jct:>14.0f}"
              f"{learned.average_jct:>9.0f}{learned.average_jct / fifo.average_jct:>7.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--against-fifo", action="store_true",
                    help="the learned policy against FIFO choices instead")
    ap.add_argument("--workload", action="append", choices=WORKLOADS + list(LOADS),
                    help="with --against-fifo (repeatable; default: the Poisson ones)")
    args = ap.parse_args()
    if args.against_fifo:
        return against_fifo(args.workload or [w for w in HELD_OUT if w.startswith("poisson")])
    book = load_profile(PROFILE)
    rng = np.random.default_rng(0)
    agents = {"fifo": lambda env: fifo_pick(env._obs, None, 0.0),
              "random": lambda env: int(rng.choice(np.flatnonzero(env.action_masks())))}
    print(f"{args.episodes} episodes of {args.jobs} jobs, {args.nodes} nodes x "
          f"{book.gpus_per_node} GPUs")
    for name, agent in agents.items():
        rates, steps_us = [], []
        for seed in range(args.episodes):
            env = SchedulingEnv(book, poisson(args.jobs, 60.0, MIX, (500, 5000), seed),
                                gpus_per_node=book.gpus_per_node, nodes=args.nodes)
            env.reset(seed=seed)
            done, steps, t0 = False, 0, time.perf_counter()
            while not done:
                t1 = time.perf_counter()
                _, _, done, _, _ = env.step(agent(env))
                steps_us.append((time.perf_counter() - t1) * 1e6)
                steps += 1
            rates.append(steps / (time.perf_counter() - t0))
            env.close()
        print(f"{name:7} {statistics.median(rates):8.0f} steps/s (median of {len(rates)} "
              f"episodes), a step {statistics.median(steps_us):6.0f} us median")


if __name__ == "__main__":
    main()
