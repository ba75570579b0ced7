"""Speed, ETA and the queue's forecast of a real broker running emulated jobs (which train
at exactly their profile's speed times --time-scale, so the truth is known)."""

from __future__ import annotations

import time

import pytest

from tests.scenarios import jobset

pytestmark = pytest.mark.daemon

SCALE = 0.01  # the daemon fixture's --time-scale: 100 steps/s of profile -> 10,000 real


def test_a_running_jobs_speed_and_eta_are_within_10_percent_of_the_truth(daemon_factory):
    daemon = daemon_factory("--no-learn")
    # inception-v3 alone: 4 GPUs, 5.325 steps/s in the profile (summit-v100)
    daemon.submit({"model": "inception-v3", "steps": 4000, "emulate": True})
    true_rate = 5.325 / SCALE
    seen = daemon.wait_for(lambda: next((j for j in daemon.jobs()
                                         if j["rate_source"] == "measured"), None),
                           timeout=30, what="a measured speed")
    asked = time.time()
    assert seen["rate"] == pytest.approx(true_rate, rel=0.10)
    daemon.wait_all(timeout=60)
    (run,) = daemon.runs()
    left_truth = run["ended_at"] - asked
    assert left_truth > 1.0  # asked well before the end: the ETA says something
    assert seen["eta_s"] == pytest.approx(left_truth, rel=0.10)
    assert seen["finish_at"] == pytest.approx(run["ended_at"], abs=0.10 * left_truth)


def test_a_job_that_reports_no_progress_is_timed_by_its_profile(daemon_factory):
    daemon = daemon_factory("--no-learn", "--suspend-timeout", "0.5")
    # not emulated: the broker's clock is the profile's; `sleep` never reports a step
    daemon.submit({"model": "resnet-50", "steps": 40000, "command": ["sleep", "60"]})
    job = daemon.wait_for(lambda: next((j for j in daemon.jobs() if j["rate"]), None),
                          timeout=30, what="a speed")
    assert job["rate_source"] == "profile"
    assert job["rate"] == pytest.approx(6.526)  # resnet-50 on its 3 GPUs
    assert job["eta_s"] == pytest.approx(40000 / 6.526, rel=0.01)


def test_the_forecast_of_job_set_3_is_within_20_percent_of_the_real_end(daemon_factory):
    # The simulator does not know what starting a process costs here (0.1-0.3 s a run
    # on a loaded 2-core machine, against a 4.5 s job set): it runs 5-7% short.
    daemon = daemon_factory("--no-learn")
    t0 = time.time()
    daemon.submit(*jobset(3))
    forecast = daemon.client.get("/v1/forecast")
    assert forecast["reason"] is None
    assert {f["id"] for f in forecast["jobs"]} == {1, 2, 3}
    starts = {f["id"]: f["start_at"] for f in forecast["jobs"]}
    assert starts[3] > starts[1]  # VGG-16 waits for GPUs (Figure 5)
    daemon.wait_all(timeout=60)
    end = max(r["ended_at"] for r in daemon.runs())
    assert forecast["finish_at"] - t0 == pytest.approx(end - t0, rel=0.20)
    assert daemon.client.get("/v1/forecast")["jobs"] == []  # nothing left


def test_no_forecast_for_a_job_the_simulator_cannot_play(daemon_factory):
    daemon = daemon_factory("--no-learn")
    daemon.submit({"gpus": 6, "command": ["sleep", "30"]})  # no model, no steps
    forecast = daemon.client.get("/v1/forecast")
    assert forecast["finish_at"] is None and forecast["jobs"] == []
    assert "job 1 has no model and step count" in forecast["reason"]
