"""The adaptive policy in the real daemon: the same job sized by the load, alone and behind
a queue, and grown by a real SIGTSTP, checkpoint and resume when the queue has drained
(emulated jobs, real processes and signals)."""

from __future__ import annotations

import pytest

from tests.scenarios import check_no_gpu_shared, runs_by_job

pytestmark = pytest.mark.daemon

LONG = {"model": "inception-v3", "steps": 3000, "emulate": True}  # fastest on 4 of 6 GPUs
SHORT = {"model": "resnet-50", "steps": 400, "emulate": True}


def test_the_same_job_alone_on_its_fastest_count_behind_a_queue_on_one_then_grown(
        daemon_factory):
    # --no-learn: the sizes come from the profile alone, as the simulator predicts them
    # (summit-v100: alone 4 GPUs; behind five short jobs 2 GPUs -- they run three at a time
    # on 2 each, the best static plan's counts -- then 4 once they are done).
    daemon = daemon_factory("--policy", "adaptive", "--no-learn")
    daemon.submit(LONG)
    daemon.wait_all(timeout=60)
    daemon.submit(*[SHORT] * 5, LONG)  # one request: a single decision sees all six
    jobs = daemon.wait_all(timeout=120)
    assert [(j["state"], j["step"]) for j in jobs] == [("done", 3000)] + \
        [("done", 400)] * 5 + [("done", 3000)]
    runs = runs_by_job(daemon)
    assert [r["gpu_count"] for r in runs[1]] == [4]  # alone: its fastest count
    timeline = [(r["job_id"], r["gpu_count"], r["started_at"], r["ended_at"])
                for j in range(2, 8) for r in runs[j]]
    # Behind the queue, on fewer than the 3 it would take alone (sized by the load)
    assert all(r["gpu_count"] <= 2 for j in range(2, 7) for r in runs[j]), timeline
    queued = runs[7]
    # Then 4 once the short jobs are done, each move from its checkpoint, never suspended
    # before it has trained
    assert queued[-1]["gpu_count"] == 4 and queued[0]["end_step"] > 0, timeline
    counts = [r["gpu_count"] for r in queued]
    assert counts == sorted(counts) and len(counts) >= 2, timeline
    assert [r["end_reason"] for r in queued] == ["suspended"] * (len(queued) - 1) + ["done"]
    for before, after in zip(queued, queued[1:], strict=False):
        assert before["end_step"] == after["start_step"] < 3000  # from its checkpoint
    acks = daemon.query("SELECT run_id FROM events WHERE kind = 'acknowledged' AND job_id = 7")
    assert [a["run_id"] for a in acks] == [r["id"] for r in queued[:-1]]
    why = daemon.query("SELECT data FROM events WHERE kind = 'suspend-requested' AND job_id = 7")
    assert len(why) == len(queued) - 1
    assert "adaptive: " in why[-1]["data"] and "to grow into idle GPUs" in why[-1]["data"]
    # As simulated (the three first short jobs end at one instant there), when their ends
    # here fall within the broker's wait for the runs due to end (coalesce_max_s, 0.5 s;
    # some 20-40 ms apart on a quiet machine): one decision at their ends, so each short
    # job runs once on 2, and the long one on 2 beside the last two, then on 4 once, not
    # grown at each of their ends. Process start-ups on a loaded machine can put the ends
    # further apart (0.8 s in a CI rehearsal); then the broker decides at each end, by
    # design, and tests/broker/test_staggered_ends.py checks the waiting on a fake clock.
    first = [runs[j][0] for j in (2, 3, 4)]
    if max(r["ended_at"] for r in first) - min(r["ended_at"] for r in first) <= 0.5:
        assert all([r["gpu_count"] for r in runs[j]] == [2] for j in range(2, 7)), timeline
        assert counts == [2, 4], timeline
    check_no_gpu_shared(daemon.runs())
