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


WAITS = """
from marbled.worker.protocol import JobProtocol
proto = JobProtocol.from_env()
proto.ready()
print("ran as run", proto.run_id, flush=True)
"""


@pytest.mark.parametrize("replaced", [True, False])
def test_a_standby_on_a_node_without_its_brokers_pid_gives_up_when_another_broker_starts(
        tmp_path, replaced):
    """A prestarted process that cannot see its broker's pid (on another node; none here:
    no MARBLE_BROKER_PID) used to wait for its go until its allocation ended, if its broker
    was killed -9. It reads the state directory's lock file: once another broker holds it,
    no go will come, and it exits 0 without running (a real process, real files)."""
    import os
    import subprocess
    import time

    from marbled.worker.protocol import LOCK_CHECK_S, STANDBY_BROKER_VAR, STANDBY_VAR

    lock, go = tmp_path / "marbled.lock", tmp_path / "go-abc.json"
    lock.write_text("4101")
    env = {k: v for k, v in os.environ.items() if k != "MARBLE_BROKER_PID"}
    env.update({STANDBY_VAR: str(go), STANDBY_BROKER_VAR: f"{lock}:4101",
                "MARBLE_RUN_DIR": str(tmp_path), "MARBLE_JOB_ID": "1"})
    proc = subprocess.Popen([sys.executable, "-c", WAITS], env=env, stdout=subprocess.PIPE,
                            text=True)
    try:
        time.sleep(2.5 * LOCK_CHECK_S + 1.0)  # its imports, then lock reads that see 4101
        assert proc.poll() is None, "it gave up while its broker held the lock"
        if replaced:
            lock.write_text("4102")  # the next broker on this state directory
            assert proc.wait(timeout=10 * LOCK_CHECK_S) == 0
            assert proc.stdout.read() == ""  # it never ran
        else:
            go.write_text('{"MARBLE_RUN_ID": "7", "MARBLE_GPUS": "1"}')
            assert proc.wait(timeout=10) == 0
            assert proc.stdout.read().strip() == "ran as run 7"
    finally:
        proc.kill()
