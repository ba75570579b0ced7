"""What a wrong profile costs, with and without online learning, simulated and in the daemon.

A model whose true curve is fastest on 2 GPUs while the profile says 6:

* simulated: 40 jobs of it (and 40 of a correctly profiled model) arriving over an
  hour on 2 nodes of 6 GPUs, under marble and adaptive: told only the wrong profile,
  told it but learning from the runs, and told the truth;
* in the daemon: N jobs of it one after another (EMULATED jobs, real processes,
  time scale 1), the first on 3 GPUs as a user may ask and the others `auto`, with
  --no-learn and with learning: the total time, and the GPU count of each run.

    .venv/bin/python benchmarks/wrong_profile.py [--daemon-jobs 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from marbled.cli.client import BrokerClient
from marbled.core.learning import Learning
from marbled.core.policy import get_policy
from marbled.core.profiles import ProfileBook
from marbled.demo import start_broker
from marbled.paths import socket_path
from marbled.sim.engine import Simulator
from marbled.sim.workloads import poisson

TRUE = [10.0, 15.0, 14.0, 12.0, 10.0, 9.0]
WRONG = [5.0, 9.0, 12.0, 14.0, 15.0, 16.0]
OTHER = [3.3, 6.0, 6.5, 6.4, 6.3, 6.2]


def book(net: list[float]) -> ProfileBook:
    return ProfileBook.from_mapping({"system": "s", "gpus_per_node": 6, "models": {
        "net": {"steps_per_second": net}, "other": {"steps_per_second": OTHER}}})


def simulated() -> list[dict]:
    arrivals = poisson(80, 80, {"net": 1, "other": 1}, (5000, 20000), seed=0)
    out = []
    for policy in ("marble", "adaptive"):
        for name, told, learning in (("wrong profile", book(WRONG), None),
                                     ("wrong profile + learning", book(WRONG), Learning()),
                                     ("true profile", book(TRUE), None)):
            r = Simulator(told, get_policy(policy), 6, 2, 5.0, 5.0, truth=book(TRUE),
                          learning=learning).run(arrivals)
            out.append({"policy": policy, "case": name, "makespan_s": r.makespan,
                        "average_jct_s": r.average_jct})
    return out


def daemon(jobs: int) -> list[dict]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        truth, told = Path(tmp) / "truth.yaml", Path(tmp) / "told.yaml"
        steps = [v * 100 for v in TRUE]  # 100x the rates: about 2-4 s per job
        truth.write_text(f"system: t\ngpus_per_node: 6\nmodels:\n  net: "
                         f"{{steps_per_second: {steps}}}\n")
        told.write_text(f"system: w\ngpus_per_node: 6\nmodels:\n  net: "
                        f"{{steps_per_second: {[v * 100 for v in WRONG]}}}\n")
        for name, extra in (("wrong profile, --no-learn", ("--no-learn",)),
                            ("wrong profile, learning", ("--learn-interval", "0.2"))):
            state = Path(tmp) / name.replace(" ", "").replace(",", "")
            proc = start_broker(state, "marble", 6, 1.0, ("--profile", str(told), *extra))
            client = BrokerClient(socket_path(state))
            command = [sys.executable, "-m", "marbled.worker.emulate", "--profile", str(truth)]
            # the first on 3 GPUs, as a user may ask: one count measured says only the
            # machine's scale (docs/profiling.md), a second one the curve's shape
            client.post("/v1/jobs", {"jobs": [
                {"model": "net", "steps": 3000, "command": command, "name": f"j{i}",
                 **({"after": [f"j{i - 1}"]} if i else {"gpus": 3})} for i in range(jobs)]})
            t0 = time.monotonic()
            while any(j["state"] not in ("done", "failed", "cancelled")
                      for j in client.get("/v1/jobs")["jobs"]):
                time.sleep(0.1)
            took = time.monotonic() - t0
            counts = [len(r["gpus"]) for r in client.get("/v1/runs")["runs"]]
            proc.terminate()
            proc.wait(timeout=60)
            out.append({"case": name, "jobs": jobs, "seconds": took, "gpus_per_run": counts})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--daemon-jobs", type=int, default=6)
    ap.add_argument("--json")
    args = ap.parse_args()
    sim = simulated()
    print("simulated: 80 jobs (half of them the mis-profiled model), 2 nodes x 6 GPUs, "
          "5 s costs")
    print(f"{'policy':<9} {'case':<26} {'makespan s':>11} {'avg JCT s':>10}")
    for r in sim:
        print(f"{r['policy']:<9} {r['case']:<26} {r['makespan_s']:>11.0f} "
              f"{r['average_jct_s']:>10.0f}")
    real = daemon(args.daemon_jobs)
    print(f"\ndaemon: {args.daemon_jobs} jobs of the mis-profiled model, one after another")
    for r in real:
        print(f"{r['case']:<26} {r['seconds']:>6.1f} s   GPUs per run {r['gpus_per_run']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"simulated": sim, "daemon": real}, indent=1))


if __name__ == "__main__":
    main()
