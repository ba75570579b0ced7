"""20 clients submit 10,000 jobs at once to a real broker (benchmarks/submit_load.py)."""

from __future__ import annotations

import pytest

from benchmarks.submit_load import load

pytestmark = pytest.mark.daemon


def test_ten_thousand_jobs_from_twenty_clients_are_each_recorded_once(tmp_path):
    result = load(tmp_path / "state", clients=20, jobs=10_000)
    assert result.errors == [] and result.violations == []
    assert result.submitted == 10_000
    # the broker kept answering a status probe while the clients submitted (latencies are
    # the benchmark's business: benchmarks/submit_load.py prints them)
    assert len(result.status_latency) >= 10
