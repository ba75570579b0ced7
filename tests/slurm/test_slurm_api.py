"""The two ways marbled reads Slurm (pyslurm, the commands) on the real cluster: the choice
and its fallback, and what the broker follows while it runs (the allocation's end)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from marbled.batch.slurm_api import running_slurm
from tests.conftest import start_daemon
from tests.slurm.conftest import PYSLURM_LIB, with_pythonpath
from tests.slurm.test_slurm import ONE_NODE, _broker

pytestmark = pytest.mark.slurm


def _events(d, kind: str) -> list[dict]:
    return [json.loads(r["data"]) for r in d.query(
        "SELECT data FROM events WHERE kind = ? ORDER BY id", kind)]


def _time_limit(job: str, minutes: int) -> None:
    subprocess.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}"], check=True)


def test_end_moved_by_scontrol_update_moves_the_drain(daemon_factory, allocate, slurm_api):
    """The limit lengthened: the drain moves later (no drain); shortened below --drain-before:
    the broker drains at once, every job suspended, and says why."""
    job = allocate(*ONE_NODE, "--nodelist=n1", "--time=10")
    d = _broker(daemon_factory, job, "--drain-before", "420", "--allocation-poll", "0.2")
    assert f"Slurm read through {'pyslurm' if slurm_api == 'pyslurm' else 'the Slurm'}" \
        in d.log()
    d.submit({"model": "resnet-50", "steps": 100000, "emulate": True})
    d.wait_for(lambda: d.jobs()[0]["step"] > 5, what="progress")
    _time_limit(job, 20)
    d.wait_for(lambda: _events(d, "allocation-end"), what="the later end")
    _time_limit(job, 7)  # ends in under 420 s from now: drain now
    assert d.proc.wait(timeout=60) == 75, d.log()
    later, sooner = _events(d, "allocation-end")
    assert later["end_time"] - later["was"] == 600  # 10 more minutes
    assert sooner["was"] == later["end_time"] and later["end_time"] - sooner["end_time"] == 780
    (drain,) = _events(d, "drain")
    assert drain["reason"] == f"the allocation ends at {time.ctime(sooner['end_time'])}"
    assert d.query("SELECT state FROM jobs")[0]["state"] == "suspended"
    assert "the allocation's end moved" in d.log()


@pytest.fixture
def standin_pyslurm(tmp_path):
    """A stand-in `pyslurm` module (not pyslurm) that reports a version of another Slurm."""
    where = tmp_path / "standin"
    (where / "pyslurm").mkdir(parents=True)
    (where / "pyslurm" / "__init__.py").write_text(
        "def version():\n    return '21.8.0'\n")
    return where


def _marbled(state, job: str, *args: str, env: dict | None = None):
    return subprocess.run(
        [sys.executable, "-m", "marbled.cli.daemon_cmd", "--state-dir", str(state),
         "--launcher", "slurm", *args], capture_output=True, text=True, timeout=60,
        env={**os.environ, "SLURM_JOB_ID": job, **(env or {})})


def test_slurm_api_pyslurm_refuses_to_start_without_a_usable_pyslurm(
        allocate, standin_pyslurm, tmp_path):
    job = allocate(*ONE_NODE)
    absent = _marbled(tmp_path / "a", job, "--slurm-api", "pyslurm")
    assert absent.returncode == 1
    assert "--slurm-api pyslurm: pyslurm cannot be imported" in absent.stderr
    assert "docs/slurm.md#pyslurm" in absent.stderr
    mismatched = _marbled(tmp_path / "b", job, "--slurm-api", "pyslurm",
                          env=with_pythonpath(standin_pyslurm))
    assert mismatched.returncode == 1
    assert (f"pyslurm 21.8.0 is not built for the running Slurm {running_slurm()} "
            "(major.minor must match)") in mismatched.stderr


def test_auto_falls_back_to_the_commands_with_a_standin_pyslurm_of_another_version(
        allocate, standin_pyslurm, tmp_path):
    """auto with a mismatched (stand-in) pyslurm: the commands, said once in the log, and a
    job runs to its end as a job step."""
    job = allocate(*ONE_NODE)
    d = start_daemon(tmp_path / "state", "--launcher", "slurm", gpus=None,
                     env={"SLURM_JOB_ID": job, **with_pythonpath(standin_pyslurm)})
    try:
        d.submit({"model": "resnet-50", "steps": 50, "emulate": True})
        (done,) = d.wait_all(timeout=60)
        assert done["state"] == "done"
        said = [line for line in d.log().splitlines() if "Slurm read through" in line]
        assert len(said) == 1 and "the Slurm commands: pyslurm 21.8.0 is not built" in said[0]
    finally:
        d.stop()


def test_auto_takes_pyslurm_when_it_matches(allocate, pyslurm_lib, tmp_path):
    job = allocate(*ONE_NODE)
    d = start_daemon(tmp_path / "state", "--launcher", "slurm", gpus=None,
                     env={"SLURM_JOB_ID": job, **with_pythonpath(PYSLURM_LIB)})
    try:
        assert f"Slurm read through pyslurm 22.5.3 matches Slurm {running_slurm()}" in d.log()
    finally:
        d.stop()


def test_a_step_scancelled_is_recorded_with_slurms_reason(daemon_factory, allocate, slurm_api):
    """`scancel JOB.STEP` (as staff would): the run failed, and the runs' end, the job's
    reason and `marble explain` say that Slurm cancelled it, not only 'signal 9'."""
    job = allocate(*ONE_NODE)
    d = _broker(daemon_factory, job)
    d.submit({"model": "resnet-50", "steps": 100000, "emulate": True})
    placed = d.wait_for(lambda: d.query("SELECT data FROM events WHERE kind = 'placed'"),
                        what="the step")
    step = f"{job}.{json.loads(placed[0]['data'])['step']}"
    # the step's task reports before slurmctld may list the step: a scancel at once was
    # refused once ("job_step_signal: JobId=521 StepId=0 not found", exit 225)
    d.wait_for(lambda: subprocess.run(["scontrol", "show", "step", step],
                                      capture_output=True).returncode == 0,
               what=f"slurmctld to know step {step}")
    subprocess.run(["scancel", step], check=True)
    (failed,) = d.wait_all(timeout=60)
    assert failed["state"] == "failed"
    (run,) = d.runs()
    assert (run["end_reason"], run["exit_code"]) == ("failed", -9)
    # with the node when slurmstepd's line reaches srun, which it does not always do
    said = f"Slurm cancelled step {step}"
    assert said in failed["reason"]
    (event,) = _events(d, "failed")
    assert event["ended_by"]["state"] == "CANCELLED"
    explain = subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", "explain", "1"],
                             capture_output=True, text=True, timeout=30,
                             env={**os.environ, "MARBLE_STATE_DIR": str(d.state_dir)})
    assert said in explain.stdout, explain.stdout + explain.stderr


def _node_state(node: str, *state: str) -> None:
    subprocess.run(["scontrol", "update", f"NodeName={node}", *state], check=True)


def test_a_node_set_to_drain_gets_no_new_runs(daemon_factory, allocate, slurm_api):
    """Staff drain n2 during the allocation: the broker notices, records it, and starts every
    later run on n1; back in service, it is recorded too."""
    job = allocate("--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=12", "--gres=gpu:6")
    d = _broker(daemon_factory, job, "--allocation-poll", "0.2")
    try:
        _node_state("n2", "State=DRAIN", "Reason=marble-test")
        d.wait_for(lambda: _events(d, "node-unavailable"), what="the drained node")
        d.submit(*({"model": m, "steps": 200, "emulate": True}
                   for m in ("resnet-50", "vgg-16", "inception-v3", "resnet-50")))
        assert [j["state"] for j in d.wait_all(timeout=120)] == ["done"] * 4
        assert {r["node"] for r in d.runs()} == {"n1"}
        (out,) = _events(d, "node-unavailable")
        assert out["node"] == "n2" and "DRAIN" in out["state"].upper()
        assert "node n2: " in d.log() and "no new runs there" in d.log()
    finally:
        _node_state("n2", "State=RESUME")
    d.wait_for(lambda: _events(d, "node-available"), what="n2 back")
    assert _events(d, "node-available")[0]["node"] == "n2"
