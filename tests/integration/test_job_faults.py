"""Job faults through the real daemon: crashes, out-of-memory, an unreadable checkpoint.

The GPUs are emulated; the out-of-memory message is the one PyTorch prints (a
CPU cannot run out of GPU memory), written by a real failing process.
"""

from __future__ import annotations

import json
import sys

import pytest

from marbled.worker.emulate import CHECKPOINT

pytestmark = pytest.mark.daemon

EMULATE = [sys.executable, "-m", "marbled.worker.emulate", "--time-scale", "0.01"]


def _event(daemon, kind: str, job_id: int) -> dict:
    (row,) = daemon.query("SELECT data FROM events WHERE kind = ? AND job_id = ?", kind, job_id)
    return json.loads(row["data"])


def test_crash_is_recorded_with_its_signal_and_the_tail_of_its_stderr(daemon):
    crash = "import os, sys; print('loading shard 7', file=sys.stderr, flush=True); " \
            "os.kill(os.getpid(), 11)"
    (job,) = daemon.submit({"gpus": 1, "command": [sys.executable, "-c", crash]})
    (done,) = daemon.wait_all()
    assert done["state"] == "failed" and done["reason"] == "exited with signal SIGSEGV"
    failed = _event(daemon, "failed", job["id"])
    assert failed["exit_code"] == -11
    assert failed["stderr_tail"].endswith("loading shard 7")


def test_gpu_out_of_memory_is_recorded_as_the_reason(daemon):
    oom = ("import sys; sys.stderr.write('Traceback (most recent call last):\\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\\n'); "
           "sys.exit(1)")
    (job,) = daemon.submit({"gpus": 2, "command": [sys.executable, "-c", oom]})
    (done,) = daemon.wait_all()
    assert done["reason"] == "exited with code 1: out of GPU memory"
    assert _event(daemon, "failed", job["id"])["cause"] == "out of GPU memory"


def test_an_unreadable_checkpoint_is_recorded_and_the_job_still_ends_at_its_steps(
        daemon_factory, tmp_path):
    """The job checkpoints at a shutdown; its checkpoint is then corrupted: the next broker
    resumes it, the job starts again from step 0, and the broker records that it did."""
    state, log = tmp_path / "state", tmp_path / "steps.log"
    first = daemon_factory(state_dir=state)
    (job,) = first.submit({"model": "inception-v3", "steps": 1500,
                           "command": [*EMULATE, "--step-log", str(log)]})
    first.wait_for(lambda: first.jobs()[0]["step"] > 50, what="progress")
    assert first.stop() == 75
    (saved,) = first.query("SELECT step FROM jobs")
    ckpt = state / "jobs" / str(job["id"]) / "checkpoint" / CHECKPOINT
    ckpt.write_bytes(b"\x00 not json")

    second = daemon_factory(state_dir=state)
    (done,) = second.wait_all(timeout=60)
    assert done["state"] == "done" and done["step"] == 1500
    _, resumed = second.query("SELECT * FROM runs WHERE job_id = ? ORDER BY id", job["id"])
    assert resumed["start_step"] == 0 and resumed["end_step"] == 1500
    fallback = _event(second, "checkpoint-fallback", job["id"])
    assert (fallback["expected"], fallback["restored"]) == (saved["step"], 0)
    assert saved["step"] > 50


FLAKY = """
import os, sys
from pathlib import Path
tries = Path(sys.argv[1])
n = int(tries.read_text()) + 1 if tries.exists() else 1
tries.write_text(str(n))
sys.exit(0 if n > int(sys.argv[2]) else 3)
"""


def test_a_failing_job_is_retried_with_a_doubling_back_off_until_it_succeeds(daemon_factory,
                                                                            tmp_path):
    d = daemon_factory("--retry-delay", "0.3")
    tries = tmp_path / "tries"
    (job,) = d.submit({"gpus": 1, "retries": 2,
                       "command": [sys.executable, "-c", FLAKY, str(tries), "2"]})
    (done,) = d.wait_all(timeout=30)
    assert (done["state"], done["failures"], tries.read_text()) == ("done", 2, "3")
    runs = d.query("SELECT * FROM runs WHERE job_id = ? ORDER BY id", job["id"])
    assert [r["end_reason"] for r in runs] == ["failed", "failed", "done"]
    assert [r["exit_code"] for r in runs] == [3, 3, 0]
    waits = [b["started_at"] - a["ended_at"] for a, b in zip(runs, runs[1:], strict=False)]
    assert waits[0] >= 0.3 and waits[1] >= 0.6  # 0.3 s, then doubled
    retry_in = [json.loads(r["data"]).get("retry_in") for r in d.query(
        "SELECT data FROM events WHERE kind = 'failed' ORDER BY id")]
    assert retry_in == [0.3, 0.6]


def test_a_job_out_of_retries_fails_and_a_job_waiting_out_its_back_off_does_not_block(
        daemon_factory, tmp_path):
    d = daemon_factory("--retry-delay", "5")
    (flaky, other) = d.submit(
        {"gpus": 6, "retries": 1, "command": [sys.executable, "-c", FLAKY,
                                              str(tmp_path / "t"), "99"]},
        {"gpus": 6, "command": ["true"]})
    # while the first waits out its 5 s back-off, the second (behind it in the FIFO) runs
    d.wait_for(lambda: d.jobs()[1]["state"] == "done", timeout=4, what="the second job")
    assert d.jobs()[0]["state"] == "suspended" and d.jobs()[0]["failures"] == 1
    (failed, _) = d.wait_all(timeout=30)
    assert (failed["state"], failed["failures"]) == ("failed", 2)
    assert failed["reason"] == "exited with code 3"
