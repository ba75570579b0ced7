"""The Slurm tier: a real Slurm 22.05 on this machine (munged, slurmctld, two slurmd).

Only the GPUs are fake: each node has 6 gres/gpu devices that are /dev/null,
which Slurm allocates, isolates per step (CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS)
and queues exactly like real ones. `cluster.sh up` (idempotent; it installs the
packages on a fresh machine) brings the cluster up for the session. It needs
root: elsewhere these tests are skipped saying so, and in CI (CI set) that is
an error instead, so the tier cannot silently vanish from CI.

Every broker test runs twice, reading Slurm through pyslurm and through the commands
(`marbled --slurm-api`). pyslurm is built once from ../shared/vendor/ by pyslurm.sh (as
that directory's README says, about 3 minutes); a failed build fails the tier in CI and
skips the pyslurm half elsewhere, with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marbled.batch.slurm_api import choose_reader

CLUSTER = Path(__file__).with_name("cluster.sh")
PYSLURM_BUILD = Path(__file__).with_name("pyslurm.sh")
# pyslurm is built beside the test venv (once: a stamp names the source archive), not into
# it, so that a broker without it on PYTHONPATH is a site without pyslurm
PYSLURM_LIB = Path(sys.prefix) / "pyslurm-22.5" / "lib"


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
        _skip_or_fail(reason)
    done = subprocess.run(["bash", str(CLUSTER), "up"], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, f"cluster.sh up failed:\n{done.stderr}"


def _skip_or_fail(reason: str):
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pyslurm_lib(slurm_cluster) -> Path:
    """The directory holding a pyslurm built for the cluster's Slurm (for PYTHONPATH)."""
    done = subprocess.run(["bash", str(PYSLURM_BUILD), str(PYSLURM_LIB.parent)],
                          capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "PYTHON": sys.executable})
    if done.returncode != 0:
        _skip_or_fail(f"pyslurm could not be built ({PYSLURM_BUILD.name}): "
                      f"{done.stderr.strip()[-2000:]}")
    return PYSLURM_LIB


def with_pythonpath(path: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(filter(None, (str(path),
                                                        os.environ.get("PYTHONPATH"))))}


@pytest.fixture(params=["pyslurm", "cli"])
def slurm_api(request) -> str:
    """How the broker reads Slurm (--slurm-api); pyslurm's half builds it first."""
    if request.param == "pyslurm":
        request.getfixturevalue("pyslurm_lib")
    return request.param


@pytest.fixture
def daemon_factory(daemon_factory, slurm_api):
    """Brokers reading Slurm the `slurm_api` way (pyslurm on their PYTHONPATH for it)."""
    def make(*args: str, env: dict | None = None, **kw):
        extra = with_pythonpath(PYSLURM_LIB) if slurm_api == "pyslurm" else {}
        return daemon_factory(*args, "--slurm-api", slurm_api, env={**extra, **(env or {})},
                              **kw)

    return make


def api_reader(api: str):
    """A reader of the `api` kind in this process (pyslurm imported from its build)."""
    if api == "pyslurm" and str(PYSLURM_LIB) not in sys.path:
        sys.path.insert(0, str(PYSLURM_LIB))
    reader, _why = choose_reader(api)
    assert reader.name == api, _why
    return reader


def slurm_job_state(job_id: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                         text=True, check=False).stdout
    found = re.search(r"JobState=(\S+)", out)
    return found.group(1) if found else "GONE"


def allocated_node(job_id: str) -> str:
    """The node Slurm gave a one-node allocation: n1 unless a previous test's allocation
    still held it (Slurm then picks n2), so tests name the node they were given."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert re.fullmatch(r"n\d+", out), f"allocation {job_id} is not on one node: {out!r}"
    return out


@pytest.fixture
def allocate(slurm_cluster):
    """allocate(*salloc options) -> job id of a new allocation, held without a shell."""
    held: list[str] = []

    def make(*options: str) -> str:
        # the other half of the tier may hold a node for a minute or two (make test runs
        # the halves side by side): salloc waits in Slurm's queue meanwhile
        done = subprocess.run(["salloc", "--no-shell", "--job-name=marble-test", *options],
                              capture_output=True, text=True, timeout=300, check=False)
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
