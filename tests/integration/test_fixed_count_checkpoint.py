"""Lifecycle I1 for jobs with a fixed GPU count (issue 30, item 1): a fixed count means the
policy never reshapes the job, not that it cannot checkpoint. A real broker, real emulated
jobs speaking the worker protocol, real signals: the shutdown, the allocation's end and a
user's suspension checkpoint them, and the next run goes on from that step, every step once.
A plain command with a fixed count, which can never checkpoint, is still stopped and said so.
"""

from __future__ import annotations

import signal
import sys

import pytest

from marbled.cli.client import ApiError

pytestmark = pytest.mark.daemon

EMULATE = [sys.executable, "-m", "marbled.worker.emulate", "--time-scale", "0.01"]


def _steps(path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


def _chain(daemon, job_id: int) -> list:
    return daemon.query("SELECT * FROM runs WHERE job_id = ? ORDER BY id", job_id)


def _fixed(model: str, steps: int, gpus: int, log, **extra) -> dict:
    return {"model": model, "steps": steps, "gpus": gpus,
            "command": [*EMULATE, "--step-log", str(log)], **extra}


def _contiguous(chain, steps: int) -> None:
    assert chain[0]["start_step"] == 0 and chain[-1]["end_step"] == steps
    for a, b in zip(chain, chain[1:], strict=False):
        assert a["end_step"] == b["start_step"]


def test_shutdown_checkpoints_fixed_count_jobs_and_the_next_broker_goes_on(daemon_factory,
                                                                           tmp_path):
    """Two fixed-count jobs (2 and 3 GPUs) at the allocation's end (SIGTERM): both are asked
    to checkpoint (an acknowledgement each, none stopped by force), and the next broker
    resumes each from its step: every step runs once."""
    state = tmp_path / "state"
    first = daemon_factory(state_dir=state)
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    first.submit(_fixed("resnet-50", 3000, 2, logs[0]), _fixed("vgg-16", 2500, 3, logs[1]))
    first.wait_for(lambda: all(j["step"] > 30 for j in first.jobs()), what="progress")
    assert first.stop(signal.SIGTERM) == 75
    rows = first.query("SELECT id, state, step FROM jobs ORDER BY id")
    assert [r["state"] for r in rows] == ["suspended", "suspended"]
    assert all(r["step"] > 30 for r in rows)
    acks = first.query("SELECT job_id FROM events WHERE kind = 'acknowledged' ORDER BY job_id")
    assert [a["job_id"] for a in acks] == [1, 2]
    assert not first.query("SELECT id FROM events WHERE kind = 'stop'")

    second = daemon_factory(state_dir=state)
    assert [j["state"] for j in second.wait_all(timeout=90)] == ["done", "done"]
    for job_id, steps, gpus, log in ((1, 3000, 2, logs[0]), (2, 2500, 3, logs[1])):
        chain = _chain(second, job_id)
        assert len(chain) == 2 and {r["gpu_count"] for r in chain} == {gpus}
        _contiguous(chain, steps)
        assert _steps(log) == list(range(1, steps + 1))  # none lost, none repeated


def test_user_suspends_a_fixed_count_job(daemon, tmp_path):
    """`marble suspend` of a fixed-count job that reported: it checkpoints and resumes on
    the same count at once; a fixed-count plain command (no report) is refused, saying why."""
    log = tmp_path / "steps.log"
    (job,) = daemon.submit(_fixed("resnet-50", 3000, 2, log))
    daemon.wait_for(lambda: daemon.jobs()[0]["step"] > 50, what="progress")
    daemon.client.post(f"/v1/jobs/{job['id']}/suspend")
    (plain,) = daemon.submit({"gpus": 1, "command": ["sleep", "30"]})
    daemon.wait_for(lambda: daemon.jobs()[1]["state"] == "running", what="the plain command")
    with pytest.raises(ApiError) as err:
        daemon.client.post(f"/v1/jobs/{plain['id']}/suspend")
    assert err.value.status == 409 and "has not reported progress" in str(err.value)
    daemon.client.post(f"/v1/jobs/{plain['id']}/cancel")
    daemon.wait_all(timeout=60)
    first, resumed = _chain(daemon, job["id"])
    assert first["end_reason"] == "suspended" and first["gpu_count"] == resumed["gpu_count"] == 2
    _contiguous([first, resumed], 3000)
    assert _steps(log) == list(range(1, 3001))


def test_multi_node_fixed_job_checkpoints_at_shutdown(daemon_factory, tmp_path):
    """A job on 2 GPUs of each of 2 (emulated) nodes is checkpointed at the drain, and the
    next broker finishes it from there."""
    state = tmp_path / "state"
    log = tmp_path / "steps.log"
    first = daemon_factory("--nodes", "2", state_dir=state, gpus=4)
    first.submit(_fixed("resnet-50", 3000, 2, log, nodes=2))
    first.wait_for(lambda: first.jobs()[0]["step"] > 30, what="progress")
    assert first.stop(signal.SIGTERM) == 75
    assert first.query("SELECT state FROM jobs")[0]["state"] == "suspended"
    assert first.query("SELECT id FROM events WHERE kind = 'acknowledged'")

    second = daemon_factory("--nodes", "2", state_dir=state, gpus=4)
    assert [j["state"] for j in second.wait_all(timeout=90)] == ["done"]
    _contiguous(_chain(second, 1), 3000)
    assert _steps(log) == list(range(1, 3001))


def test_fixed_count_plain_command_is_stopped_at_shutdown_and_says_so(daemon_factory,
                                                                       tmp_path):
    """A plain command cannot checkpoint: the drain stops it at once (no wait for an answer
    that cannot come) and its record says it starts again from its start."""
    state = tmp_path / "state"
    first = daemon_factory(state_dir=state)
    first.submit({"gpus": 2, "command": ["sleep", "60"]})
    first.wait_for(lambda: first.jobs()[0]["state"] == "running", what="the plain command")
    first.wait_for(lambda: first.query("SELECT pid FROM runs WHERE pid IS NOT NULL"),
                   what="its process")
    assert first.stop(signal.SIGTERM, timeout=20) == 75
    (run,) = first.runs()
    assert run["end_reason"] == "suspended" and run["end_step"] == 0
    (ended,) = first.query("SELECT data FROM events WHERE kind = 'suspended'")
    assert "resumes from step 0" in ended["data"]


@pytest.mark.parametrize("launch", ["torchrun", "per_gpu"])
def test_fixed_count_ranks_are_checkpointed_at_shutdown(daemon_factory, tmp_path, launch):
    """A fixed-count job of two ranks (torchrun, or one process per GPU) at the allocation's
    end: the ranks agree, rank 0 acknowledges, and the next broker resumes from that step
    (before: SIGTERM without a checkpoint, and the next run started at step 0)."""
    pytest.importorskip("torch")
    from tests.integration.test_ranks import ENV, ranks_job

    job = ranks_job(tmp_path, launch)
    state = tmp_path / "state"
    first = daemon_factory(state_dir=state, gpus=2, env=ENV)
    first.submit({**job, "gpus": 2, "steps": 400, "chdir": str(tmp_path)})
    first.wait_for(lambda: (tmp_path / "trained-1-0").exists(), timeout=60, what="training")
    assert first.stop(signal.SIGTERM) == 75
    (run,) = first.runs()
    assert run["end_reason"] == "suspended" and 0 < run["end_step"] < 400, dict(run)
    assert first.query("SELECT id FROM events WHERE kind = 'acknowledged'")

    second = daemon_factory(state_dir=state, gpus=2, env=ENV)
    (done,) = second.wait_all(timeout=90)
    assert done["state"] == "done", done
    chain = _chain(second, 1)
    assert chain[1]["start_step"] == run["end_step"] and chain[-1]["end_step"] == 400
