"""The Slurm tier: a real Slurm 22.05 on this machine (munged, slurmctld, two slurmd).

Only the GPUs are fake: each node has 6 gres/gpu devices that are /dev/null,
which Slurm allocates, isolates per step (CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS)
and queues exactly like real ones. `cluster.sh up` (idempotent; it installs the
packages on a fresh machine) brings the cluster up for the session. It needs
root: elsewhere these tests are skipped saying so, and in CI (CI set) that is
an error instead, so the tier cannot silently vanish from CI.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

CLUSTER = Path(__file__).with_name("cluster.sh")


def _cannot_run() -> str | None:
    if os.geteuid() != 0:
        return "the Slurm tier needs root to install and start munged/slurmctld/slurmd"
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        return "Slurm is not installed and there is no apt-get to install it"
    return None


@pytest.fixture(scope="session")
def slurm_cluster():
    reason = _cannot_run()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    done = subprocess.run(["bash", str(CLUSTER), "up"], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, f"cluster.sh up failed:\n{done.stderr}"


def slurm_job_state(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                         text=True, check=False).stdout
    found = re.search(r"JobState=(\S+)", out)
    return found.group(1) if found else "GONE"


@pytest.fixture
def allocate(slurm_cluster):
    """allocate(*salloc options) -> job id of a new allocation, held without a shell."""
    held: list[str] = []

    def make(*options: str) -> str:
        done = subprocess.run(["salloc", "--no-shell", "--job-name=marble-test", *options],
                              capture_output=True, text=True, timeout=60, check=False)
        found = re.search(r"Granted job allocation (\d+)", done.stderr)
        assert found, f"salloc {' '.join(options)} failed: {done.stderr}"
        held.append(found.group(1))
        return found.group(1)

    yield make
    for job_id in held:
        subprocess.run(["scancel", job_id], check=False)


def wait_slurm_job(job_id: str, timeout: float) -> str:
    """Wait until a Slurm job has ended; its final state."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = slurm_job_state(job_id)
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return state
        time.sleep(0.2)
    raise AssertionError(f"Slurm job {job_id} still {slurm_job_state(job_id)} after {timeout} s")
