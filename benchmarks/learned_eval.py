"""The learned policy on held-out cells, against the what-if planner it learned from (issue 34).

    .venv/bin/python benchmarks/learned_eval.py [--seeds held-out] [--family F ...]
        [--weights STAGE=FILE ...] [--prior-weight W] [--processes 2] [--json FILE]

Every cell of `policy_matrix.py`'s families (production-shaped traces, the multi-node
family's long jobs, job sets submitted together) on a seed set (default held-out: never
trained or tuned on), costs 10/10, under: the what-if planner (the teacher), every other
policy of the zoo (adaptive, malleable, elastic, marble, moldable, rigid, timeslice), the
shipped learned policy, each `--weights` network
(e.g. a training's `learned-bc.npz`, `learned-dagger.npz`, `learned-ppo.npz`), and FIFO
order with the learned policy's packing (`fifo_pick`); the networks lean on their prior by
`--prior-weight` (default the policy's). Per policy: the cells within 5 % of
the planner on both average JCT and makespan, the median and worst ratios, and its CPU
seconds; then per family.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from benchmarks.policy_matrix import FAMILIES, PROFILE, SEEDS, arrivals_of, family, gpus_of  # noqa: E402
from marbled.core.policy import get_policy  # noqa: E402
from marbled.core.policy.learned import PRIOR_WEIGHT, LearnedPolicy, Network, fifo_pick  # noqa: E402
from marbled.resources import load_profile  # noqa: E402
from marbled.sim.engine import Simulator  # noqa: E402

TEACHER = "whatif"
OTHERS = ("adaptive", "malleable", "elastic", "marble", "moldable", "rigid", "timeslice")
COSTS = (10.0, 10.0)
WITHIN = 1.05


def _policy(name: str, weights: dict[str, str], prior_weight: float):
    if name == "fifo-packing":
        return LearnedPolicy(pick=fifo_pick)
    if name in weights:
        return LearnedPolicy(network=Network.load(weights[name]), prior_weight=prior_weight)
    if name == "learned":
        return LearnedPolicy(prior_weight=prior_weight)
    return get_policy(name)


def run_cell(args) -> tuple[str, dict[str, dict]]:
    workload, names, weights, prior_weight = args
    book = load_profile(PROFILE)
    arrivals, nodes = arrivals_of(workload)
    out = {}
    for name in names:
        t0 = time.process_time()
        r = Simulator(book, _policy(name, weights, prior_weight), gpus_of(workload, book), nodes,
                      *COSTS).run(arrivals)
        out[name] = {"jct": r.average_jct, "makespan": r.makespan,
                     "cpu_s": time.process_time() - t0}
    return workload, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", choices=tuple(SEEDS), default="held-out")
    ap.add_argument("--family", action="append", choices=FAMILIES)
    ap.add_argument("--weights", action="append", default=[], metavar="STAGE=FILE",
                    help="a network to judge beside the shipped one (repeatable)")
    ap.add_argument("--prior-weight", type=float, default=PRIOR_WEIGHT,
                    help=f"the networks' lean on their prior (default {PRIOR_WEIGHT:g})")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    weights = {}
    for item in args.weights:
        stage, _, path = item.partition("=")
        if not path or not os.path.isfile(path):
            sys.exit(f"--weights {item}: give STAGE=FILE with an existing .npz file")
        weights[stage] = path
    names = [TEACHER, *OTHERS, "learned", *weights, "fifo-packing"]
    cells = [w for f in (args.family or FAMILIES) for w in family(f, args.seeds)]
    with ProcessPoolExecutor(args.processes) as pool:
        results = dict(pool.map(run_cell, [(w, names, weights, args.prior_weight)
                                           for w in cells]))
    print(f"{len(cells)} cells ({args.seeds} seeds), costs 10/10; ratios to {TEACHER}'s")
    print(f"{'policy':14}{'within 5 %':>11}{'JCT med':>9}{'worst':>7}{'span med':>9}"
          f"{'worst':>7}{'CPU s':>8}")
    summary = {}
    for name in names[1:]:
        j = [results[w][name]["jct"] / results[w][TEACHER]["jct"] for w in cells]
        m = [results[w][name]["makespan"] / results[w][TEACHER]["makespan"] for w in cells]
        ok = sum(a <= WITHIN and b <= WITHIN for a, b in zip(j, m, strict=True))
        cpu = sum(results[w][name]["cpu_s"] for w in cells)
        fam = {f: sum(a <= WITHIN and b <= WITHIN for w, a, b in zip(cells, j, m, strict=True)
                      if w in family(f, args.seeds)) for f in (args.family or FAMILIES)}
        summary[name] = {"within": ok, "cells": len(cells), "by_family": fam,
                         "jct_median": statistics.median(j), "jct_worst": max(j),
                         "makespan_median": statistics.median(m), "makespan_worst": max(m),
                         "cpu_s": cpu}
        print(f"{name:14}{ok:>6}/{len(cells):<4}{statistics.median(j):>9.3f}{max(j):>7.3f}"
              f"{statistics.median(m):>9.3f}{max(m):>7.3f}{cpu:>8.1f}   "
              + " ".join(f"{f} {n}" for f, n in fam.items()))
    cpu = sum(results[w][TEACHER]["cpu_s"] for w in cells)
    print(f"{TEACHER:14}{'(itself)':>11}{'':>32}{cpu:>8.1f}")
    if args.json:
        args.json.write_text(json.dumps({"cells": results, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
