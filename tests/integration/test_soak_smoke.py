"""The soak benchmark's smoke version runs a real broker through 500 jobs, its pollers, a
restart, and prints its figures (no thresholds: they depend on the machine;
benchmarks/README.md has the real runs)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import REPO

pytestmark = pytest.mark.daemon


def test_soak_smoke(tmp_path):
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "soak.py"), "--smoke",
                           "--json", str(out)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    for what in ("submit:", "jobs/s", "batch of 500", "marble status, quiet", "marble logs",
                 "RSS: start", "restart: answers after"):
        assert what in done.stdout, f"{what!r} not printed:\n{done.stdout}"
    fig = json.loads(out.read_text())
    assert fig["jobs"] == 500 and fig["left_unfinished"] == 0 and not fig["poll_errors"]
    assert fig["submit"]["jobs_per_second"] > 0 and fig["restart_s"] > 0
    assert fig["status_quiet"]["calls"] == 5 and fig["logs_quiet"]["p95_ms"] > 0
    assert fig["rss_start_mb"] > 0 and fig["rss_peak_mb"] >= fig["rss_start_mb"]
