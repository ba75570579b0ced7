"""A real broker on two EMULATED nodes (marbled --gpus 4 --nodes 2, every run a local process
speaking the real protocol): a secondary stuck below its optimum on one node is promoted onto
the node that went idle."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.daemon

PROFILE = """system: four-gpu
gpus_per_node: 4
models:
  one: {steps_per_second: [1.0, 0.9, 0.8, 0.7]}
  two: {steps_per_second: [1.0, 1.8, 1.7, 1.6]}
  four: {steps_per_second: [1.0, 1.9, 2.7, 3.4]}
"""


def test_secondary_moves_to_the_node_that_went_idle(daemon_factory, tmp_path):
    profile = tmp_path / "four-gpu.yaml"
    profile.write_text(PROFILE)
    # --no-learn: the move is the subject; a loaded CPU slowed the emulated steps, and the
    # curve learned from them gave the job 3 GPUs on node1 (a CI rehearsal with 5 workers)
    d = daemon_factory("--nodes", "2", "--profile", str(profile), "--no-learn", gpus=4,
                       time_scale=0.01)

    def job(model: str, steps: int) -> dict:
        return {"model": model, "steps": steps, "emulate": True}

    # node0: a 2-GPU job and two 1-GPU ones (one ends at once); node1: a 4-GPU job, 1.5 s
    d.submit(job("two", 1000), job("one", 10), job("one", 300), job("four", 500))
    d.wait_for(lambda: d.jobs()[1]["state"] == "done", what="the shortest job")
    (long_job,) = d.submit(job("four", 2000))
    d.wait_all(timeout=120)
    runs = [r for r in d.runs() if r["job_id"] == long_job["id"]]
    # a secondary on the one GPU node0 had left, until node1 emptied; then all of node1
    assert (runs[0]["node"], runs[0]["gpu_count"], runs[0]["role"]) == ("node0", 1, "secondary")
    assert runs[0]["end_reason"] == "suspended" and runs[0]["end_step"] > 0
    assert (runs[1]["node"], runs[1]["gpu_count"], runs[1]["role"]) == ("node1", 4, "primary")
    assert runs[1]["start_step"] == runs[0]["end_step"] and runs[-1]["end_step"] == 2000
    assert all(j["state"] == "done" for j in d.jobs())
