"""A node range (`nodes: "1-2"`) on the real two-node cluster: a per-GPU DDP job whose first
step spans both nodes and whose resumed step runs its 2 tasks on one node."""

from __future__ import annotations

import json
import sys

import pytest

from marbled import examples
from tests.integration.test_node_ranges import SLEEPER, free_and_resume
from tests.integration.test_ranks import PROFILE_ONE_PER_NODE
from tests.slurm.test_slurm import _broker
from tests.slurm.test_slurm_ddp import check_losses, slurm_api  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slurm

STEPS = 300


@pytest.mark.timeout(180)
def test_a_range_job_steps_on_two_nodes_then_resumes_as_one_step_on_one(
        daemon_factory, allocate, tmp_path):
    """2 nodes x 2 GPUs; `--nodes 1-2 --gpus 1 --per-gpu`: 2 ranks in all. A holder with 1
    GPU of each node leaves no node with 2 free, so the first step is 1 task on each node;
    with the holder gone, the suspended job resumes as a step of 2 tasks on one node. Every
    rank runs every step once, on the loss curve of an uninterrupted run."""
    pytest.importorskip("torch")
    script = examples.SCRIPTS / examples.EXAMPLES["ddp"].file
    profile = tmp_path / "two-nodes.yaml"
    profile.write_text(PROFILE_ONE_PER_NODE)  # 'one': 1 GPU trains fastest
    job = allocate("--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=4", "--gres=gpu:2")
    d = _broker(daemon_factory, job, "--profile", str(profile))
    (holder,) = d.submit({"command": SLEEPER, "gpus": 1, "nodes": 2, "name": "holder"})
    (submitted,) = d.submit({
        "command": [sys.executable, str(script), "--batch", "16", "--timeout", "60",
                    "--report-interval", "0.05", "--loss-log", str(tmp_path / "loss-{rank}.log")],
        "model": "one", "steps": STEPS, "nodes": "1-2", "per_gpu": True,
        "chdir": str(tmp_path)})
    assert (submitted["nodes"], submitted["nodes_min"], submitted["demand"]) == (2, 1, 1)
    d.wait_for(lambda: d.client.get(f"/v1/jobs/{submitted['id']}")["step"] > 20, timeout=60,
               what="training on both nodes")
    free_and_resume(d, holder["id"], submitted["id"], timeout=120)

    first, resumed = (r for r in d.runs() if r["job_id"] == submitted["id"])
    at = first["end_step"]
    assert (first["end_reason"], resumed["start_step"], resumed["end_step"]) == \
        ("suspended", at, STEPS), [dict(first), dict(resumed)]
    assert (first["node"], first["gpu_count"]) == ("n1,n2", 2)
    assert resumed["node"] in ("n1", "n2") and resumed["gpu_count"] == 2, dict(resumed)
    # where each step's tasks really ran (SLURMD_NODENAME and the GPUs Slurm gave each task):
    # 1 task with 1 GPU on each node, then 2 tasks sharing 2 GPUs of one node, two steps
    placed = {r["run_id"]: json.loads(r["data"]) for r in d.query(
        "SELECT run_id, data FROM events WHERE kind = 'placed'")}
    one, two = placed[first["id"]], placed[resumed["id"]]
    assert one["node"] == "n1,n2" and [len(g.split(",")) for g in one["devices"].split(";")] \
        == [1, 1], one
    assert two["node"] == resumed["node"] and len(two["devices"].split(",")) == 2, two
    assert one["step"] != two["step"] and one["slurm_job"] == two["slurm_job"] == job
    check_losses(tmp_path, script, ranks=2, steps=STEPS)
