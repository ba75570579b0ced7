"""Fault injection: the broker is killed (SIGKILL) at 20 random moments of a job set.

Real brokers, processes, signals and SQLite; only the GPUs are emulated. The
checks (benchmarks/fault_injection.py, which also runs the long version) read
the jobs' own step logs and the broker's database: every step trained once, no
job or GPU doubled, and run records that chain (each run has its end step and
starts where the one before ended; no run launched with nothing to train).
The restarts' recovery cases one by one: tests/broker/test_recovery.py.
"""

from __future__ import annotations

import pytest

from benchmarks.fault_injection import chaos

pytestmark = pytest.mark.daemon


def test_twenty_broker_kills_lose_nothing_and_start_nothing_twice(tmp_path):
    result = chaos(tmp_path / "state", kills=20, seed=7, time_scale=0.05)
    assert result.kills == 20, "the job set ended before 20 kills: nothing was tested"
    assert result.violations == []
    assert result.adopted >= 20  # running jobs were re-adopted, not started again
