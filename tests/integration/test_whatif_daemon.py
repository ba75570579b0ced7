"""The what-if planner in the real daemon, on two emulated nodes: it plans in a process beside
the broker's loop (spawned, real), follows the plan it adopts, says so in `explain`, and
counts its plans and their CPU in /metrics; a plain command it cannot simulate runs beside
it, and every job trains to its last step once (emulated jobs, real processes and signals)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_metrics import scrape
from tests.scenarios import check_no_gpu_shared, runs_by_job

pytestmark = pytest.mark.daemon

PLAIN = [sys.executable, "-c", "import time; time.sleep(1.0)"]
EMULATE = [sys.executable, "-m", "marbled.worker.emulate", "--time-scale", "0.01"]


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


def test_the_planners_process_goes_with_a_broker_killed_by_sigkill(daemon_factory, tmp_path):
    """A broker killed with SIGKILL cannot shut its planning process down: the process sees
    its broker gone and exits (it waited for work forever, holding both ends of its queue);
    the next broker finishes the jobs, each trained once to its last step."""
    log = tmp_path / "steps.log"
    args = ("--policy", "whatif", "--plan-every", "0", "--nodes", "2")
    daemon = daemon_factory(*args, gpus=4)
    daemon.submit({"command": [*EMULATE, "--step-log", str(log)], "model": "inception-v3",
                   "steps": 3000},
                  *[{"model": "vgg-16", "steps": 800, "emulate": True}] * 2)
    metrics = daemon.wait_for(lambda: (m := scrape(daemon))("marbled_planner_plans") >= 1 and m,
                              timeout=60, what="a plan")
    assert metrics("marbled_planner_cpu_seconds") > 0
    workers = [p for p in _children(daemon.proc.pid) if b"spawn_main" in _cmdline(p)]
    assert len(workers) == 1, workers
    daemon.proc.kill()
    daemon.proc.wait()
    deadline = time.monotonic() + 10
    while _cmdline(workers[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _cmdline(workers[0]), "the planner's process outlived its broker"
    again = daemon_factory(*args, gpus=4)
    jobs = again.wait_all(timeout=120)
    assert [(j["state"], j["step"]) for j in jobs] == [("done", 3000)] + [("done", 800)] * 2
    assert [int(s) for s in log.read_text().split()] == list(range(1, 3001))


def _children(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    return [int(c) for t in tasks.iterdir()
            for c in (t / "children").read_text().split()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_phased_plan_drives_a_real_broker_and_every_job_ends_once(daemon_factory):
    """Four jobs submitted together on one node of 4 emulated GPUs, for which the planner's
    phased plan (a searched schedule of counts) is predicted 6 % better than any policy's
    (mean JCT 719 s and last end 943 s against 767 and 995 s for adaptive's): the planner,
    in its own process, adopts it; the broker reshapes the runs adaptive started meanwhile
    to the plan's counts, and each job trains to its last step once."""
    daemon = daemon_factory("--policy", "whatif", "--plan-every", "0", gpus=4)
    steps = {"alexnet": 9231, "vgg-16": 1105, "resnet-50": 2297}
    daemon.submit({"model": "alexnet", "steps": 9231, "emulate": True},
                  {"model": "vgg-16", "steps": 1105, "emulate": True},
                  {"model": "resnet-50", "steps": 2297, "emulate": True},
                  {"model": "vgg-16", "steps": 1135, "emulate": True})
    view = daemon.wait_for(
        lambda: (v := daemon.client.get("/v1/jobs/1")) and any(
            "the planner follows phased's plan" in line for line in v["reasons"]) and v,
        timeout=60, what="the phased plan adopted")
    (plan,) = [line for line in view["reasons"] if line.startswith("the planner follows")]
    assert "from now, against" in plan
    jobs = daemon.wait_all(timeout=180)
    assert [(j["state"], j["step"]) for j in jobs] == [
        ("done", steps["alexnet"]), ("done", steps["vgg-16"]), ("done", steps["resnet-50"]),
        ("done", 1135)]
    for job_id, runs in runs_by_job(daemon).items():
        assert runs[0]["start_step"] == 0 and runs[-1]["end_reason"] == "done"
        for before, after in zip(runs, runs[1:], strict=False):
            assert before["end_step"] == after["start_step"], f"job {job_id}"
    check_no_gpu_shared(daemon.runs())
