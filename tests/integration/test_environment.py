"""The submitter's environment reaches the job, as sbatch's --export carries it (issue 31).

Real brokers on a real socket, the real `marble submit` as a subprocess with its own
environment, plain commands that print what they see. The broker is started with an
environment of its own (BROKER_ONLY set, the submitter's variables unset), so which one a
job got is seen in its output.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from marbled.paths import DB_NAME
from tests.conftest import Daemon

pytestmark = pytest.mark.daemon

SHOW = 'echo "FOO=$FOO BAZ=$BAZ BROKER_ONLY=$BROKER_ONLY SLURM_JOB_ID=$SLURM_JOB_ID"'


def submitter_env(d: Daemon, **more: str) -> dict[str, str]:
    """A user's shell: their own variables, and a fake allocation of theirs (never taken)."""
    env = {k: v for k, v in os.environ.items() if k != "BROKER_ONLY"}
    return {**env, "MARBLE_STATE_DIR": str(d.state_dir), "FOO": "from-the-shell",
            "SLURM_JOB_ID": "999", **more}


def marble(env: dict, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", *args], env=env,
                          capture_output=True, text=True, timeout=60, cwd=cwd)


def output_of(d: Daemon, name: str) -> str:
    (job_id,) = [j["id"] for j in d.jobs() if j["name"] == name]
    return d.client.get(f"/v1/jobs/{job_id}/log?lines=5")["text"].strip()


@pytest.fixture
def broker(daemon_factory) -> Daemon:
    return daemon_factory(env={"BROKER_ONLY": "the-brokers", "FOO": "", "BAZ": ""})


def test_submit_carries_the_submitters_environment_by_default(broker, tmp_path):
    """--export=ALL (the default): the job runs with the submitter's variables and PATH
    (a tool on it is found, as after `module load` or `source venv/bin/activate`), not the
    broker's; the submitter's SLURM_JOB_ID is not taken."""
    tools = tmp_path / "venv-bin"
    tools.mkdir()
    (tools / "mytool").write_text("#!/bin/sh\necho mytool ran\n")
    (tools / "mytool").chmod(0o755)
    env = submitter_env(broker, PATH=f"{tools}:{os.environ['PATH']}")
    done = marble(env, "submit", "--gpus", "1", "--name", "all", "--", "sh", "-c", SHOW)
    assert done.returncode == 0, done.stderr
    assert marble(env, "submit", "--gpus", "1", "--name", "tool", "--", "mytool").returncode == 0
    broker.wait_all()
    assert output_of(broker, "all") == \
        "FOO=from-the-shell BAZ= BROKER_ONLY= SLURM_JOB_ID="
    assert output_of(broker, "tool") == "mytool ran"


def test_export_none_and_a_list_of_variables(broker):
    env = submitter_env(broker, BAZ="two")
    assert marble(env, "submit", "--gpus", "1", "--export", "NONE", "--name", "none", "--",
                  "sh", "-c", SHOW).returncode == 0
    assert marble(env, "submit", "--gpus", "1", "--export", "FOO,BAZ=given", "--name", "list",
                  "--", "sh", "-c", SHOW).returncode == 0
    broker.wait_all()
    assert output_of(broker, "none") == "FOO= BAZ= BROKER_ONLY=the-brokers SLURM_JOB_ID="
    assert output_of(broker, "list") == \
        "FOO=from-the-shell BAZ=given BROKER_ONLY=the-brokers SLURM_JOB_ID="


@pytest.mark.parametrize("export, says", [
    ("SLURM_JOB_ID=3", "SLURM_JOB_ID is set by marbled or the allocation"),
    ("CUDA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES is set by marbled"),
    ("NOT_SET_HERE", "names NOT_SET_HERE, which your environment does not set"),
    ("1BAD", "'1BAD' is not a variable name"),
    ("NONE,FOO", "NONE stands alone"),
])
def test_an_export_that_cannot_be_given_is_refused_with_the_reason(broker, export, says):
    done = marble(submitter_env(broker), "submit", "--gpus", "1", "--export", export, "--",
                  "true")
    assert done.returncode == 2 and "--export" in done.stderr and says in done.stderr
    assert broker.jobs() == []


