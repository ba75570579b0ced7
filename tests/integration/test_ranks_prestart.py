"""Prestart of per-GPU (DDP) jobs on a real broker and on marbled.batch.ranks alone (emulated
GPUs, CPU, gloo): the ranks start ahead and wait in ready(); the go gives them the world,
the rendezvous and their GPUs. A go with the expected count uses them all, one with fewer
cancels the rest, one with more starts the missing ranks cold; a dropped standby leaves no
process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.suspend_resume import gone, process_environ, standby_ranks
from marbled import examples
from marbled.worker.protocol import STANDBY_VAR, atomic_write_json, read_json
from tests.integration.test_ranks import ENV, PROFILE

pytestmark = pytest.mark.daemon

DDP = [sys.executable, str(examples.SCRIPTS / examples.EXAMPLES["ddp"].file), "--batch", "16",
       "--timeout", "60", "--report-interval", "0.05"]

# A rank that waits for its go; with "gloo", then meets the others (a real gloo all-reduce
# of rank + 1).
RANK = '''
import os, sys
from pathlib import Path
from marbled.worker.protocol import JobProtocol
proto = JobProtocol.current()
if sys.argv[1] != "gloo":
    Path(f"waiting-{os.getpid()}").touch()
    proto.ready()
    os._exit(0)
import torch, torch.distributed as dist
from marbled.worker.torch import init_distributed
Path(f"waiting-{os.getpid()}").touch()
ranks = init_distributed(timeout=30)  # waits in ready() for the go first
t = torch.tensor([ranks.rank + 1])
dist.all_reduce(t)
Path(f"sum-{ranks.rank}-of-{ranks.world}").write_text(f"{int(t.item())} {proto.rank}")
os._exit(0)
'''


def _events(d, job_id: int, kind: str) -> list[dict]:
    return [{"run_id": e["run_id"], **json.loads(e["data"] or "{}")} for e in d.query(
        "SELECT run_id, data FROM events WHERE job_id = ? AND kind = ? ORDER BY id", job_id, kind)]


def _steps(loss_log: Path) -> list[int]:
    return [int(line.split()[0]) for line in loss_log.read_text().splitlines()]


def _progress(d, job_id: int) -> dict:
    return read_json(d.state_dir / "jobs" / str(job_id) / "progress.json") or {}


def _trained(d, job_id: int, run_id: int, beyond: int) -> bool:
    p = _progress(d, job_id)
    return p.get("run_id") == run_id and p.get("step", 0) > beyond


@pytest.mark.timeout(150)
def test_a_per_gpu_job_resumes_on_its_prestarted_ranks(daemon_factory, tmp_path):
    """Suspended on its 2 GPUs, the job's 2 ranks start ahead; the resumed run is that
    process (the go event names it, 2 ranks of 2 prestarted), resumes from the acknowledged
    checkpoint, and every step is trained once."""
    pytest.importorskip("torch")
    profile = tmp_path / "two-gpu.yaml"
    profile.write_text(PROFILE)
    d = daemon_factory("--profile", str(profile), gpus=2, env=ENV)
    loss_log, steps = tmp_path / "loss.log", 300
    (job,) = d.submit({"command": [*DDP, "--loss-log", str(loss_log)], "model": "two",
                       "steps": steps, "per_gpu": True, "chdir": str(tmp_path)})
    d.wait_for(lambda: _trained(d, job["id"], 1, 20), timeout=60, what="training")
    d.client.post(f"/v1/jobs/{job['id']}/suspend", {})
    (done,) = d.wait_all(timeout=90)
    assert done["state"] == "done", done

    first, second = d.runs()
    assert (first["start_step"], first["end_reason"]) == (0, "suspended")
    assert (second["start_step"], second["end_step"]) == (first["end_step"], steps)
    assert [e["ranks"] for e in _events(d, job["id"], "prestarted")] == [2]
    (go,) = _events(d, job["id"], "go")
    assert (go["run_id"], go["pid"], go["ranks"], go["prestarted"]) == \
        (second["id"], second["pid"], 2, 2)
    assert _steps(loss_log) == list(range(1, steps + 1))
    log = (d.state_dir / "jobs" / str(job["id"]) / f"run-{second['id']}.stderr.log").read_text()
    assert f"[rank 0] train_ddp: rank 0 of 2 on cpu, steps {first['end_step']}->{steps}" in log


@pytest.mark.timeout(400)
def test_a_go_with_fewer_ranks_cancels_the_rest_and_a_dropped_standby_leaves_none(
        daemon_factory, tmp_path):
    """A secondary on 1 of 2 GPUs (a filler holds the other) gets 2 ranks started ahead (its
    best count); suspended, it resumes on 1 GPU: rank 0 takes the run, rank 1 exits, and the
    job trains on from its checkpoint. Its next standby is dropped when it is cancelled:
    none of its ranks is left."""
    pytest.importorskip("torch")
    profile = tmp_path / "two-gpu.yaml"
    profile.write_text(PROFILE)
    d = daemon_factory("--profile", str(profile), gpus=2, env=ENV)
    d.submit({"gpus": 1, "command": ["sleep", "1000"]})
    loss_log = tmp_path / "loss.log"
    (job,) = d.submit({"command": [*DDP, "--loss-log", str(loss_log)], "model": "two",
                       "steps": 10**6, "per_gpu": True, "chdir": str(tmp_path)})
    job_dir = d.state_dir / "jobs" / str(job["id"])
    d.wait_for(lambda: _trained(d, job["id"], 2, 20), timeout=60, what="the secondary's steps")
    waiting = d.wait_for(lambda: sorted((r := standby_ranks(job_dir)).values()) == [0, 1]
                         and {rank: pid for pid, rank in r.items()},
                         timeout=60, what="two prestarted ranks")
    seen = [process_environ(pid).get("CUDA_VISIBLE_DEVICES") for pid in waiting.values()]
    assert seen == ["", ""]  # no GPU until the go
    d.client.post(f"/v1/jobs/{job['id']}/suspend", {})
    first = d.wait_for(lambda: d.runs()[1]["ended_at"] and d.runs()[1], timeout=30,
                       what="the suspension")
    d.wait_for(lambda: _trained(d, job["id"], 3, first["end_step"] + 20), timeout=120,
               what="the resumed run's steps")
    (go,) = _events(d, job["id"], "go")
    assert (go["run_id"], go["ranks"], go["prestarted"]) == (3, 1, 2)
    # rank 1 was told to exit (it reads the cancel once its imports are done): that it is gone
    # once the run ends is checked below (its prompt exit timed out once in CI, unexplained)
    assert not gone(waiting[0])  # rank 0 of the run
    assert d.runs()[2]["start_step"] == first["end_step"]
    steps = _steps(loss_log)
    assert steps == list(range(1, len(steps) + 1))  # every step once, across the resume

    # the next run's ranks, started ahead again once this one trains
    def next_standby() -> list[int]:  # the running rank 0 was prestarted too
        return [pid for pid in standby_ranks(job_dir) if pid != waiting[0]]

    d.wait_for(lambda: len(next_standby()) == 2, timeout=120, what="the next standby's ranks")
    again = next_standby()
    d.client.post(f"/v1/jobs/{job['id']}/cancel", {})
    d.wait_for(lambda: all(gone(pid) for pid in [*again, *waiting.values()]), timeout=10,
               what="the dropped standby's ranks' and the cancelled rank's end")
    d.client.post("/v1/jobs/1/cancel", {})
    assert {j["state"] for j in d.wait_all(timeout=30)} == {"cancelled"}


def _standby(tmp_path: Path, count: int,
             how: str) -> tuple[subprocess.Popen, Path, dict[int, int]]:
    """marbled.batch.ranks started as a prestart (its own session, like the local launcher)
    with `count` ranks of RANK `how`, once each waits; its go file and pid -> rank."""
    (tmp_path / "rank.py").write_text(RANK)
    go = tmp_path / "go.json"
    env = {**os.environ, **ENV, STANDBY_VAR: str(go), "MARBLE_RUN_DIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "marbled.batch.ranks", str(count),
                             sys.executable, "rank.py", how], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("waiting-*"))) < count:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc, go, standby_ranks(tmp_path)


def test_a_go_with_more_ranks_starts_the_missing_ones_cold(tmp_path):
    """2 ranks prestarted, a go for 3 on two nodes: the third starts at the go, and all three
    meet (the all-reduce sums 1 + 2 + 3) with the go's world and rendezvous."""
    pytest.importorskip("torch")
    proc, go, waiting = _standby(tmp_path, 2, "gloo")
    assert sorted(waiting.values()) == [0, 1]
    atomic_write_json(go, {"MARBLE_RUN_ID": "5", "MARBLE_GPUS": "2",
                           "parts": [["node0", ["0", "1"]], ["node1", ["2"]]]})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    # and each rank's protocol knows its rank (only rank 0 reports and acknowledges)
    assert [(tmp_path / f"sum-{r}-of-3").read_text() for r in range(3)] == ["6 0", "6 1", "6 2"]
    assert len(list(tmp_path.glob("waiting-*"))) == 3  # the third, started now
    assert all(gone(pid) for pid in waiting)


def test_a_cancelled_standby_leaves_no_rank(tmp_path):
    """The broker's cancel in the go file: the ranks process stops its waiting ranks and
    exits 0 (the broker also kills its group; this is for a go file alone)."""
    proc, go, waiting = _standby(tmp_path, 2, "wait")
    atomic_write_json(go, {"cancel": True})
    proc.communicate(timeout=10)
    assert proc.returncode == 0
    deadline = time.monotonic() + 5
    while not all(gone(pid) for pid in waiting):
        assert time.monotonic() < deadline, "a prestarted rank outlived its standby"
        time.sleep(0.02)
