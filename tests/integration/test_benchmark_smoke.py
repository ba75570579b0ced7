"""The end-to-end benchmark's smoke version runs and prints its figures (no thresholds: the
figures depend on the machine; benchmarks/README.md has the real runs)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import REPO

pytestmark = pytest.mark.daemon


def test_end_to_end_smoke(tmp_path):
    pytest.importorskip("hyperqueue", reason="HyperQueue is in the 'bench' extra")
    out = tmp_path / "e2e.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "end_to_end.py"), "--smoke",
                           "--json", str(out)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = done.stdout
    for what in ("trivial jobs on 6 slots", "marbled", "hyperqueue", "jobs/s",
                 "paper job sets 3", "set 3", "load at end"):
        assert what in printed, f"{what!r} not printed:\n{printed}"
    figures = json.loads(out.read_text())
    assert {(r["workload"], r["system"]) for r in figures["trivial_summary"]} == {
        (w, s) for w in ("true", "sleep 0.1") for s in ("marbled", "hyperqueue")}
    assert all(r["jobs_per_s"] > 0 and not r["not_done"] for r in figures["trivial"])
    (row,) = figures["jobsets"]
    assert row["marble"]["measured_s"] > 0 and row["rigid"]["simulated_s"] > 0
    assert not row["failed"]
