"""Suspend and resume through the real daemon: emulated jobs, real processes and signals."""

from __future__ import annotations

import os
import signal
import sys

import pytest

pytestmark = pytest.mark.daemon

EMULATE = [sys.executable, "-m", "marbled.worker.emulate", "--time-scale", "0.01"]
FIRST = {"model": "resnet-50", "steps": 600, "emulate": True}  # primary on 3, ends first


def _steps(path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


def _chain(daemon, job_id: int) -> list:
    return daemon.query("SELECT * FROM runs WHERE job_id = ? ORDER BY id", job_id)


def test_resumed_job_continues_at_its_checkpoint_step(daemon, tmp_path):
    """Inception-v3 runs as a secondary, is suspended and resumed on 4 GPUs: every step
    1..N runs exactly once and the job ends at exactly its requested steps."""
    log = tmp_path / "steps.log"
    daemon.submit(FIRST, {"model": "inception-v3", "steps": 1500,
                          "command": [*EMULATE, "--step-log", str(log)]})
    jobs = daemon.wait_all(timeout=60)
    assert [j["state"] for j in jobs] == ["done", "done"]
    first, resumed = _chain(daemon, 2)
    assert first["end_reason"] == "suspended" and first["gpu_count"] == 3
    assert resumed["gpu_count"] == 4 and resumed["end_reason"] == "done"
    assert 0 < first["end_step"] == resumed["start_step"] < 1500
    assert _steps(log) == list(range(1, 1501))  # none lost, none repeated
    ack = daemon.query("SELECT data FROM events WHERE kind = 'acknowledged' AND job_id = 2")
    assert len(ack) == 1
    # The resumed run's process was started while the old one checkpointed, then given
    # its GPUs: the run ran in the prestarted process.
    (go,) = daemon.query("SELECT run_id, data FROM events WHERE kind = 'go' AND job_id = 2")
    assert go["run_id"] == resumed["id"] and f'"pid": {resumed["pid"]}' in go["data"]


def test_job_ignoring_sigtstp_is_stopped_and_resumed_from_last_checkpoint(daemon_factory,
                                                                        tmp_path):
    """Escalation: no acknowledgement within the suspend timeout -> SIGTERM; the job is
    resumed from its last periodic checkpoint and still ends at exactly its steps."""
    daemon = daemon_factory("--suspend-timeout", "0.5", "--kill-timeout", "1")
    log = tmp_path / "steps.log"
    cmd = [*EMULATE, "--ignore-suspend", "--checkpoint-every", "50", "--step-log", str(log)]
    daemon.submit(FIRST, {"model": "inception-v3", "steps": 1500, "command": cmd})
    jobs = daemon.wait_all(timeout=60)
    assert [j["state"] for j in jobs] == ["done", "done"]
    first, resumed = _chain(daemon, 2)[:2]
    assert first["end_reason"] == "suspended"
    assert first["exit_code"] == -signal.SIGTERM
    assert resumed["start_step"] % 50 == 0 and resumed["start_step"] > 0
    # Not acknowledged: the run's end is the checkpoint the next run restored, once that run
    # reports it (what it trained past it was lost and is redone)
    assert first["end_step"] == resumed["start_step"]
    steps = _steps(log)
    reached = steps[: steps.index(resumed["start_step"] + 1, resumed["start_step"])][-1]
    assert resumed["start_step"] <= reached  # work after the last checkpoint is redone
    assert sorted(set(steps)) == list(range(1, 1501))
    assert steps[-1] == 1500 and _chain(daemon, 2)[-1]["end_step"] == 1500
    kinds = [r["kind"] for r in daemon.query(
        "SELECT kind FROM events WHERE job_id = 2 ORDER BY id")]
    assert "suspend-timeout" in kinds and "stop" in kinds and "acknowledged" not in kinds


def test_job_wrapped_in_sh_c_is_suspended_through_its_process_group(daemon, tmp_path):
    """SIGTSTP goes to the process group: the shell wrapper does not swallow it."""
    log = tmp_path / "steps.log"
    inner = " ".join([*EMULATE, "--step-log", str(log)])
    daemon.submit(FIRST, {"model": "inception-v3", "steps": 1500,
                          "command": ["sh", "-c", f"{inner}; echo wrapper-done"]})
    jobs = daemon.wait_all(timeout=60)
    assert [j["state"] for j in jobs] == ["done", "done"]
    first, resumed = _chain(daemon, 2)
    assert first["end_reason"] == "suspended" and first["exit_code"] == 0
    assert first["end_step"] == resumed["start_step"]
    assert _steps(log) == list(range(1, 1501))


def test_sigterm_to_broker_suspends_all_and_next_broker_finishes(daemon_factory, tmp_path):
    """The allocation's end: SIGTERM -> every job checkpointed; a new broker on the same
    state directory resumes them and every job ends at exactly its steps."""
    state = tmp_path / "state"
    first = daemon_factory(state_dir=state)
    first.submit({"model": "resnet-50", "steps": 1500, "emulate": True},
                 {"model": "inception-v3", "steps": 1500, "emulate": True},
                 {"model": "vgg-16", "steps": 400, "emulate": True})
    first.wait_for(lambda: all(j["step"] > 20 for j in first.jobs()[:2]), what="progress")
    assert first.stop(signal.SIGTERM) == 75  # EX_TEMPFAIL: jobs left for the next broker
    rows = first.query("SELECT id, state, step FROM jobs ORDER BY id")
    assert [r["state"] for r in rows[:2]] == ["suspended", "suspended"]
    assert all(r["step"] > 0 for r in rows[:2])
    assert not first.query("SELECT id FROM runs WHERE ended_at IS NULL")

    second = daemon_factory(state_dir=state)
    jobs = second.wait_all(timeout=60)
    assert [j["state"] for j in jobs] == ["done"] * 3
    for job_id, steps in ((1, 1500), (2, 1500), (3, 400)):
        chain = _chain(second, job_id)
        assert chain[0]["start_step"] == 0 and chain[-1]["end_step"] == steps
        for a, b in zip(chain, chain[1:], strict=False):
            assert a["end_step"] == b["start_step"]


def test_broker_killed_hard_readopts_running_jobs(daemon_factory, tmp_path):
    """kill -9 of the broker: the jobs keep running; the next broker adopts them (pid and
    process start time) instead of starting them twice."""
    state = tmp_path / "state"
    first = daemon_factory(state_dir=state)
    first.submit({"model": "resnet-50", "steps": 1500, "emulate": True},
                 {"model": "inception-v3", "steps": 1500, "emulate": True})
    first.wait_for(lambda: all(j["step"] > 20 for j in first.jobs()), what="progress")
    first.stop(signal.SIGKILL)
    states = [r["state"] for r in first.query("SELECT state FROM jobs ORDER BY id")]
    assert states == ["running", "running"]  # both were mid-run when the broker died
    second = daemon_factory(state_dir=state)
    jobs = second.wait_all(timeout=60)
    assert [j["state"] for j in jobs] == ["done", "done"]
    adopted = second.query("SELECT job_id FROM events WHERE kind = 'adopted'")
    assert {r["job_id"] for r in adopted} == {1, 2}
    runs = second.runs()
    for a in runs:  # no job ran twice at the same time
        for b in runs:
            if a["id"] < b["id"] and a["job_id"] == b["job_id"]:
                assert b["started_at"] >= a["ended_at"]


SIGNAL_ONLY_JOB = """
import os, signal, sys, time
asked = []
signal.signal(signal.SIGTSTP, lambda *_: asked.append(1))
ckpt = os.path.join(os.environ["MARBLE_CHECKPOINT_DIR"], "step")
step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
while step < 800:  # 8 s: past the start-up assumed of a model not measured (5 s)
    if asked:
        open(ckpt, "w").write(str(step))
        os.kill(int(os.environ["MARBLE_BROKER_PID"]), signal.SIGUSR1)
        sys.exit(0)
    time.sleep(0.01)
    step += 1
"""


def test_job_that_only_sends_sigusr1_is_acknowledged(daemon):
    """The paper's protocol without the marker file: SIGUSR1 alone acknowledges the one
    run being suspended, and its exit counts as a suspension, not as the end."""
    daemon.submit(FIRST, {"model": "inception-v3",
                          "command": [sys.executable, "-c", SIGNAL_ONLY_JOB]})
    jobs = daemon.wait_all(timeout=60)
    assert [j["state"] for j in jobs] == ["done", "done"]
    first, resumed = _chain(daemon, 2)
    assert (first["end_reason"], first["exit_code"]) == ("suspended", 0)
    assert resumed["gpu_count"] == 4 and resumed["end_reason"] == "done"
    (ack,) = daemon.query("SELECT data FROM events WHERE kind = 'acknowledged' AND job_id = 2")
    assert '"via": "SIGUSR1"' in ack["data"]
    # It never called JobProtocol.ready(), so the broker must not prestart it.
    assert not daemon.query("SELECT id FROM events WHERE kind = 'prestarted'")


def test_user_suspend_checkpoints_and_requeues(daemon):
    """`marble suspend`: the job checkpoints, exits, and resumes at once (GPUs are free)."""
    (job,) = daemon.submit({"model": "resnet-50", "steps": 3000, "emulate": True})
    daemon.wait_for(lambda: daemon.jobs()[0]["step"] > 50, what="progress")
    daemon.client.post(f"/v1/jobs/{job['id']}/suspend")
    daemon.wait_all(timeout=60)
    first, resumed = _chain(daemon, job["id"])
    assert first["end_reason"] == "suspended" and first["end_step"] == resumed["start_step"]
    assert resumed["end_step"] == 3000
    (ended,) = daemon.query("SELECT data FROM events WHERE kind = 'suspended'")
    assert '"phases"' in ended["data"] and '"restored"' in ended["data"]


def test_suspend_of_rigid_or_queued_job_is_refused(daemon):
    from marbled.cli.client import ApiError

    daemon.submit({"gpus": 6, "command": ["sleep", "30"]}, {"gpus": 1, "command": ["true"]})
    for job_id, says in ((1, "has not reported progress"), (2, "only a running job")):
        with pytest.raises(ApiError) as err:
            daemon.client.post(f"/v1/jobs/{job_id}/suspend")
        assert err.value.status == 409 and says in str(err.value)


def test_broker_killed_before_recording_the_pid_finds_the_process(daemon_factory, tmp_path):
    """The crash window between launching a run and recording its pid: the next broker
    finds the run's process by its environment and adopts it instead of starting the
    job a second time."""
    import sqlite3

    state = tmp_path / "state"
    first = daemon_factory(state_dir=state)
    first.submit({"model": "resnet-50", "steps": 2000, "emulate": True})
    first.wait_for(lambda: first.jobs()[0]["step"] > 20, what="progress")
    (pid,) = first.query("SELECT pid FROM runs")[0]
    # held (SIGSTOP, which the job cannot see) until the next broker has looked: its 2,000
    # steps take 3 s, and a start of the next broker slowed by a loaded machine let the job
    # end first, 4 times in 16 beside two busy loops
    os.killpg(pid, signal.SIGSTOP)
    first.stop(signal.SIGKILL)
    with sqlite3.connect(state / "marble.db") as con:  # as if the pid never got written
        con.execute("UPDATE runs SET pid = NULL, pid_start = NULL")
    second = daemon_factory(state_dir=state)
    (adopted,) = second.query("SELECT data FROM events WHERE kind = 'adopted'")
    os.killpg(pid, signal.SIGCONT)
    assert f'"pid": {pid}' in adopted["data"] and '"alive": true' in adopted["data"]
    jobs = second.wait_all(timeout=60)
    assert jobs[0]["state"] == "done"
    (run,) = second.runs()  # one run: nothing was started twice
    assert run["pid"] == pid and run["end_step"] == 2000


def test_suspension_before_the_handler_is_installed_is_not_lost(daemon, tmp_path):
    """A SIGTSTP that comes while the job still imports (before JobProtocol.install) is
    dropped by the kernel; the broker's suspend.json makes the job checkpoint anyway,
    instead of training to its end."""
    log = tmp_path / "steps.log"
    slow_start = f"sleep 1.5; exec {' '.join(EMULATE)} --step-log {log}"
    (job,) = daemon.submit({"model": "inception-v3", "steps": 3000,
                            "command": ["sh", "-c", slow_start]})
    daemon.wait_for(lambda: daemon.jobs()[0]["state"] == "running", what="launch")
    daemon.client.post(f"/v1/jobs/{job['id']}/suspend")
    jobs = daemon.wait_all(timeout=60)
    assert jobs[0]["state"] == "done"
    first, resumed = _chain(daemon, job["id"])
    assert first["end_reason"] == "suspended" and first["end_step"] < 100
    assert first["end_step"] == resumed["start_step"] and resumed["end_step"] == 3000
    assert sorted(_steps(log)) == list(range(1, 3001))
