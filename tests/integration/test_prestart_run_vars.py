"""A command that names a $MARBLE_ variable only a run's launch gives (torchrun
--nproc-per-node='$MARBLE_GPUS') under the default `--prestart ahead`: the broker fills it
in when it execs the command, and a prestarted process is exec'd before its go, so such a
job is not prestarted; its resume is launched cold with the run's value filled in. A
command that names only the job's own variables is still prestarted."""

from __future__ import annotations

import sys

import pytest

pytestmark = pytest.mark.daemon

# Speaks the protocol (so the broker would prestart it) and, like torchrun, fails on a
# GPU count that is not the run's: a literal $MARBLE_GPUS, or another number.
GPU_ARG_JOB = """
import os, sys
from marbled.worker.protocol import JobProtocol
proto = JobProtocol.from_env().install()
proto.ready()  # a prestarted process waits here for its go
if sys.argv[1] != os.environ["MARBLE_GPUS"]:
    sys.exit(f"ValueError: Unsupported nproc_per_node value: {sys.argv[1]}")
from marbled.worker import emulate
sys.stdout.flush()
os._exit(emulate.run(proto, sys.argv[2:]))
"""
FIRST = {"model": "resnet-50", "steps": 600, "emulate": True}  # primary on 3, ends first


def _job(log, arg: str) -> dict:
    return {"model": "inception-v3", "steps": 1500,
            "command": [sys.executable, "-c", GPU_ARG_JOB, arg, "--time-scale", "0.01",
                        "--step-log", str(log)]}


def _steps(path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


def test_a_command_naming_the_gpu_count_resumes_cold_with_it_filled_in(daemon, tmp_path):
    """The secondary is suspended on 3 GPUs and resumed on 4: no prestart, the resumed run
    gets '4' for '$MARBLE_GPUS' (also written ${MARBLE_GPUS}), every step runs once, and
    the log says why it was not prestarted."""
    log = tmp_path / "steps.log"
    daemon.submit(FIRST, _job(log, "${MARBLE_GPUS}"))
    jobs = daemon.wait_all(timeout=60)
    assert [j["state"] for j in jobs] == ["done", "done"], [dict(e) for e in daemon.query(
        "SELECT kind, data FROM events WHERE job_id = 2")]
    first, resumed = daemon.query("SELECT * FROM runs WHERE job_id = 2 ORDER BY id")
    assert first["end_reason"] == "suspended" and resumed["end_reason"] == "done"
    assert first["gpu_count"] != resumed["gpu_count"]
    assert _steps(log) == list(range(1, 1501))
    assert not daemon.query("SELECT id FROM events WHERE job_id = 2 AND kind IN "
                            "('prestarted', 'go')")
    assert daemon.log().count("job 2 is not prestarted: its command names $MARBLE_GPUS") == 1


def test_a_command_naming_only_the_jobs_own_variables_is_still_prestarted(daemon, tmp_path):
    """$MARBLE_JOB_ID is the same in every run: the resume runs in the prestarted process."""
    log = tmp_path / "steps.log"
    job = _job(log, "x")
    job["command"][2] = GPU_ARG_JOB.replace('os.environ["MARBLE_GPUS"]', '"2"')
    job["command"][3] = "$MARBLE_JOB_ID"
    daemon.submit(FIRST, job)
    jobs = daemon.wait_all(timeout=60)
    assert [j["state"] for j in jobs] == ["done", "done"]
    first, resumed = daemon.query("SELECT * FROM runs WHERE job_id = 2 ORDER BY id")
    assert first["end_reason"] == "suspended"
    (go,) = daemon.query("SELECT run_id FROM events WHERE kind = 'go' AND job_id = 2")
    assert go["run_id"] == resumed["id"]
    assert _steps(log) == list(range(1, 1501))
