"""How fast the simulator replays a large trace: N Poisson jobs on nodes x 6 GPUs.

    .venv/bin/python benchmarks/simulator_speed.py [--jobs 10000] [--nodes 64] [--repeat 3]
                                                   [--policy P ...]

Prints the median wall time per policy over the repeats (one core; the simulator is
single-threaded) and the schedule's size, so a change that alters the schedule shows.
"""

from __future__ import annotations

import argparse
import statistics
import time

from marbled.core.policy import POLICIES, get_policy
from marbled.resources import load_profile
from marbled.sim.engine import Simulator
from marbled.sim.workloads import poisson

MIX = {"resnet-50": 3, "inception-v3": 2, "resnet-101": 2, "vgg-16": 2, "alexnet": 1,
       "lenet": 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rate", type=float, default=2000.0, help="arrivals per hour")
    ap.add_argument("--policy", action="append", choices=sorted(POLICIES),
                    help="time only this policy (repeatable; default: all)")
    args = ap.parse_args()
    book = load_profile()
    arrivals = poisson(args.jobs, args.rate, MIX, (500, 5000), seed=1)
    print(f"{args.jobs} jobs, {args.nodes} nodes x 6 GPUs, {args.rate:g} arrivals/h, "
          f"median of {args.repeat}")
    for name in args.policy or sorted(POLICIES):
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = Simulator(book, get_policy(name), 6, args.nodes).run(arrivals)
            times.append(time.perf_counter() - t0)
        print(f"{name:8} {statistics.median(times):7.2f} s  runs {len(result.runs):6}  "
              f"makespan {result.makespan:9.0f} s  suspensions {result.suspensions}")


if __name__ == "__main__":
    main()
