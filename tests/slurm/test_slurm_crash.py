"""Plain commands as real Slurm job steps across a broker's crash (lifecycle I2).

Every step command (srun) runs under the run's supervisor on the broker's host, which
records srun's exit status in the run's exit file. A step that ends while no broker
watches is then done or failed with its true code, never run again; a step the
allocation's end cancelled runs again in the next allocation, and its record says
Slurm cancelled it. The commands speak no worker protocol: they only append a line to a
file of their own when they complete, so a second completion is seen.

The launch path does not depend on how the broker reads the allocation, so these run
with `--slurm-api cli` only.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from marbled.core.outcome import RECOVERED
from tests.integration.test_crash_plain_commands import completions, plain, runs_of
from tests.slurm.conftest import wait_slurm_job
from tests.slurm.test_slurm import ONE_NODE, _broker

pytestmark = pytest.mark.slurm


def open_runs(d) -> dict[str, int]:
    """Each job with an open run and its pid recorded, to that pid."""
    return {r["name"]: r["pid"] for r in d.query(
        "SELECT jobs.name, runs.pid FROM runs JOIN jobs ON jobs.id = runs.job_id "
        "WHERE runs.ended_at IS NULL AND runs.pid IS NOT NULL")}


def exits_recorded(state, *jobs: int) -> bool:
    """Whether the supervisor of each job's run has recorded its exit."""
    return all(any((state / "jobs" / str(j)).glob("exit-*.json")) for j in jobs)


def reasons(d) -> dict[str, str]:
    return {r["name"]: r["reason"] for r in d.query("SELECT name, reason FROM jobs")}


@pytest.mark.parametrize("slurm_api", ["cli"])
def test_steps_that_end_or_live_through_a_crash_complete_once(daemon_factory, allocate,
                                                              tmp_path):
    """kill -9 of the broker while four plain steps run on two nodes: one finishes and one
    fails while no broker watches, a two-node one and a one-node one still run when the
    next broker adopts them. None runs again; each is recorded with its true exit code."""
    job = allocate("--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=12", "--gres=gpu:6")
    state, marks = tmp_path / "state", tmp_path / "marks"
    marks.mkdir()
    first = _broker(daemon_factory, job, state_dir=state)
    wide = plain("wide", marks, "sleep 12")
    first.submit(plain("quick", marks, "sleep 3"),
                 {"name": "fails", "gpus": 2, "command": ["sh", "-c", "sleep 3; exit 3"]},
                 {**wide, "nodes": 2, "gpus": 2}, plain("slow", marks, "sleep 12"))
    first.wait_for(lambda: len(open_runs(first)) == 4, timeout=60, what="four running steps")
    first.stop(signal.SIGKILL)
    assert not completions(marks, "quick"), "it ended before the kill: nothing was tested"
    first.wait_for(lambda: completions(marks, "quick"), timeout=30, what="quick's end")
    first.wait_for(lambda: exits_recorded(state, 1, 2), timeout=30,
                   what="the exits of quick and fails")

    second = _broker(daemon_factory, job, state_dir=state)
    jobs = {j["name"]: j for j in second.wait_all(timeout=120)}
    assert {n: j["state"] for n, j in jobs.items()} == {
        "quick": "done", "fails": "failed", "wide": "done", "slow": "done"}
    for name, tasks in (("quick", 1), ("wide", 2), ("slow", 1)):  # a task per node marks
        assert completions(marks, name) == tasks, f"{name}: {completions(marks, name)} marks"
    for name in jobs:
        assert len(runs_of(second, name)) == 1, f"{name} was started again"
    why = reasons(second)
    assert why["quick"] == f"{RECOVERED}: done (exited with code 0)"
    assert why["fails"].startswith(f"{RECOVERED}: exited with code 3")
    assert [r["exit_code"] for r in runs_of(second, "fails")] == [3]
    assert runs_of(second, "wide")[0]["node"] == "n1,n2"
    alive = {r["run_id"]: r["data"] for r in second.query(
        "SELECT run_id, data FROM events WHERE kind = 'adopted'")}
    for name in ("wide", "slow"):  # adopted alive, watched to the end, exit read back
        run = runs_of(second, name)[0]
        assert '"alive": true' in alive[run["id"]] and run["exit_code"] == 0


@pytest.mark.parametrize("slurm_api", ["cli"])
def test_a_step_cancelled_with_its_allocation_runs_again_and_a_finished_one_does_not(
        daemon_factory, allocate, tmp_path):
    """kill -9 of the broker, then the allocation ends: the step that had finished is done
    and the one that had failed is failed, from their records; the one the allocation's
    end cancelled (srun: 128+SIGTERM) is not the job's failure: it runs again in the next
    allocation, on another node, and its record says Slurm cancelled it."""
    state, marks = tmp_path / "state", tmp_path / "marks"
    marks.mkdir()
    first_job = allocate(*ONE_NODE, "--nodelist=n1")
    first = _broker(daemon_factory, first_job, state_dir=state)
    first.submit(plain("quick", marks, "sleep 2"),
                 {"name": "fails", "gpus": 1, "command": ["sh", "-c", "sleep 2; exit 3"]},
                 plain("long", marks, "sleep 600"))
    first.wait_for(lambda: len(open_runs(first)) == 3, timeout=60, what="three running steps")
    first.stop(signal.SIGKILL)
    first.wait_for(lambda: completions(marks, "quick"), timeout=30, what="quick's end")
    first.wait_for(lambda: exits_recorded(state, 1, 2), timeout=30,
                   what="the exits of quick and fails")
    subprocess.run(["scancel", first_job], check=True)
    wait_slurm_job(first_job, timeout=60)
    first.wait_for(lambda: exits_recorded(state, 3), timeout=30,
                   what="the cancelled step's exit")

    second = _broker(daemon_factory, allocate(*ONE_NODE, "--nodelist=n2"), state_dir=state)
    second.wait_for(lambda: len(runs_of(second, "long")) == 2, timeout=60,
                    what="long's second run")
    jobs = {j["name"]: j for j in second.jobs()}
    assert (jobs["quick"]["state"], jobs["fails"]["state"]) == ("done", "failed")
    assert completions(marks, "quick") == 1
    assert len(runs_of(second, "quick")) == len(runs_of(second, "fails")) == 1
    cancelled, again = runs_of(second, "long")
    assert cancelled["exit_code"] == -signal.SIGTERM  # srun's 143, as a signal
    assert cancelled["end_reason"] == "suspended"
    detail = second.query("SELECT data FROM events WHERE run_id = ? AND kind = 'suspended'",
                          cancelled["id"])[0]["data"]
    assert f"Slurm cancelled step {first_job}." in detail and "left with its allocation" in detail
    assert again["node"] == "n2" and again["ended_at"] is None
    second.client.post(f"/v1/jobs/{jobs['long']['id']}/cancel")
