"""A PyTorch DDP job (train_ddp.py, --per-gpu) on the real two-node cluster: one job step with
a task per GPU on both nodes, suspended by the user and resumed from the agreed step (gloo
on the CPU: the cluster's GPUs are fake)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from marbled import examples
from tests.frameworks.test_torch_ddp import TOLERANCE
from tests.frameworks.test_torch_worker import _losses
from tests.integration.test_ranks import PROFILE
from tests.slurm.test_slurm import _broker

pytestmark = pytest.mark.slurm

STEPS = 400


@pytest.fixture
def slurm_api() -> str:
    """One way of reading Slurm: what is tested here is the launcher's step, not the reader
    (both readers run the per-GPU step of test_slurm.py)."""
    return "cli"


def test_a_ddp_step_of_four_tasks_stops_at_one_agreed_step_and_resumes(
        daemon_factory, allocate, tmp_path):
    """2 nodes x 2 GPUs: a step of 4 tasks trains; `marble suspend` reaches every task
    through Slurm, all 4 stop after one agreed step, rank 0 alone saves and acknowledges;
    the next step resumes there, and every rank runs every step once, on the loss curve
    of an uninterrupted run. (The same task count: a job on several nodes keeps its GPU
    count a node, so a smaller allocation would not resume it on fewer tasks.)"""
    pytest.importorskip("torch")
    script = examples.SCRIPTS / examples.EXAMPLES["ddp"].file
    profile = tmp_path / "two-gpu.yaml"
    profile.write_text(PROFILE)  # 'two': 2 GPUs a node train fastest; auto: suspendable
    job = allocate("--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=4", "--gres=gpu:2")
    d = _broker(daemon_factory, job, "--profile", str(profile))
    logs = tmp_path / "loss-{rank}.log"  # every rank logs its steps
    (submitted,) = d.submit({
        "command": [sys.executable, str(script), "--batch", "16", "--timeout", "60",
                    "--report-interval", "0.05", "--loss-log", str(logs)],
        "model": "two", "steps": STEPS, "nodes": 2, "per_gpu": True, "chdir": str(tmp_path)})
    d.wait_for(lambda: d.jobs()[0]["step"] > 30, timeout=60, what="training")
    d.client.post(f"/v1/jobs/{submitted['id']}/suspend", {})
    (done,) = d.wait_all(timeout=120)
    assert done["state"] == "done", done
    first, resumed = d.runs()
    at = first["end_step"]
    assert (first["end_reason"], resumed["start_step"], resumed["end_step"]) == \
        ("suspended", at, STEPS), [dict(first), dict(resumed)]
    for run in (first, resumed):
        assert (run["node"], run["gpu_count"]) == ("n1,n2", 4)
        assert [len(g.split(",")) for g in run["devices"].split(";")] == [2, 2]
    acks = [json.loads(e["data"]) for e in d.query(
        "SELECT data FROM events WHERE kind = 'acknowledged'")]
    assert [a["step"] for a in acks] == [at]  # one acknowledgement, of the agreed step
    # one checkpoint a stop: the agreed step's, then the last step's
    checkpoints = sorted(p.name for p in (d.state_dir / "jobs").rglob("ckpt-*.pt"))
    assert checkpoints == [f"ckpt-{at:09d}.pt", f"ckpt-{STEPS:09d}.pt"]
    check_losses(tmp_path, script, ranks=4, steps=STEPS)


def check_losses(workdir, script, ranks: int, steps: int) -> None:
    """Every rank logged (loss-{rank}.log in `workdir`) each step once, the same losses, on
    the curve of one uninterrupted process over the same global batch (--batch 16)."""
    # a rank that had stopped after another step than the agreed one would have run some
    # step twice, or none of them
    per_rank = [_losses(workdir / f"loss-{r}.log") for r in range(ranks)]
    assert all([s for s, _ in r] == list(range(1, steps + 1)) for r in per_rank)
    assert all(r == per_rank[0] for r in per_rank)  # the mean over the global batch
    reference = workdir / "reference.log"
    subprocess.run([sys.executable, str(script), "--steps", str(steps), "--batch", "16",
                    "--loss-log", str(reference)], cwd=workdir, check=True, timeout=120,
                   env={**{k: v for k, v in os.environ.items() if not k.startswith("MARBLE_")},
                        "OMP_NUM_THREADS": "1"})
    ref = _losses(reference)
    assert max(abs(float(a) - float(b)) for (_, a), (_, b) in zip(per_rank[0], ref,
                                                                    strict=True)) < TOLERANCE
