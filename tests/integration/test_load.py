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


def test_jobs_from_clients_that_keep_their_connections_open_are_each_recorded_once(tmp_path):
    """As HTTP client libraries send (requests' sessions, aiohttp's): every request of a
    client on one HTTP/1.1 connection, 20 clients at once."""
    result = load(tmp_path / "state", clients=20, jobs=2_000, keepalive=True)
    assert result.errors == [] and result.violations == []
    assert result.submitted == 2_000
