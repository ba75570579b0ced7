"""The wheel built once from the checkout, and a fresh venv with it and the broker, shared by
every packaging test (building and installing them is most of the tier's time)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests import REPO
from tests.packaging import clean_env, run, venv


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    built = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                 "--no-build-isolation", REPO, "-w", out], out, dict(os.environ))
    assert built.returncode == 0, built.stderr
    (whl,) = out.glob("marbled-*.whl")
    return whl


@pytest.fixture(scope="session")
def broker_venv(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel, its broker extra and matplotlib (report --png); its bin/."""
    home = tmp_path_factory.mktemp("broker")
    env = clean_env(home)
    bin_ = venv(home / "broker-venv", env)
    installed = run([bin_ / "pip", "install", "--quiet", f"{wheel}[broker,plot]"], home, env)
    assert installed.returncode == 0, installed.stderr
    return bin_
