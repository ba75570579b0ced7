"""A node range through a real broker on two emulated nodes: a per-GPU DDP job that runs
across both nodes while they are half busy, is suspended, and resumes on one node with the
same ranks in all; and a range that survives a broker restart."""

from __future__ import annotations

import json
import sys

import pytest

from marbled.worker.protocol import PROGRESS_FILE, read_json
from tests.integration.test_dashboard import marble
from tests.integration.test_ranks import ENV, PROFILE_ONE_PER_NODE

pytestmark = pytest.mark.daemon

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


@pytest.mark.timeout(240)
def test_a_ddp_job_on_two_half_busy_nodes_is_suspended_and_resumes_on_one(daemon_factory,
                                                                         tmp_path):
    """`--nodes 1-2 --per-gpu` with its best count, 1 GPU, on each of 2 nodes: 2 ranks in
    all. A job holding 1 GPU of each node leaves no node with 2 free, so the first run takes
    1 + 1; with the holder gone, `marble suspend` resumes it on 2 GPUs of one node. Both runs
    have 2 ranks (the same global batch, the same sums), so every step runs once and every
    loss equals an uninterrupted 2-rank run's, bit for bit."""
    pytest.importorskip("torch")
    from tests.frameworks.test_torch_ddp import TRAIN, _launch, _wait
    from tests.frameworks.test_torch_worker import _losses

    steps, args = 300, ["--batch", "16", "--report-interval", "0.02", "--timeout", "60"]
    reference = tmp_path / "reference"
    _wait(_launch(reference, 2, [*args, "--steps", str(steps), "--loss-log",
                                 str(reference / "loss.log")], run_id=1), reference)

    profile = tmp_path / "two-nodes.yaml"
    profile.write_text(PROFILE_ONE_PER_NODE)
    d = daemon_factory("--nodes", "2", "--profile", str(profile), gpus=2, env=ENV)
    (holder,) = d.submit({"command": SLEEPER, "gpus": 1, "nodes": 2, "name": "holder"})
    loss_log = tmp_path / "loss.log"
    (job,) = d.submit({"command": [sys.executable, TRAIN, *args, "--loss-log", str(loss_log)],
                       "model": "one", "steps": steps, "nodes": "1-2", "per_gpu": True,
                       "chdir": str(tmp_path)})
    assert (job["nodes"], job["nodes_min"], job["demand"]) == (2, 1, 1)
    progress = d.state_dir / "jobs" / str(job["id"]) / PROGRESS_FILE

    def trained(run: int, beyond: int) -> bool:
        p = read_json(progress) or {}
        return p.get("run_id") == run and p.get("step", 0) > beyond

    d.wait_for(lambda: trained(2, 20), timeout=90, what="the first run's training")
    free_and_resume(d, holder["id"], job["id"], timeout=150)

    runs = [r for r in d.runs() if r["job_id"] == job["id"]]
    assert [(r["node"], r["gpu_count"], r["end_reason"]) for r in runs] == [
        ("node0,node1", 2, "suspended"), ("node0", 2, "done")], [dict(r) for r in runs]
    at = runs[0]["end_step"]
    assert 20 < at == runs[1]["start_step"] < steps == runs[1]["end_step"]
    shown = marble(d.state_dir, "show", str(job["id"])).stdout
    assert "nodes:        1-2" in shown and "on node0,node1 GPUs" in shown, shown
    got, ref = _losses(loss_log), _losses(reference / "loss.log")
    assert [s for s, _ in got] == list(range(1, steps + 1))  # every step once
    assert got == ref  # the loss goes on from the checkpoint as if never stopped


def free_and_resume(d, holder: int, job: int, timeout: float) -> None:
    """Cancel `holder`, then suspend `job`: its next run is placed on the GPUs freed; it ends
    done."""
    d.client.post(f"/v1/jobs/{holder}/cancel", {})
    d.wait_for(lambda: d.client.get(f"/v1/jobs/{holder}")["state"] == "cancelled",
               what="the holder's end")
    d.client.post(f"/v1/jobs/{job}/suspend", {})
    (done,) = [j for j in d.wait_all(timeout=timeout) if j["id"] == job]
    assert done["state"] == "done", done


def test_a_queued_range_survives_a_restart_and_runs_on_one_node(daemon_factory, tmp_path):
    """An emulated `--nodes 1-2` job (`marble submit`, which refuses a range backwards) waits
    behind a job on both nodes; the broker is stopped and a new one reads the range back: it
    shows 1-2 and, once the nodes are free, runs its 2 GPUs on one node."""
    state = tmp_path / "state"
    first = daemon_factory("--nodes", "2", state_dir=state, gpus=2)
    first.submit({"command": SLEEPER, "gpus": 2, "nodes": 2, "name": "holder"})
    job = {"emulate": True, "model": "resnet-50", "steps": 50, "gpus": 1}
    args = [f"--{k}={v}" for k, v in job.items() if k != "emulate"]
    bad = marble(state, "submit", "--emulate", *args, "--nodes", "2-1")
    assert bad.returncode == 2 and "--nodes: the range 2-1 runs backwards; write the fewest " \
        "nodes first: 1-2" in bad.stderr, bad
    out = marble(state, "submit", "--emulate", *args, "--nodes", "1-2", "--json")
    (job,) = json.loads(out.stdout)["jobs"]
    assert (job["nodes"], job["nodes_min"]) == (2, 1), out
    assert first.stop() == 75  # jobs left for the next broker
    second = daemon_factory("--nodes", "2", state_dir=state, gpus=2)
    again = second.client.get(f"/v1/jobs/{job['id']}")
    assert (again["state"], again["nodes"], again["nodes_min"]) == ("queued", 2, 1)
    assert "needs 2 GPUs on one node or 1 GPU on each of 2 nodes" in again["why"]
    second.client.post("/v1/jobs/1/cancel", {})  # the holder
    second.wait_all(timeout=60)
    (run,) = [r for r in second.runs() if r["job_id"] == job["id"]]
    assert (run["node"], run["gpu_count"], run["end_reason"]) == ("node0", 2, "done")
