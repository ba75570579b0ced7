"""What a forecast costs (GET /v1/forecast, `marble status`): the simulator played from now on
a queue of N jobs, per policy and cluster size, in process, median of --repeat. A forecast
gives up past its budget (marbled.sim.forecast.BUDGET_S): such rows say "over budget".

    .venv/bin/python benchmarks/forecast_cost.py [--jobs 10,100,1000,2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from marbled.core.policy import get_policy
from marbled.core.spec import JobSpec
from marbled.resources import load_profile
from marbled.sim.forecast import Left, forecast


def queue(n: int, models: list[str], seed: int = 0) -> list[Left]:
    rng = random.Random(seed)
    return [Left(i, JobSpec(emulate=True, model=rng.choice(models),
                            steps=rng.choice([500, 2000, 8000])), 0, False)
            for i in range(1, n + 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="10,100,1000,2000")
    parser.add_argument("--policy", default="marble,adaptive,malleable")
    parser.add_argument("--nodes", default="1,8")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    book = load_profile("summit-v100")
    rows = []
    print(f"{'policy':<10} {'nodes':>5} {'jobs':>6} {'median ms':>10}")
    for name in args.policy.split(","):
        for nodes in map(int, args.nodes.split(",")):
            for n in map(int, args.jobs.split(",")):
                jobs = queue(n, sorted(book.models))
                times, complete = [], True
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    result = forecast(jobs, book, get_policy(name), [6] * nodes, 0.0)
                    times.append(time.perf_counter() - t0)
                    complete = complete and result.finish_at is not None
                ms = statistics.median(times) * 1e3
                rows.append({"policy": name, "nodes": nodes, "jobs": n, "median_ms": ms,
                             "complete": complete})
                print(f"{name:<10} {nodes:>5} {n:>6} {ms:>10.1f}"
                      + ("" if complete else "  over budget"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
