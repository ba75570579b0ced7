"""`marble profile` on real PyTorch and TensorFlow jobs. No GPU here: the profiler hands out
EMULATED GPU ids and the jobs run on the CPU (TensorFlow splits it into logical devices), so
the figures are CPU figures and the profile says so; the curve, costs and file are real."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from marbled.resources import load_profile
from tests import REPO

pytestmark = pytest.mark.daemon
JOBSCRIPTS = REPO / "jobscripts"


@pytest.mark.parametrize(("framework", "script", "extra"), [
    ("torch", "train_torch.py", []),
    ("tensorflow", "train_tf.py", ["--mode", "custom"]),
])
def test_profile_of_a_real_framework_job_on_logical_cpu_devices(tmp_path, framework, script,
                                                                extra):
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed (make test installs it)")
    out = subprocess.run(
        [sys.executable, "-m", "marbled.cli.client_cmd", "profile", "--model", "lenet-cpu",
         "--emulated-gpus", "2", "--steps", "40", "--warmup", "5", "--batch-size", "64",
         "--output", str(tmp_path / "cpu.yaml"), "--json", "--", sys.executable,
         str(JOBSCRIPTS / script), "--arch", "lenet", *extra],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert [c["gpus"] for c in result["counts"]] == [1, 2]
    assert all(c["steps_per_second"] > 0 and c["suspend_s"] is not None
               for c in result["counts"])
    curve = load_profile(str(tmp_path / "cpu.yaml")).lookup("lenet-cpu")
    assert curve.max_gpus == 2 and curve.startup_s > 0.5  # a framework import at least
    assert 0 < curve.suspend_s < 60
    measured = result["entry"]["measured"]
    assert "no GPU" in measured["gpu"] and measured["batch_size"] == 64
