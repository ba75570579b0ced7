"""The wheel as users install it: built from the checkout, installed into fresh virtual
environments, and used from a directory outside the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO

pytestmark = pytest.mark.packaging


def clean_env(tmp: Path) -> dict[str, str]:
    """What a user's shell would have: no PYTHONPATH, no state directory of ours."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MARBLE_", "VIRTUAL_ENV", "PYTHON"))}
    env["HOME"] = str(tmp)  # the default state directory lands there, not in ~
    return env


def run(argv: list, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    built = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                 "--no-build-isolation", REPO, "-w", out], out, dict(os.environ))
    assert built.returncode == 0, built.stderr
    (whl,) = out.glob("marbled-*.whl")
    return whl


def venv(path: Path, env: dict) -> Path:
    made = run([sys.executable, "-m", "venv", path], path.parent, env)
    assert made.returncode == 0, made.stderr
    return path / "bin"


def test_the_broker_installs_from_the_wheel_and_works_anywhere(wheel, tmp_path):
    env = clean_env(tmp_path)
    bin_ = venv(tmp_path / "broker-venv", env)
    installed = run([bin_ / "pip", "install", "--quiet", f"{wheel}[broker]"], tmp_path, env)
    assert installed.returncode == 0, installed.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = run([bin_ / "python", "-c", "import marbled; print(marbled.__file__)"],
                elsewhere, env)
    assert str(tmp_path / "broker-venv") in where.stdout and str(REPO) not in where.stdout
    sim = run([bin_ / "marble", "simulate", "--workload", "paper-jobset1", "--json"],
              elsewhere, env)
    assert sim.returncode == 0, sim.stderr
    assert {r["policy"] for r in json.loads(sim.stdout)["results"]} >= {"marble", "rigid"}
    state = tmp_path / "state"
    env["MARBLE_STATE_DIR"] = str(state)
    up = run([bin_ / "marbled", "--gpus", "2", "--time-scale", "0.01", "--detach"],
             elsewhere, env)
    assert up.returncode == 0 and "ready" in up.stdout, up.stderr
    try:
        sub = run([bin_ / "marble", "submit", "--emulate", "--model", "resnet-50", "--steps",
                   "50"], elsewhere, env)
        assert sub.returncode == 0 and "submitted job 1" in sub.stdout, sub.stderr
        waited = run([bin_ / "marble", "wait", "--timeout", "60", "--quiet"], elsewhere, env)
        assert waited.returncode == 0, waited.stderr
    finally:
        down = run([bin_ / "marble", "shutdown"], elsewhere, env)
    assert "marbled stopped" in down.stdout


def test_the_worker_alone_installs_without_the_brokers_dependencies(wheel, tmp_path):
    env = clean_env(tmp_path)
    bin_ = venv(tmp_path / "worker-venv", env)
    installed = run([bin_ / "pip", "install", "--quiet", wheel], tmp_path, env)
    assert installed.returncode == 0, installed.stderr
    check = run([bin_ / "python", "-c",
                 "import json, sys; before = set(sys.modules); import marbled.worker.protocol; "
                 "print(json.dumps(sorted({m.split('.')[0] for m in set(sys.modules) - before} "
                 "- set(sys.stdlib_module_names))))"], tmp_path, env)
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout) == ["marbled"]  # the standard library and marbled only
    for module in ("aiohttp", "sqlalchemy", "click", "yaml"):
        missing = run([bin_ / "python", "-c", f"import {module}"], tmp_path, env)
        assert missing.returncode == 1 and "ModuleNotFoundError" in missing.stderr
    hint = run([bin_ / "marbled", "--help"], tmp_path, env)
    assert hint.returncode == 1 and "pip install 'marbled[broker]'" in hint.stderr
    assert "Traceback" not in hint.stderr
