"""The what-if planner in the real daemon, on two emulated nodes: it plans in a process beside
the broker's loop (spawned, real), follows the plan it adopts, says so in `explain`, and
counts its plans and their CPU in /metrics; a plain command it cannot simulate runs beside
it, and every job trains to its last step once (emulated jobs, real processes and signals)."""

from __future__ import annotations

import sys

import pytest

from tests.integration.test_metrics import scrape
from tests.scenarios import check_no_gpu_shared, runs_by_job

pytestmark = pytest.mark.daemon

PLAIN = [sys.executable, "-c", "import time; time.sleep(1.0)"]


def test_the_planner_plans_beside_the_loop_and_every_job_ends_once(daemon_factory):
    daemon = daemon_factory("--policy", "whatif", "--plan-every", "0", "--nodes", "2",
                            gpus=4)
    # while the plain command (no model, no steps) is in the system, nothing can be simulated
    first = daemon.submit({"command": PLAIN, "gpus": 1})[0]
    view = daemon.client.get(f"/v1/jobs/{first['id']}")
    assert "the planner follows adaptive until it can simulate the jobs" in \
        view["reasons"]
    daemon.wait_all(timeout=60)
    daemon.submit({"model": "inception-v3", "steps": 4000, "emulate": True},
                  {"model": "resnet-50", "steps": 1500, "emulate": True, "gpus": 2},
                  *[{"model": "vgg-16", "steps": 800, "emulate": True}] * 3)
    view = daemon.wait_for(
        lambda: (v := daemon.client.get("/v1/jobs/2")) and any(
            "'s plan: predicted" in line for line in v["reasons"]) and v, timeout=60,
        what="a plan adopted")
    (plan,) = [line for line in view["reasons"] if "the planner follows" in line]
    assert "from now, against" in plan
    jobs = daemon.wait_all(timeout=180)
    assert [(j["state"], j["step"]) for j in jobs] == [("done", 0), ("done", 4000),
                                                       ("done", 1500)] + [("done", 800)] * 3
    for job_id, runs in runs_by_job(daemon).items():
        assert [r["end_reason"] for r in runs][-1] == "done"
        for before, after in zip(runs, runs[1:], strict=False):
            assert before["end_step"] == after["start_step"], f"job {job_id}"
    assert [r["gpu_count"] for r in runs_by_job(daemon)[3]] == [2]  # a fixed count stays
    check_no_gpu_shared(daemon.runs())
    metrics = scrape(daemon)
    assert metrics("marbled_planner_plans") >= 1
    assert metrics("marbled_planner_cpu_seconds") > 0