def test_a_job_file_shares_one_stored_environment_and_jobs_may_name_their_own(broker,
                                                                             tmp_path):
    """50 jobs of a file store one environment; a job's own export wins over --export."""
    jobs = "\n".join(f"- {{name: j{i}, gpus: 1, command: ['sh', '-c', '{SHOW}']}}"
                     for i in range(50))
    jobs += f"\n- {{name: own, gpus: 1, export: 'BAZ=mine', command: ['sh', '-c', '{SHOW}']}}\n"
    (tmp_path / "sweep.yaml").write_text(jobs)
    done = marble(submitter_env(broker), "submit", "--file", str(tmp_path / "sweep.yaml"))
    assert done.returncode == 0, done.stderr
    broker.wait_all(timeout=120)
    assert output_of(broker, "j49") == "FOO=from-the-shell BAZ= BROKER_ONLY= SLURM_JOB_ID="
    assert output_of(broker, "own") == "FOO= BAZ=mine BROKER_ONLY=the-brokers SLURM_JOB_ID="
    con = sqlite3.connect(broker.state_dir / DB_NAME)
    try:
        assert con.execute("SELECT count(*) FROM environments").fetchone()[0] == 2
        assert con.execute("SELECT count(DISTINCT env) FROM jobs WHERE name LIKE 'j%'"
                           ).fetchone()[0] == 1
    finally:
        con.close()


def test_a_restarted_broker_runs_a_queued_job_in_the_environment_it_was_submitted_with(
        daemon_factory, tmp_path):
    """The environment is recorded with the job: a broker killed -9 before the job started,
    and a new one started with another environment, runs it as it was submitted."""
    first = daemon_factory(env={"BROKER_ONLY": "first"}, gpus=1)
    env = submitter_env(first)
    assert marble(env, "submit", "--gpus", "1", "--name", "blocker", "--", "sleep",
                  "30").returncode == 0
    assert marble(env, "submit", "--gpus", "1", "--name", "later", "--", "sh", "-c",
                  SHOW).returncode == 0
    first.stop(9)
    subprocess.run(["pkill", "-f", "sleep 30"], check=False)  # the blocker's run ends
    second = daemon_factory(env={"BROKER_ONLY": "second", "FOO": "the-second-brokers"},
                            gpus=1)
    second.wait_all(timeout=120)
    assert output_of(second, "later") == "FOO=from-the-shell BAZ= BROKER_ONLY= SLURM_JOB_ID="


def test_the_api_refuses_what_no_job_may_be_given(broker):
    from marbled.cli.client import ApiError

    for env, field in (({"SLURM_JOB_ID": "1"}, "env"), ({"A": "x\0y"}, "env"),
                       ({"1A": "x"}, "env")):
        with pytest.raises(ApiError) as refused:
            broker.client.post("/v1/jobs", {"gpus": 1, "command": ["true"], "env": env})
        assert refused.value.status == 400 and refused.value.field == field
    with pytest.raises(ApiError) as refused:
        broker.client.post("/v1/jobs", {"gpus": 1, "command": ["true"], "export": "FOO"})
    assert refused.value.status == 400 and "ALL or NONE" in str(refused.value)
    # a request's environment is its jobs' unless they give their own
    (shared, own) = broker.client.post("/v1/jobs", {
        "export": "NONE", "env": {"FOO": "request"},
        "jobs": [{"name": "shared", "gpus": 1, "command": ["sh", "-c", SHOW]},
                 {"name": "own", "gpus": 1, "command": ["sh", "-c", SHOW],
                  "env": {"BAZ": "job"}}]})["jobs"]
    broker.wait_all()
    assert output_of(broker, "shared") == "FOO=request BAZ= BROKER_ONLY=the-brokers " \
        "SLURM_JOB_ID="
    assert output_of(broker, "own") == "FOO= BAZ=job BROKER_ONLY=the-brokers SLURM_JOB_ID="
