"""The elastic policy in the real daemon: a job grows 1 -> 2 -> 4 GPUs by real suspend and
resume, and gives half back when a newcomer finds no free GPU (emulated jobs)."""

from __future__ import annotations

import sys

import pytest

from tests.scenarios import check_no_gpu_shared, runs_by_job

pytestmark = pytest.mark.daemon

EMULATE = [sys.executable, "-m", "marbled.worker.emulate", "--time-scale", "0.01"]


def test_a_job_doubles_when_stable_and_halves_for_a_newcomer(daemon_factory, tmp_path):
    daemon = daemon_factory("--policy", "elastic", "--grow-after", "0.5", gpus=4)
    log = tmp_path / "steps.log"
    daemon.submit({"model": "inception-v3", "steps": 3000,
                   "command": [*EMULATE, "--step-log", str(log)]})
    daemon.wait_for(lambda: [r["gpu_count"] for r in daemon.runs()] == [1, 2, 4], timeout=30)
    daemon.submit({"model": "inception-v3", "steps": 300, "emulate": True})
    jobs = daemon.wait_all(timeout=90)
    assert [(j["state"], j["step"]) for j in jobs] == [("done", 3000), ("done", 300)]
    runs = runs_by_job(daemon)
    assert [r["gpu_count"] for r in runs[1]][:4] == [1, 2, 4, 2]
    assert runs[2][0]["gpu_count"] == 1
    assert runs[2][0]["started_at"] >= runs[1][2]["ended_at"]  # after the halving
    for a, b in zip(runs[1], runs[1][1:], strict=False):
        assert 0 < a["end_step"] == b["start_step"]
    assert [int(s) for s in log.read_text().split()] == list(range(1, 3001))
    check_no_gpu_shared(daemon.runs())
