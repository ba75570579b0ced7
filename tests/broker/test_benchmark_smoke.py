"""The decision-latency benchmark runs (CI smoke: no thresholds, it must run and print its
figures): benchmarks/decision_latency.py --smoke, on the pure core and on a real Broker
with the fakes of tests/broker/fakes.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_decision_latency_smoke_prints_and_writes_its_figures(tmp_path):
    out = tmp_path / "latency.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "decision_latency.py"), "--smoke",
         "--json", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "on the pure core" in done.stdout and "as seen by the daemon" in done.stdout
    cells = json.loads(out.read_text())["cells"]
    assert cells
    for cell in cells:
        for scenario in ("free", "ended"):
            assert cell["core"][scenario]["median_ms"] > 0
            assert cell["daemon"][scenario]["first"]["median_ms"] > 0
