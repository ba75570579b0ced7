"""`marble explain` (and `marble show`) on a real broker: a job that waits behind another, a
secondary, a promoted job, a dependency and a failed job, each with its reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.scenarios import jobset

pytestmark = pytest.mark.daemon

LONG = 200_000  # steps: minutes even at the fixture's time scale, so they are still running


def explain(daemon, job_id: int) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", "explain",
                           str(job_id), "--json"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "MARBLE_STATE_DIR": str(daemon.state_dir)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["reasons"]


def test_every_kind_of_reason(daemon_factory):
    daemon = daemon_factory("--no-learn")
    daemon.submit({"gpus": 1, "command": ["sh", "-c", "echo 'ran out of patience' >&2; exit 3"]})
    daemon.wait_all(timeout=30)
    failed = explain(daemon, 1)
    assert failed[0] == "it has ended: failed"
    assert any("never resized" in line for line in failed)  # a fixed count
    assert any(line.startswith("a run failed: exited with code 3")
               and line.endswith("its stderr ends: ran out of patience") for line in failed)

    daemon.submit(*jobset(3))  # Figure 5: Inception-v3 (job 3) is promoted from 3 to 4 GPUs
    daemon.wait_all(timeout=60)
    promoted = explain(daemon, 3)
    assert "it was promoted from 3 to 4 GPUs at step" in " ".join(promoted)
    assert "suspended 1 time(s): promote" in promoted

    daemon.submit({"model": "resnet-50", "steps": LONG, "emulate": True},  # 5: primary on 3
                  {"model": "inception-v3", "steps": LONG, "emulate": True},  # 6: secondary, 3
                  {"model": "vgg-16", "steps": 1000, "emulate": True, "name": "v"},  # 7: waits
                  {"model": "lenet", "steps": 1000, "emulate": True, "after": ["v"]},  # 8
                  {"model": "alexnet", "steps": 1000, "emulate": True})  # 9: behind 7
    daemon.wait_for(lambda: all(j["state"] == "running" for j in daemon.jobs()[4:6]),
                    timeout=30, what="jobs 5 and 6 running")
    secondary = explain(daemon, 6)
    assert secondary[0].startswith("it runs as secondary on 3 GPUs")
    assert any(line.startswith("on its 3 GPUs it trains at") for line in secondary)
    assert "it aims for 4 GPUs: its profile's optimum" in secondary
    assert any("it is promoted (suspended and resumed on more GPUs) when they free up" in line
               for line in secondary)
    waiting = explain(daemon, 7)
    assert waiting[0] == ("it is next in the FIFO and needs 5 GPUs on one node; the most free "
                          "on a node is 0")
    assert any(line.startswith("the next run to end is job 5's") for line in waiting)
    assert any(line.startswith("it should start in about") for line in waiting)
    dependent = explain(daemon, 8)
    assert dependent[0] == "it waits for job 7 (queued)"
    behind = explain(daemon, 9)
    assert behind[0] == "it waits in the FIFO behind 1 eligible job(s)"

    shown = subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", "show", "8"],
                           capture_output=True, text=True, timeout=30,
                           env={**os.environ, "MARBLE_STATE_DIR": str(daemon.state_dir)})
    assert "why:\n  it waits for job 7 (queued)" in shown.stdout  # the same reasons
