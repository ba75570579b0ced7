"""A run slower than its profile: the broker sets its expected end by the speed it measures,
so a policy that weighs the time left (malleable's guard here) sees the job as it runs, not
as the profile guessed. A real broker on 4 emulated GPUs; the job is a plain command (the
EMULATED training job run as the user's command, 3x slower than the broker's profile, whose
true curve comes from a second profile the broker never sees)."""

from __future__ import annotations

import sys
import time

import pytest

pytestmark = pytest.mark.daemon

TOLD = [100, 190, 270, 340]  # steps/s on 1-4 GPUs: what the broker's profile claims
TRUE = [v / 3 for v in TOLD]  # how the job really trains


def test_a_job_slower_than_its_profile_is_reshaped_after_its_profiled_end(
        daemon_factory, tmp_path):
    """A (680 steps) starts alone on 4 GPUs: 2 s by the profile, 6 s in truth. B comes when
    A has trained past its profile's end. By the profile A would be done (malleable's guard
    keeps a run that ends within 1 s); by its measured speed it has seconds to go, so A is
    reshaped and B starts at once, long before A ends."""
    told, truth = tmp_path / "told.yaml", tmp_path / "truth.yaml"
    for path, speeds in ((told, TOLD), (truth, TRUE)):
        path.write_text(f"system: {path.stem}\ngpus_per_node: 4\nmodels:\n"
                        f"  net: {{steps_per_second: {speeds}}}\n")
    d = daemon_factory("--profile", str(told), "--policy", "malleable", "--preempt-guard", "1",
                       "--learn-interval", "0.2", gpus=4, time_scale=1.0)

    def job(name: str) -> dict:
        return {"model": "net", "steps": 680, "name": name, "command": [
            sys.executable, "-m", "marbled.worker.emulate", "--profile", str(truth)]}

    (a,) = d.submit(job("slow"))

    def past_its_profiled_end() -> dict | None:
        view = next(j for j in d.jobs() if j["id"] == a["id"])
        started = view["started_at"]
        # measured, 2 s (its profiled run) after its start, with over 2 s still to go
        if view["rate_source"] == "measured" and started and time.time() > started + 2.2 \
                and view["eta_s"] > 2.0:
            return view
        return None

    seen = d.wait_for(past_its_profiled_end, timeout=30, what="A past its profiled end")
    assert len(seen["gpus"]) == 4  # alone: all of them
    (b,) = d.submit(job("next"))
    jobs = {j["id"]: j for j in d.wait_all(timeout=60)}
    assert jobs[a["id"]]["state"] == jobs[b["id"]]["state"] == "done"
    runs = d.runs()
    of_a = [r for r in runs if r["job_id"] == a["id"]]
    of_b = [r for r in runs if r["job_id"] == b["id"]]
    # A was reshaped for B (with its profile's end, it would have run on, alone, to its end)
    assert len(of_a) == 2 and of_a[0]["end_reason"] == "suspended", [dict(r) for r in of_a]
    assert of_a[0]["end_step"] == of_a[1]["start_step"] and of_a[1]["end_step"] == 680
    assert of_b[0]["started_at"] < of_a[-1]["ended_at"] - 1.0
