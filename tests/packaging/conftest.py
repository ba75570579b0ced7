"""The wheel built once from the checkout, and a fresh venv with it and the broker, shared by
every packaging test (building and installing them is most of the tier's time)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO
from tests.packaging import clean_env, run, venv


def source_copy(dest: Path) -> Path:
    """The checkout's files (tracked, and untracked ones git does not ignore) copied to
    `dest`. The wheel is built there: setuptools builds in the source tree (build/, an
    egg-info), and the checkout is where every other worker's processes run meanwhile (a
    build in it once failed in CI on a file gone from build/lib)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # (a tracked file deleted in the working tree is not)
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    source = source_copy(tmp_path_factory.mktemp("source"))
    built = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                 "--no-build-isolation", source, "-w", out], out, dict(os.environ))
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
