"""The paper's two walk-throughs, run by the real daemon with emulated jobs on 6 emulated GPUs.

Only the GPUs are emulated (there are none here): the broker, its SQLite file,
the processes, SIGTSTP/SIGUSR1 and the checkpoints are real. The assertions
read the `runs` table, as centre staff would.
"""

from __future__ import annotations

import pytest

from tests.scenarios import jobset, runs_by_job

pytestmark = pytest.mark.daemon


def _gpus(run) -> set[int]:
    return {int(g) for g in run["gpu_ids"].split(",")}


def test_figure5_scenario_on_emulated_gpus(daemon):
    """Figure 5: ResNet-50 primary on 3, Inception-v3 secondary on 3, promoted to 4 when
    ResNet-50 ends, VGG-16 secondary on the remaining 2."""
    daemon.submit(*jobset(3))
    jobs = daemon.wait_all(timeout=60)
    assert [j["state"] for j in jobs] == ["done"] * 3
    runs = runs_by_job(daemon)

    (r50,) = runs[1]
    assert (r50["role"], r50["gpu_count"], r50["end_reason"]) == ("primary", 3, "done")

    inc_first, inc_resumed = runs[2]
    assert (inc_first["role"], inc_first["gpu_count"]) == ("secondary", 3)
    assert _gpus(inc_first).isdisjoint(_gpus(r50))
    assert inc_first["end_reason"] == "suspended"
    assert inc_first["ended_at"] >= r50["ended_at"]  # suspended because ResNet-50 ended
    assert (inc_resumed["role"], inc_resumed["gpu_count"]) == ("primary", 4)
    assert _gpus(inc_first) < _gpus(inc_resumed)  # kept its GPUs and took one more
    assert 0 < inc_first["end_step"] == inc_resumed["start_step"]
    assert inc_resumed["end_step"] == 2000

    vgg_first = runs[3][0]
    assert (vgg_first["role"], vgg_first["gpu_count"]) == ("secondary", 2)
    assert vgg_first["started_at"] >= r50["ended_at"]
    assert _gpus(vgg_first).isdisjoint(_gpus(inc_resumed))
    assert runs[3][-1]["end_step"] == 800


def test_jobset2_walkthrough_on_emulated_gpus(daemon):
    """Section VII-B1: Inception-v3 primary on 4, ResNet-50 secondary on 2, then ResNet-101
    secondary on 2, suspended when Inception-v3 ends and resumed on 3."""
    daemon.submit(*jobset(2))
    jobs = daemon.wait_all(timeout=60)
    assert [j["state"] for j in jobs] == ["done"] * 3
    runs = runs_by_job(daemon)

    (inc,) = runs[1]
    assert (inc["role"], inc["gpu_count"], inc["end_reason"]) == ("primary", 4, "done")
    (r50,) = runs[2]
    assert (r50["role"], r50["gpu_count"], r50["end_reason"]) == ("secondary", 2, "done")
    assert _gpus(r50).isdisjoint(_gpus(inc))

    r101_first, r101_resumed = runs[3]
    assert (r101_first["role"], r101_first["gpu_count"]) == ("secondary", 2)
    assert r101_first["started_at"] >= r50["ended_at"]
    assert r101_first["end_reason"] == "suspended"
    assert r101_first["ended_at"] >= inc["ended_at"]
    assert (r101_resumed["role"], r101_resumed["gpu_count"]) == ("primary", 3)
    assert _gpus(r101_first) < _gpus(r101_resumed)
    assert 0 < r101_first["end_step"] == r101_resumed["start_step"] < 1000
    assert r101_resumed["end_step"] == 1000


def test_rigid_policy_runs_each_job_on_all_gpus_in_order(daemon_factory):
    """The LSF baseline: every job on all 6 GPUs, one after the other, in FIFO order."""
    daemon = daemon_factory("--policy", "rigid")
    daemon.submit(*jobset(1))
    daemon.wait_all(timeout=60)
    runs = daemon.runs()
    assert [r["job_id"] for r in runs] == [1, 2, 3]
    assert all(r["gpu_count"] == 6 and r["role"] == "primary" for r in runs)
    for before, after in zip(runs, runs[1:], strict=False):
        assert after["started_at"] >= before["ended_at"]


def test_timeslice_policy_takes_turns_through_the_daemon(daemon_factory):
    """Two AlexNet jobs (optimal on all 6 GPUs) under --policy timeslice with 0.6 s slices:
    the daemon suspends and resumes them in turn; steps continue across every turn."""
    daemon = daemon_factory("--policy", "timeslice", "--time-slice", "0.6")
    daemon.submit({"model": "alexnet", "steps": 3000, "emulate": True},
                  {"model": "alexnet", "steps": 3000, "emulate": True})
    jobs = daemon.wait_all(timeout=90)
    assert [j["state"] for j in jobs] == ["done", "done"]
    runs = daemon.runs()
    assert [r["job_id"] for r in runs[:4]] == [1, 2, 1, 2]
    for a, b in zip(runs, runs[1:], strict=False):
        assert b["started_at"] >= a["ended_at"]  # never both on the 6 GPUs
    for job in (1, 2):
        chain = [r for r in runs if r["job_id"] == job]
        assert chain[-1]["end_step"] == 3000
        assert all(a["end_step"] == b["start_step"] for a, b in zip(chain, chain[1:],
                                                                      strict=False))
