"""The submitter's environment reaches a real Slurm job step (docs/environment.md).

srun passes its own environment to the step's tasks: marbled gives srun the job's (the
submitter's, with the allocation's SLURM_* variables), and finds srun on its own PATH.
"""

from __future__ import annotations

import os

import pytest

from tests.integration.test_environment import marble
from tests.slurm.test_slurm import ONE_NODE, _broker

pytestmark = pytest.mark.slurm


@pytest.mark.parametrize("slurm_api", ["cli"])
def test_a_step_runs_in_the_submitters_environment_with_the_allocations_ids(
        daemon_factory, allocate, tmp_path):
    """The submitter's PATH holds only their own tools (no srun, no /usr/bin), a variable
    of theirs, and a SLURM_JOB_ID of another allocation: the step sees their variable and
    tools, and the SLURM_JOB_ID of the allocation it runs in."""
    job = allocate(*ONE_NODE)
    d = _broker(daemon_factory, job)
    tools = tmp_path / "venv-bin"
    tools.mkdir()
    (tools / "mytool").write_text("#!/bin/sh\necho mytool ran\n")
    (tools / "mytool").chmod(0o755)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
           "PATH": str(tools), "FOO": "from-the-shell", "SLURM_JOB_ID": "999",
           "MARBLE_STATE_DIR": str(d.state_dir)}
    done = marble(env, "submit", "--gpus", "1", "--name", "env", "--", "/bin/sh", "-c",
                  'echo "FOO=$FOO JOB=$SLURM_JOB_ID STEP=${SLURM_STEP_ID:+yes}"; mytool')
    assert done.returncode == 0, done.stderr
    (ended,) = d.wait_all(timeout=120)
    assert ended["state"] == "done", ended["reason"]
    text = d.client.get(f"/v1/jobs/{ended['id']}/log?lines=5")["text"].split("\n")
    assert text[:2] == [f"FOO=from-the-shell JOB={job} STEP=yes", "mytool ran"]
