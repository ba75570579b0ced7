"""The one-object worker API (marbled.worker.loop.StepLoop) in real processes with real
signals, around a checkpoint of the job's own (a JSON file): no framework needed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marbled.worker.protocol import ACK_FILE, PROGRESS_FILE, SUSPEND_FILE, read_json

JOB = '''
import json, sys, time
from pathlib import Path
from marbled.worker.loop import StepLoop

class JsonCheckpoint:
    """The step and a running sum: the job's whole state."""
    def __init__(self, directory):
        self.path = Path(directory) / "state.json"
        self.saved_step = None
        self.total = 0
    def restore(self):
        if not self.path.exists():
            return 0
        state = json.loads(self.path.read_text())
        self.total, self.saved_step = state["total"], state["step"]
        return self.saved_step
    def save(self, step):
        self.path.write_text(json.dumps({"step": step, "total": self.total}))
        self.saved_step = step

mode, log = sys.argv[1], open(sys.argv[2], "a", buffering=1)
ckpt = JsonCheckpoint(sys.argv[3])
with StepLoop(ckpt, every=int(sys.argv[4])) as run:
    for step in run.steps():
        if mode == "leave" and step == 7:
            break
        time.sleep(0.01)
        ckpt.total += step
        log.write(f"{step}\\n")
print("finished", run.step, ckpt.total)
'''


def _launch(tmp_path: Path, run_id: int, mode: str = "train", every: int = 0,
            steps: int = 300) -> subprocess.Popen:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    env = {**os.environ, "MARBLE_RUN_DIR": str(run_dir), "MARBLE_RUN_ID": str(run_id),
           "MARBLE_JOB_ID": "1", "MARBLE_TARGET_STEPS": str(steps),
           "MARBLE_REPORT_INTERVAL": "0.05", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, str(script), mode, str(tmp_path / "steps.log"),
                             str(tmp_path), str(every)],
                            env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)


def _progress(tmp_path: Path) -> dict:
    return read_json(tmp_path / "run" / PROGRESS_FILE) or {}


def _wait_step(tmp_path: Path, at_least: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while _progress(tmp_path).get("step", 0) < at_least:
        assert time.monotonic() < deadline, f"no step {at_least} reported"
        time.sleep(0.02)


def _logged(tmp_path: Path) -> list[int]:
    return [int(s) for s in (tmp_path / "steps.log").read_text().split()]


def _saved(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "state.json").read_text())


def test_sigtstp_checkpoints_acknowledges_and_the_next_run_continues(tmp_path):
    proc = _launch(tmp_path, run_id=1)
    _wait_step(tmp_path, 20)
    proc.send_signal(signal.SIGTSTP)
    assert proc.wait(timeout=30) == 0
    ack = read_json(tmp_path / "run" / ACK_FILE)
    saved = _saved(tmp_path)
    assert ack["run_id"] == 1 and ack["step"] == saved["step"] >= 20
    assert saved["step"] < 300 and "finished" not in proc.stdout.read()

    resumed = _launch(tmp_path, run_id=2)
    out, _ = resumed.communicate(timeout=60)
    assert resumed.returncode == 0
    assert out.split() == ["finished", "300", str(sum(range(1, 301)))]  # state carried over
    assert _logged(tmp_path) == list(range(1, 301))  # every step once, none lost
    assert _saved(tmp_path)["step"] == 300
    assert _progress(tmp_path)["step"] == 300 and _progress(tmp_path)["start_step"] == ack["step"]


def test_suspension_asked_before_start_exits_without_training(tmp_path):
    """The broker's request file, written before the process could catch SIGTSTP."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / SUSPEND_FILE).write_text(json.dumps({"run_id": 5, "at": time.time()}))
    proc = _launch(tmp_path, run_id=5)
    assert proc.wait(timeout=30) == 0
    assert read_json(tmp_path / "run" / ACK_FILE)["step"] == 0
    assert not (tmp_path / "steps.log").read_text()  # not one step trained


def test_periodic_checkpoints_bound_what_a_killed_run_loses(tmp_path):
    proc = _launch(tmp_path, run_id=1, every=25)
    _wait_step(tmp_path, 60)
    os.killpg(proc.pid, signal.SIGKILL)  # no acknowledgement: the last periodic save counts
    proc.wait(timeout=10)
    saved = _saved(tmp_path)["step"]
    assert saved % 25 == 0 and saved >= 50
    resumed = _launch(tmp_path, run_id=2, every=25)
    assert resumed.wait(timeout=60) == 0
    steps = _logged(tmp_path)
    assert steps[-(300 - saved):] == list(range(saved + 1, 301))  # redone from the save


def test_a_loop_left_early_is_finished_by_its_with_block(tmp_path):
    proc = _launch(tmp_path, run_id=1, mode="leave")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out.split()[:2] == ["finished", "6"]
    assert _saved(tmp_path) == {"step": 6, "total": sum(range(1, 7))}
    assert _progress(tmp_path)["step"] == 6


def test_bad_arguments_are_refused():
    from marbled.worker.loop import StepLoop

    with pytest.raises(ValueError, match="every"):
        StepLoop(object(), every=-1)
