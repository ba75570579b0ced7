"""`marble profile` on the EMULATED training job: it recovers the curve the job emulates, with
its costs, and writes a profile that marbled loads (real processes, signals and files)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from marbled.resources import load_profile

pytestmark = pytest.mark.daemon

SCALE = "0.01"  # the emulated job runs 100x faster than its profile


def profile(tmp_path, model: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "marbled.cli.client_cmd", "profile", "--model", model,
         "--emulated-gpus", "6", "--time-scale", SCALE, "--output", str(tmp_path / "p.yaml"),
         *args, "--", sys.executable, "-m", "marbled.worker.emulate", "--profile",
         "summit-v100", "--time-scale", SCALE], capture_output=True, text=True, timeout=300,
        cwd=tmp_path)


def test_profiler_recovers_the_emulated_curve_within_3_percent(tmp_path):
    out = profile(tmp_path, "inception-v3", "--steps", "150", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    truth = load_profile("summit-v100").lookup("inception-v3")
    measured = {c["gpus"]: c["steps_per_second"] for c in result["counts"]}
    assert sorted(measured) == [1, 2, 3, 4, 5, 6]
    for g, v in measured.items():
        assert v == pytest.approx(truth.throughput(g), rel=0.03), (g, v)
    learned = load_profile(str(tmp_path / "p.yaml")).lookup("inception-v3")
    # Its curve is flat past 3 GPUs (4 and 6 are 1.2 % apart): two figures each within 3 %
    # may swap the optimum, so what is checked is that the one found trains within 3 % of
    # the best (a loaded CI run measured 6 GPUs once).
    assert truth.optimal_gpus() == 4
    best = truth.throughput(4)
    assert truth.throughput(learned.optimal_gpus()) == pytest.approx(best, rel=0.03)
    assert learned.startup_s > 0 and learned.suspend_s > 0  # measured, in profiled seconds
    assert all(c["suspend_s"] is not None for c in result["counts"])  # every run acknowledged
    assert result["resume_s"] > 0
    entry = result["entry"]["measured"]
    assert entry["gpu"].startswith("emulated") and entry["steps_timed"] == 150
    assert entry["command"][-1] == SCALE


def test_a_second_model_merges_into_the_file_and_marbled_loads_it(tmp_path, daemon_factory):
    assert profile(tmp_path, "resnet-50", "--gpus", "1-3", "--steps", "60").returncode == 0
    out = profile(tmp_path, "vgg-16", "--gpus", "1,2,4", "--steps", "60")
    assert out.returncode == 0, out.stderr
    assert "optimum" in out.stdout and "vgg-16" in out.stdout
    book = load_profile(str(tmp_path / "p.yaml"))
    assert book.models == ["resnet-50", "vgg-16"]
    vgg = book.lookup("vgg-16")
    assert vgg.max_gpus == 4 and vgg.throughput(3) > vgg.throughput(2)  # 3 is filled in
    d = daemon_factory("--profile", str(tmp_path / "p.yaml"))
    (job,) = d.submit({"model": "resnet-50", "steps": 10, "command": ["true"]})
    assert job["demand"] == 3


def test_bad_counts_are_refused_with_what_to_give(tmp_path):
    out = profile(tmp_path, "resnet-50", "--gpus", "2-9")
    assert out.returncode == 2 and "9 GPUs asked for, the node has 6" in out.stderr
    out = profile(tmp_path, "resnet-50", "--gpus", "two")
    assert out.returncode == 2 and "a range such as 1-6" in out.stderr
