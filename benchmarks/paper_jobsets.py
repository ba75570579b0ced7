"""Total time of the paper's job sets 1-3 (Table II), MARBLE way vs LSF way, measured through
two real brokers on 6 emulated GPUs with emulated jobs, beside the simulator and the paper.

    .venv/bin/python benchmarks/paper_jobsets.py [--repeat 3] [--time-scale 0.02]
        [--jobsets 1,2,3] [--json out.json]

Times are in profiled seconds (real seconds / time scale); medians over the repeats. Both
brokers of a job set run at once (`marbled.demo.compare_policies`); benchmarks/end_to_end.py
prints the same table.
"""

from __future__ import annotations

import argparse
import json
import statistics

from marbled.demo import compare_policies


def measure(jobsets: list[int], repeat: int = 3, time_scale: float = 0.02) -> list[dict]:
    """One row per job set: measured (median of `repeat`), simulated and paper seconds, per way."""
    rows = []
    for n in jobsets:
        results = [compare_policies(f"paper-jobset{n}", 6, time_scale) for _ in range(repeat)]
        failed = [j for r in results for p in ("marble", "rigid")
                  for j in r["policies"][p]["failed"]]
        row = {"jobset": n, "time_scale": time_scale, "repeat": repeat, "failed": failed}
        for policy in ("marble", "rigid"):
            p = results[0]["policies"][policy]
            measured = [r["policies"][policy]["total_s"] for r in results]
            row[policy] = {"measured_s": statistics.median(measured),
                           "measured_all_s": [round(m, 1) for m in measured],
                           "simulated_s": p["simulated_s"], "paper_s": p["paper_s"]}
        for key in ("measured_s", "simulated_s", "paper_s"):
            row.setdefault("ratio", {})[key] = row["rigid"][key] / row["marble"][key]
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'job set':8} {'LSF meas':>9} {'sim':>6} {'paper':>6}  {'MARBLE meas':>11} "
          f"{'sim':>6} {'paper':>6}  {'ratio meas':>10} {'sim':>5} {'paper':>6}")
    for row in rows:
        r, m, q = row["rigid"], row["marble"], row["ratio"]
        print(f"set {row['jobset']:<4} {r['measured_s']:>9.0f} {r['simulated_s']:>6.0f} "
              f"{r['paper_s']:>6}  {m['measured_s']:>11.0f} {m['simulated_s']:>6.0f} "
              f"{m['paper_s']:>6}  {q['measured_s']:>10.2f} {q['simulated_s']:>5.2f} "
              f"{q['paper_s']:>6.2f}" + (f"  FAILED jobs {row['failed']}" if row["failed"] else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--time-scale", type=float, default=0.02)
    ap.add_argument("--jobsets", default="1,2,3", help="comma-separated job set numbers")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    rows = measure([int(n) for n in args.jobsets.split(",")], args.repeat, args.time_scale)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    assert not any(row["failed"] for row in rows), "some jobs did not end done"


if __name__ == "__main__":
    main()
