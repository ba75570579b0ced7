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


def _smoke(script: str, tmp_path) -> tuple[str, dict]:
    out = tmp_path / f"{script}.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), "--smoke",
                           "--json", str(out)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, json.loads(out.read_text())


def test_submission_smoke(tmp_path):
    printed, figures = _smoke("submit_load.py", tmp_path)
    parts = ("api-1", "api-20", "api-20-ka", "batch-100", "batch-1000", "cli", "cli-file")
    for part in parts:
        assert part in printed, f"{part!r} not printed:\n{printed}"
        fig = figures["parts"][part]
        assert fig["jobs_per_second"] > 0 and not fig.get("errors") \
            and not fig.get("violations"), fig
        assert fig.get("recorded", fig["jobs"]) == fig["jobs"]
    assert figures["parts"]["cli"]["import_ms"]["imports_ms"] > 0


def test_monitoring_smoke(tmp_path):
    printed, figures = _smoke("monitoring.py", tmp_path)
    assert "cycle,  6 running" in printed and "48 running" in printed, printed
    assert [c["running"] for c in figures["cycle"]] == [6, 48]
    assert all(c["secondaries"] >= 1 and c["cycle_unchanged_us"]["median"] > 0
               for c in figures["cycle"])
    assert figures["queued"]["rss_queued_mb"] > 0 and figures["queued"]["page_jobs"] == 100
    assert figures["history"]["events"] == 2000 and figures["history"]["db_bytes"] > 0


def test_process_cost_smoke(tmp_path):
    printed, figures = _smoke("process_cost.py", tmp_path)
    kinds = ("python", "broker", "submit", "status", "report", "offline")
    assert list(figures) == list(kinds), figures
    for kind in kinds:
        assert kind in printed and figures[kind]["wall_ms"] > 0, (kind, printed)
    assert figures["broker"]["cpu_ms"] > 0  # the children's CPU is read (a start costs ~1 s)
