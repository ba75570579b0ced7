"""`marble cancel` and `marble suspend` of several jobs: each one they can, each one they
cannot named with the broker's reason (exit 1); `cancel --all` and `--state`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.daemon


def marble(state_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", *args],
                          env={**os.environ, "MARBLE_STATE_DIR": str(state_dir)},
                          capture_output=True, text=True, timeout=120)


def test_cancel_goes_on_past_a_job_that_has_ended(daemon_factory):
    daemon = daemon_factory()
    (first,) = daemon.submit({"gpus": 1, "command": ["true"]})
    daemon.wait_for(lambda: daemon.client.get(f"/v1/jobs/{first['id']}")["state"] == "done",
                    what="job 1 done")
    daemon.submit({"gpus": 6, "command": ["sleep", "1000"], "name": "long1"},
                  {"gpus": 6, "command": ["sleep", "1000"], "name": "long2"})
    out = marble(daemon.state_dir, "cancel", "1", "long1", "long2", "nosuch")
    assert out.returncode == 1
    assert "job 1 has already ended (done)" in out.stderr
    assert "nosuch: no job is named 'nosuch'" in out.stderr
    assert "cancel requested for job 2" in out.stdout and "cancel requested for job 3" in out.stdout
    assert "cancel requested for 2 jobs; 2 could not be: job 1 has already ended" in out.stderr
    states = daemon.wait_for(lambda: (s := {j["name"]: j["state"] for j in daemon.jobs()})
                             and s["long1"] == s["long2"] == "cancelled" and s,
                             what="long1 and long2 cancelled")
    assert states["long1"] == "cancelled"
    out = marble(daemon.state_dir, "cancel", "1", "2", "--json")
    assert out.returncode == 1
    results = json.loads(out.stdout)["results"]
    assert [(r["id"], r["ok"], r["status"]) for r in results] == [(1, False, 409),
                                                                  (2, False, 409)]


def test_cancel_by_state_and_all(daemon_factory):
    daemon = daemon_factory()
    daemon.submit({"gpus": 6, "command": ["sleep", "1000"], "name": "holder"},
                  *({"gpus": 1, "command": ["sleep", "1000"], "name": f"q{i}"}
                    for i in range(4)))
    daemon.wait_for(lambda: daemon.jobs()[0]["state"] == "running", what="holder running")
    out = marble(daemon.state_dir, "cancel", "--state", "queued")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cancel requested for 4 jobs"
    states = {j["name"]: j["state"] for j in daemon.jobs()}
    assert states == {"holder": "running", **{f"q{i}": "cancelled" for i in range(4)}}
    daemon.submit(*({"gpus": 1, "command": ["sleep", "1000"]} for _ in range(3)))
    out = marble(daemon.state_dir, "cancel", "--all", "--json")
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["requested"]) == 4
    daemon.wait_all(timeout=60)
    assert {j["state"] for j in daemon.jobs()} == {"cancelled"}


def test_cancel_says_what_to_change(daemon_factory):
    daemon = daemon_factory()
    out = marble(daemon.state_dir, "cancel", "--all", "3")
    assert out.returncode == 2 and "give either job ids or names, or --all, not both" \
        in out.stderr
    out = marble(daemon.state_dir, "cancel")
    assert out.returncode == 2 and "give the jobs to cancel (ids or names), or --all" \
        in out.stderr
    out = marble(daemon.state_dir, "cancel", "--all", "--state", "queued")
    assert out.returncode == 2 and "drop --all" in out.stderr


def test_suspend_reports_each_job_it_cannot_suspend(daemon_factory):
    daemon = daemon_factory()
    daemon.submit({"gpus": 6, "command": ["sleep", "1000"]},
                  {"gpus": 1, "command": ["sleep", "1000"], "name": "waiting"})
    out = marble(daemon.state_dir, "suspend", "waiting", "9")
    assert out.returncode == 1
    assert "marble suspend: waiting: job 2 is queued; only a running job can be suspended" \
        in out.stderr, out.stderr
    assert "marble suspend: no job 9" in out.stderr
    assert "suspend requested for 0 jobs; 2 could not be" in out.stderr
