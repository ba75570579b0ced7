"""The packaging tier: the wheel as users install it. Helpers for its tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def clean_env(tmp: Path) -> dict[str, str]:
    """What a user's shell would have: no PYTHONPATH, no state directory of ours."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MARBLE_", "VIRTUAL_ENV", "PYTHON"))}
    env["HOME"] = str(tmp)  # the default state directory lands there, not in ~
    return env


def run(argv: list, cwd: Path, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def venv(path: Path, env: dict) -> Path:
    made = run([sys.executable, "-m", "venv", path], path.parent, env)
    assert made.returncode == 0, made.stderr
    return path / "bin"
