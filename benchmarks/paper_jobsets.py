"""Total time of the paper's job sets 1-3 (Table II), MARBLE way vs LSF way, measured through
two real brokers on 6 emulated GPUs with emulated jobs, beside the simulator and the paper.

    .venv/bin/python benchmarks/paper_jobsets.py [--repeat 3] [--time-scale 0.02]

Times are in profiled seconds (real seconds / time scale); medians over the repeats.
"""

from __future__ import annotations

import argparse
import statistics

from marbled.demo import compare_policies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--time-scale", type=float, default=0.02)
    args = ap.parse_args()
    print(f"{'job set':8} {'LSF meas':>9} {'sim':>6} {'paper':>6}  {'MARBLE meas':>11} "
          f"{'sim':>6} {'paper':>6}  {'ratio meas':>10} {'sim':>5} {'paper':>6}")
    for n in (1, 2, 3):
        results = [compare_policies(f"paper-jobset{n}", 6, args.time_scale)
                   for _ in range(args.repeat)]
        assert not any(r["policies"][p]["failed"] for r in results for p in ("marble", "rigid"))
        rigid = statistics.median(r["policies"]["rigid"]["total_s"] for r in results)
        marble = statistics.median(r["policies"]["marble"]["total_s"] for r in results)
        p = results[0]["policies"]
        print(f"set {n:<4} {rigid:>9.0f} {p['rigid']['simulated_s']:>6.0f} "
              f"{p['rigid']['paper_s']:>6}  {marble:>11.0f} {p['marble']['simulated_s']:>6.0f} "
              f"{p['marble']['paper_s']:>6}  {rigid / marble:>10.2f} "
              f"{p['rigid']['simulated_s'] / p['marble']['simulated_s']:>5.2f} "
              f"{p['rigid']['paper_s'] / p['marble']['paper_s']:>6.2f}")


if __name__ == "__main__":
    main()
