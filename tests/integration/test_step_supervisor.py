"""The supervisor under every step command (srun, jsrun), with real processes: it records
the step's status where a later broker reads it, 128+N as signal N (lifecycle I2).

No batch system here: a shell stands in for the step command, exiting as srun does when
its task is killed (tests/slurm/test_slurm_crash.py runs the real srun)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from marbled.batch.base import LaunchRequest, process_start_time
from marbled.batch.local import start_process
from marbled.batch.supervise import read_exit


def request(tmp_path: Path) -> LaunchRequest:
    return LaunchRequest(argv=(), env={}, node="n1", devices=("0",), run_dir=tmp_path,
                         stdout=tmp_path / "out.log", stderr=tmp_path / "err.log")


@pytest.mark.parametrize("script, status, recorded", [
    ("exit 0", 0, 0), ("exit 3", 3, 3),
    ("exit 143", 143, -signal.SIGTERM),  # srun's status for a task SIGTERM ended
    # killed by something else than the broker (the OOM killer): the supervisor dies of
    # the same signal, not with 137, and records the signal
    ("kill -9 $$", -signal.SIGKILL, -signal.SIGKILL),
])
def test_a_step_commands_status_is_recorded_as_the_runs_code(tmp_path, script, status,
                                                            recorded):
    env = {**os.environ, "MARBLE_RUN_DIR": str(tmp_path), "MARBLE_RUN_ID": "7"}

    async def run() -> int:
        proc = await start_process(["sh", "-c", script], request(tmp_path), env)
        return await proc.wait()

    assert asyncio.run(run()) == status  # the supervisor exits as the step command did
    assert read_exit(tmp_path, 7) == recorded


def test_a_step_command_that_cannot_start_raises_as_a_direct_start_would(tmp_path):
    with pytest.raises(FileNotFoundError) as raised:
        asyncio.run(start_process(["no-such-srun-here"], request(tmp_path), dict(os.environ)))
    assert raised.value.filename == "no-such-srun-here"


def test_a_zombie_is_an_ended_process_not_a_live_one():
    """An orphaned run that init has not reaped yet must not be adopted as alive."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 10
        while process_start_time(pid) is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process_start_time(pid) is None
        assert Path(f"/proc/{pid}").exists()  # still there: a zombie, not reaped
    finally:
        os.waitpid(pid, 0)
    assert process_start_time(os.getpid()) is not None
