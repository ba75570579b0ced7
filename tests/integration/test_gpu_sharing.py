"""GPU sharing in the real daemon: two emulated LeNet runs on halves of one EMULATED GPU,
under a profile that says LeNet may share (profiles/example-sharing.yaml; its sharing
figures are assumed, and no real GPU is shared here)."""

from __future__ import annotations

import shlex
import sys

import pytest

pytestmark = pytest.mark.daemon


def test_two_jobs_share_one_emulated_gpu_in_halves_and_each_sees_its_share(daemon_factory,
                                                                           tmp_path):
    daemon = daemon_factory("--policy", "moldable", "--profile", "example-sharing", gpus=1)
    seen, log = tmp_path / "env.txt", tmp_path / "steps.log"
    emulate = shlex.join([sys.executable, "-m", "marbled.worker.emulate", "--profile",
                          "example-sharing", "--time-scale", "0.01", "--step-log", str(log)])
    command = f'echo "$MARBLE_GPU_SHARE $CUDA_VISIBLE_DEVICES" > {seen}; exec {emulate}'
    daemon.submit({"model": "lenet", "steps": 6000, "command": ["sh", "-c", command]},
                  {"model": "lenet", "steps": 6000, "emulate": True})
    jobs = daemon.wait_all(timeout=60)
    assert [(j["state"], j["step"]) for j in jobs] == [("done", 6000)] * 2
    a, b = daemon.runs()
    assert (a["share"], b["share"]) == (2, 2) and a["devices"] == b["devices"] == "0"
    assert min(a["ended_at"], b["ended_at"]) > max(a["started_at"], b["started_at"])
    # Slower than on a whole GPU (6000 / 52 steps/s at time scale 0.01 = 1.15 s): the
    # emulated job trains at its shared speed (6000 / 33.8 -> 1.78 s).
    assert a["ended_at"] - a["started_at"] > 1.5
    assert seen.read_text().split() == ["2", "0"]
    assert [int(s) for s in log.read_text().split()] == list(range(1, 6001))
    (started,) = daemon.query("SELECT data FROM events WHERE kind = 'started' AND job_id = 2")
    assert '"share": 2' in started["data"]
