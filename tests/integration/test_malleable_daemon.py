"""The malleable policy in the real daemon: a running job is reshaped by a real SIGTSTP,
checkpoint and resume on its new GPU count (emulated jobs, real processes and signals)."""

from __future__ import annotations

import sys

import pytest

from tests.scenarios import check_no_gpu_shared, runs_by_job

pytestmark = pytest.mark.daemon

EMULATE = [sys.executable, "-m", "marbled.worker.emulate", "--time-scale", "0.01"]


def test_an_arrival_shrinks_the_running_job_and_it_grows_back_when_alone(daemon_factory,
                                                                            tmp_path):
    # Guard 0.5 s wall time: the emulated jobs run at 1/100 of their profiled time. Job 1 is
    # a command the broker cannot know runs 100x faster than the profile: not learning keeps
    # its sizes the profile's (learning would take it for a machine of another speed).
    daemon = daemon_factory("--policy", "malleable", "--preempt-guard", "0.5", "--no-learn")
    log = tmp_path / "steps.log"
    daemon.submit({"model": "inception-v3", "steps": 3000,
                   "command": [*EMULATE, "--step-log", str(log)]})
    daemon.wait_for(lambda: any(j["step"] > 20 for j in daemon.client.get("/v1/jobs")["jobs"]),
                    timeout=30)
    daemon.submit({"model": "inception-v3", "steps": 1000, "emulate": True})
    jobs = daemon.wait_all(timeout=90)
    assert [(j["state"], j["step"]) for j in jobs] == [("done", 3000), ("done", 1000)]
    runs = runs_by_job(daemon)
    # Job 1 alone on its optimum (4), shrunk to its D'Hondt share of 6 (3) when job 2
    # came, grown back to 4 once job 2 was done (it then had more than 0.5 s to go).
    assert [r["gpu_count"] for r in runs[1]] == [4, 3, 4]
    assert [r["end_reason"] for r in runs[1]] == ["suspended", "suspended", "done"]
    assert [r["gpu_count"] for r in runs[2]] == [3]
    for a, b in zip(runs[1], runs[1][1:], strict=False):
        assert 0 < a["end_step"] == b["start_step"]
    assert [int(s) for s in log.read_text().split()] == list(range(1, 3001))
    reasons = daemon.query("SELECT data FROM events WHERE kind = 'suspend-requested' "
                           "AND job_id = 1")
    assert reasons and all("equipartition" in r["data"] for r in reasons)
    check_no_gpu_shared(daemon.runs())
