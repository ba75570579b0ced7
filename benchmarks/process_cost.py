"""What one process costs: the CPU (user + system) and wall time of the processes a user
and the test suite start again and again.

  python      the interpreter of this environment with nothing to do (`-c pass`): its
              site start-up (an editable install's import hook, if any, is paid here)
  broker      `marbled --gpus 6` from its start until it answers, then its stop (SIGTERM)
  submit      `marble submit --gpus 1 -- true` against that broker (live)
  status      `marble status` against it (live)
  report      `marble report summary --json` of its state file (offline: sqlite3)
  offline     `marble status` of that state file once the broker has stopped (the store)

Each is run --repeat times one after another; medians. CPU is the child's own
(getrusage of the children), so it does not count what the broker does for a client.

    .venv/bin/python benchmarks/process_cost.py [--repeat 9] [--json F]
    .venv/bin/python benchmarks/process_cost.py --smoke       # CI: each once, a few seconds
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from marbled.demo import start_broker
from marbled.paths import DB_NAME

MARBLE = [sys.executable, "-m", "marbled.cli.client_cmd"]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(argv: list[str], env: dict) -> tuple[float, float]:
    """(CPU s, wall s) of one run of argv, which must succeed."""
    cpu, wall = _cpu(), time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    wall, cpu = time.perf_counter() - wall, _cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr}")
    return cpu, wall


def broker_once(state: Path, env: dict) -> tuple[float, float]:
    """(CPU s, wall s) of a broker's start until it answers plus its stop."""
    cpu, wall = _cpu(), time.perf_counter()
    proc = start_broker(state, "marble", 6, 0.01, env=env)
    serving = time.perf_counter() - wall
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    return _cpu() - cpu, serving


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--smoke", action="store_true", help="each once (CI)")
    args = ap.parse_args()
    if args.smoke:
        args.repeat = 1
    figures: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        env = {**os.environ, "MARBLE_STATE_DIR": str(state)}
        env.pop("MARBLE_URL", None)
        figures["python"] = [timed([sys.executable, "-c", "pass"], env)
                             for _ in range(args.repeat)]
        figures["broker"] = [broker_once(Path(tmp) / f"b{i}", env) for i in range(args.repeat)]
        proc = start_broker(state, "marble", 6, 0.01, env=env)
        try:
            figures["submit"] = [timed([*MARBLE, "submit", "--gpus", "1", "--", "true"], env)
                                 for _ in range(args.repeat)]
            figures["status"] = [timed([*MARBLE, "status"], env) for _ in range(args.repeat)]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        db = str(state / DB_NAME)
        figures["report"] = [timed([*MARBLE, "report", "summary", "--db", db, "--json"], env)
                             for _ in range(args.repeat)]
        figures["offline"] = [timed([*MARBLE, "status"], env) for _ in range(args.repeat)]
    print(f"median of {args.repeat}; load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{sys.executable}")
    out = {}
    for name, values in figures.items():
        cpu = statistics.median(c for c, _ in values) * 1000
        wall = statistics.median(w for _, w in values) * 1000
        out[name] = {"cpu_ms": round(cpu, 1), "wall_ms": round(wall, 1)}
        print(f"  {name:8} CPU {cpu:7.1f} ms   wall {wall:7.1f} ms"
              + ("  (to serving)" if name == "broker" else ""))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
