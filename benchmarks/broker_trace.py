"""A trace from a real broker's log, for `policy_matrix.py --held-out --trace` (issue 23).

    .venv/bin/python benchmarks/broker_trace.py [--jobs 40] [--rate 60] [--seed 11]
        [--nodes 2] [--time-scale 0.01] [--out benchmarks/traces/broker-2x6.csv]

Starts a real `marbled` on emulated GPUs (`--nodes` x 6, its default policy), submits
`--jobs` emulated jobs at Poisson arrivals of `--rate` jobs per hour, each when its time
comes (in the broker's time: at `--time-scale` real seconds per second), waits for them
all and turns its `marble.db` into a CSV trace (`trace_from_store`, what `marble trace`
does), its arrival times divided by the time scale, so the trace holds the submissions
as the broker's jobs saw them. The mix and steps are `policy_matrix.py`'s; the seed is
not one the learned policy trained on.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # benchmarks.*, tests.conftest

from benchmarks.policy_matrix import MIX  # noqa: E402
from marbled.sim.workloads import Arrival, poisson, trace_from_store, write_trace  # noqa: E402
from tests.conftest import start_daemon  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--rate", type=float, default=60.0, help="jobs per hour")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--nodes", type=int, default=2, help="nodes of 6 emulated GPUs")
    ap.add_argument("--time-scale", type=float, default=0.01)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "traces" / "broker-2x6.csv")
    args = ap.parse_args()
    arrivals = poisson(args.jobs, args.rate, MIX, (500, 5000), args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        daemon = start_daemon(Path(tmp) / "state", "--nodes", str(args.nodes),
                              gpus=6 * args.nodes, time_scale=args.time_scale)
        try:
            t0 = time.monotonic()
            for a in arrivals:
                time.sleep(max(0.0, t0 + a.at * args.time_scale - time.monotonic()))
                daemon.submit(a.spec.to_mapping())
            jobs = daemon.wait_all(timeout=600)
        finally:
            daemon.stop()
        assert all(j["state"] == "done" for j in jobs), jobs
        trace, _ = trace_from_store(Path(tmp) / "state" / "marble.db")
    scaled = [Arrival(a.at / args.time_scale, a.spec) for a in trace]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_trace(args.out, scaled, comment=f"{args.jobs} jobs through a real marbled on "
                f"{args.nodes} x 6 emulated GPUs at time scale {args.time_scale:g}, "
                f"arrival times divided by it (benchmarks/broker_trace.py --seed {args.seed})")
    print(f"{len(scaled)} jobs over {scaled[-1].at:.0f} s; wrote {args.out}")


if __name__ == "__main__":
    main()
