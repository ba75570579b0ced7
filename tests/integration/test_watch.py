"""`marble watch` in a real terminal (tmux): it shows the jobs and the GPUs, updates, and
quits cleanly on q, leaving the terminal as it was."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.conftest import require_debian

pytestmark = pytest.mark.daemon

LONG = 200_000


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", "marbled-test", *args], capture_output=True,
                          text=True, timeout=10, check=True).stdout


def pane() -> str:
    return tmux("capture-pane", "-p", "-t", "watch")


def wait_pane(predicate, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while True:
        screen = pane()
        if predicate(screen) or time.monotonic() > deadline:
            return screen
        time.sleep(0.2)


def test_watch_shows_the_jobs_updates_and_quits_on_q(daemon_factory, tmp_path):
    require_debian("tmux")
    daemon = daemon_factory("--no-learn")
    daemon.submit({"model": "resnet-50", "steps": LONG, "emulate": True, "name": "alpha"},
                  {"model": "inception-v3", "steps": LONG, "emulate": True, "name": "beta"},
                  {"model": "vgg-16", "steps": 1000, "emulate": True, "name": "gamma"})
    done = tmp_path / "exit"
    command = (f"MARBLE_STATE_DIR={daemon.state_dir} {sys.executable} -m "
               f"marbled.cli.client_cmd watch --interval 0.3; echo $? > {done}; sleep 30")
    tmux("new-session", "-d", "-s", "watch", "-x", "150", "-y", "40", command)
    try:
        first = wait_pane(lambda s: "A alpha" in s and "gpu5" in s)
        for text in ("A alpha", "B beta", "C gamma", "running", "queued", "secondary",
                     "gpu0", "gpu5", "queue ends in ~", "q or Ctrl-C: quit"):
            assert text in first, f"{text!r} not on the screen:\n{first}"
        step = [line for line in first.splitlines() if "A alpha" in line][0]
        later = wait_pane(lambda s: [line for line in s.splitlines() if "A alpha" in line]
                          != [step])
        assert [line for line in later.splitlines() if "A alpha" in line] != [step]  # updates
        tmux("send-keys", "-t", "watch", "q")
        deadline = time.monotonic() + 10
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert done.read_text().strip() == "0"
        assert "A alpha" not in pane()  # the alternate screen is gone: the shell is back
    finally:
        subprocess.run(["tmux", "-L", "marbled-test", "kill-server"], capture_output=True,
                       env={**os.environ})


def test_a_view_reads_the_window_not_every_job_ever(daemon):
    """--window: a view reads the live jobs and those that ended within the window
    (`?since=`), not every job the broker has seen; one that ended before it is not shown."""
    daemon.submit({"command": ["true"], "gpus": 1, "name": "early-bird"})
    daemon.wait_all()
    time.sleep(2.5)
    daemon.submit({"command": ["sleep", "600"], "gpus": 1, "name": "sleepy"})
    daemon.wait_for(lambda: any(j["state"] == "running" for j in daemon.jobs()),
                    what="the second job to run")

    def view(window: str) -> str:
        out = subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", "--state-dir",
                              str(daemon.state_dir), "watch", "--once", "--window", window],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "sleepy" in view("2") and "early-bird" not in view("2")
    assert "early-bird" in view("3600")  # ended seconds ago: within the default hour
