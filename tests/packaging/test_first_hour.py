"""A new user's first hour, from the wheel installed into a fresh venv, in a project directory
outside the checkout: a real script submitted by a relative path, a typo in a model's name
and its warning, a failure seen in `marble status`, `marble logs -f`, `marble report
--png`, a variable of the user's shell carried to a job, `cancel` of several jobs with one
ended, a 50,000-job file, and `status`, `logs` and `explain` after `marble shutdown`. Real
broker, processes, signals and SQLite; only the GPUs are emulated."""

from __future__ import annotations

import json

import pytest

from tests.packaging import clean_env, run

pytestmark = pytest.mark.packaging

# A user's own training script: reads its data by a relative path, trains under the worker
# library's loop (checkpoint, suspend, resume), prints a line per step.
TRAIN = '''
import json, os, sys, time
from pathlib import Path
from marbled.worker.loop import StepLoop

class Checkpoint:
    def __init__(self):
        self.path = Path(os.environ["MARBLE_CHECKPOINT_DIR"]) / "state.json"
        self.saved_step = None
    def restore(self):
        if not self.path.exists():
            return 0
        self.saved_step = json.loads(self.path.read_text())["step"]
        return self.saved_step
    def save(self, step):
        self.path.write_text(json.dumps({"step": step}))
        self.saved_step = step

lr = float(Path("data/lr.txt").read_text())
with StepLoop(Checkpoint()) as run:
    for step in run.steps():
        time.sleep(0.02)
        print(f"step {step} lr {lr}", flush=True)
'''


def test_a_new_users_first_hour(broker_venv, tmp_path):
    env = clean_env(tmp_path)
    env["MARBLE_STATE_DIR"] = str(tmp_path / "state")
    env["PATH"] = f"{broker_venv}:{env['PATH']}"  # the venv activated: `python` is its own
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text(TRAIN)
    (project / "data" / "lr.txt").write_text("0.1\n")

    def marble(*args: str, check: bool = True):
        done = run([broker_venv / "marble", *args], project, env, timeout=120)
        assert not check or done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    up = run([broker_venv / "marbled", "--gpus", "2", "--detach"], project, env)
    assert up.returncode == 0 and "ready" in up.stdout, up.stderr
    try:
        typo = marble("submit", "--model", "resnt-50", "--steps", "40", "--name", "mine",
                      "--", "python", "train.py")
        assert "submitted job 1 (mine): 1 GPU" in typo.stdout
        assert "model 'resnt-50' is not in profile" in typo.stderr
        assert "did you mean resnet-50?" in typo.stderr and "--new-model" in typo.stderr

        broken = marble("submit", "--gpus", "1", "--name", "broken", "--", "python",
                        "missing.py")
        assert "submitted job 2 (broken)" in broken.stdout

        followed = marble("logs", "-f", "mine")  # exits 0 once the job is done
        steps = [line for line in followed.stdout.splitlines() if line.startswith("step ")]
        assert steps[0] == "step 1 lr 0.1" and steps[-1] == "step 40 lr 0.1"

        waited = marble("wait", "--timeout", "60", check=False)
        assert waited.returncode == 1  # one job failed
        status = marble("status")
        assert "job 2 (broken) failed" in status.stdout
        assert "1 failed, 1 done" in status.stdout
        shown = json.loads(marble("show", "mine", "--json").stdout)
        assert shown["state"] == "done" and shown["chdir"] == str(project)
        assert shown["model"] == "resnt-50"  # what the user asked for, explored as new
        failed = json.loads(marble("show", "broken", "--json").stdout)
        assert failed["state"] == "failed"
        err = marble("logs", "broken", "--stderr")
        assert "missing.py" in err.stdout

        png = tmp_path / "first-hour.png"
        reported = marble("report", "--png", str(png))
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", reported.stdout

        # a variable of the user's shell, set after marbled started, reaches the job
        env["WANDB_PROJECT"] = "first-hour"
        marble("submit", "--gpus", "1", "--name", "envcheck", "--", "sh", "-c",
               "echo project=$WANDB_PROJECT")
        assert "project=first-hour" in marble("logs", "-f", "envcheck").stdout.splitlines()

        # cancel of several: the ended one is reported, the others are cancelled
        for name in ("long1", "long2"):
            marble("submit", "--gpus", "2", "--name", name, "--", "sleep", "600")
        cancelled = marble("cancel", "mine", "long1", "long2", check=False)
        assert cancelled.returncode == 1 and "has already ended (done)" in cancelled.stderr
        assert marble("wait", "--timeout", "60", check=False).returncode == 1  # all ended
        states = {j["name"]: j["state"] for j in json.loads(marble(
            "status", "--all", "--json").stdout)["jobs"]}
        assert states["long1"] == states["long2"] == "cancelled"

        # a sweep of 50,000 jobs from one file, each waiting for a gate that never opens
        gate = marble("submit", "--gpus", "1", "--name", "gate", "--", "sleep", "600")
        assert "submitted job" in gate.stdout
        sweep = tmp_path / "sweep.yaml"  # its jobs never run (the gate never opens)
        sweep.write_text("".join(
            f"- {{name: lr{i}, gpus: 1, after: gate, command: python train.py --lr {i}}}\n"
            for i in range(50_000)))
        big = marble("submit", "--file", str(sweep))
        assert big.stdout.count("submitted job") == 50_000, big.stderr[-2000:]
        assert json.loads(marble("status", "--json", "--limit", "1").stdout)["broker"][
            "jobs"]["queued"] == 50_000
    finally:
        down = marble("shutdown", check=False)
    assert "marbled stopped" in down.stdout

    # after the broker stopped: its records answer the commands that read
    offline = marble("status", "--all")
    assert "no broker is running" in offline.stderr and "long1" in offline.stdout
    assert "project=first-hour" in marble("logs", "envcheck").stdout.splitlines()
    assert "it has ended: done" in marble("explain", "mine").stdout
    # the job's own files stayed in the state directory, none in the project
    assert sorted(p.name for p in project.iterdir()) == ["data", "train.py"]
