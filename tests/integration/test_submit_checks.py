"""What a new user's mistakes get from a real broker and the real CLI (issue 24, items 3 and
10): a mistyped model is told at submit with the profile's name it is close to, and the
forecast leaves it out saying so; an alias is recorded under the profile's name; a job's name
works wherever its id does; a failed `marbled --detach` says only why it failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.daemon

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]  # no worker protocol
QUICK = ("--suspend-timeout", "0.5", "--kill-timeout", "0.5")  # such jobs stop fast at the end


def marble(daemon, *args: str, module: str = "client_cmd") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"marbled.cli.{module}", *args],
                          env={**os.environ, "MARBLE_STATE_DIR": str(daemon.state_dir)},
                          capture_output=True, text=True, timeout=60)


def test_a_typo_is_told_at_submit_and_left_out_of_the_forecast(daemon_factory):
    daemon = daemon_factory(*QUICK)
    out = marble(daemon, "submit", "--model", "resnt-50", "--steps", "100", "--", *SLEEP)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "submitted job 1: 1 GPU (auto)"
    assert out.stderr.strip() == (
        "note: job 1: model 'resnt-50' is not in profile summit-v100 (did you mean "
        "resnet-50?); it will be explored from 1 GPU (say --new-model if you mean it)")
    # meant: no note, and in the API's answer no note either
    out = marble(daemon, "submit", "--model", "my-net", "--new-model", "--steps", "100",
                 "--json", "--", *SLEEP)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert json.loads(out.stdout)["jobs"][0]["notes"] == []
    (known,) = daemon.submit({"model": "resnet-50", "steps": 100000, "command": SLEEP})
    assert known["notes"] == []

    status = marble(daemon, "status")
    assert status.returncode == 0, status.stderr
    assert "the forecast leaves out job 1 (model 'resnt-50' has no curve yet), job 2 " \
           "(model 'my-net' has no curve yet)" in status.stdout
    forecast = daemon.client.get("/v1/forecast")
    assert [j["id"] for j in forecast["jobs"]] == [3] and forecast["finish_at"] is not None
    assert [j["id"] for j in forecast["left_out"]] == [1, 2]


def test_a_long_queue_left_out_of_the_forecast_is_named_in_part_and_counted(daemon_factory):
    """Plain commands with a fixed count (no model, no steps: the forecast cannot play
    them), many: the forecast names the first 50 and counts them all, so that a poll of a
    queue of 20,000 such jobs does not carry 20,000 reasons; `marble status` says how many."""
    daemon = daemon_factory(*QUICK)
    daemon.submit({"gpus": 6, "command": SLEEP}, *[{"gpus": 1, "command": SLEEP}] * 79)
    forecast = daemon.client.get("/v1/forecast")
    assert forecast["finish_at"] is None and forecast["jobs"] == []
    assert [j["id"] for j in forecast["left_out"]] == list(range(1, 51))
    assert forecast["left_out_count"] == 80
    status = marble(daemon, "status")
    assert status.returncode == 0, status.stderr
    assert "the forecast leaves out job 1 (it has no model and step count to simulate), " \
           "job 2 (it has no model and step count to simulate), job 3 (it has no model " \
           "and step count to simulate) and 77 more" in status.stdout


def test_an_alias_is_recorded_under_the_profiles_name(daemon):
    jobs = daemon.submit({"model": "ResNet50", "steps": 60, "emulate": True},
                         {"model": "resnet_v1_50", "steps": 60, "emulate": True})
    assert [j["model"] for j in jobs] == ["resnet-50", "resnet-50"]
    assert all(j["notes"] == [] for j in jobs)
    daemon.wait_all(timeout=60)
    # the staff's log and what the broker learned: one model, the profile's name
    assert {r["model"] for r in daemon.query("SELECT model FROM jobs")} == {"resnet-50"}
    assert {r["model"] for r in daemon.query("SELECT model FROM samples")} <= {"resnet-50"}
    models = [m["model"] for m in daemon.client.get("/v1/curves")["models"]]
    assert "resnet-50" in models and not {"ResNet50", "resnet_v1_50"} & set(models)


def test_a_jobs_name_works_wherever_its_id_does(daemon_factory):
    daemon = daemon_factory(*QUICK)
    daemon.submit({"gpus": 1, "command": SLEEP, "name": "rel"},
                  {"model": "lenet", "steps": 10**6, "emulate": True, "name": "twin"},
                  {"model": "lenet", "steps": 10**6, "emulate": True, "name": "twin"})
    daemon.wait_for(lambda: all(j["state"] == "running" for j in daemon.jobs()),
                    what="the jobs to run")
    out = marble(daemon, "explain", "rel")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("job 1 (running):")
    out = marble(daemon, "show", "twin", "--json")  # the last job so named, as --after reads
    assert out.returncode == 0 and json.loads(out.stdout)["id"] == 3, out.stderr
    out = marble(daemon, "suspend", "twin")
    assert out.returncode == 0 and "suspend requested for job 3" in out.stdout, out.stderr
    out = marble(daemon, "cancel", "rel", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["cancel requested for job 1",
                                       "cancel requested for job 2"]
    out = marble(daemon, "explain", "nobody")
    assert out.returncode == 1
    assert "no job is named 'nobody' (give a job id or name" in out.stderr
    assert daemon.client.get("/v1/jobs?name=twin")["jobs"][0]["id"] == 2


def test_a_failed_detach_says_only_why(daemon):
    (daemon.state_dir / "marbled.log").open("a").write("an old line of an earlier broker\n")
    out = marble(daemon, "--gpus", "2", "--detach", module="daemon_cmd")
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert lines[0].startswith(f"Error: another marbled (pid {daemon.proc.pid}) is running")
    assert lines[-1].startswith("(marbled exited at start-up with code 1; its log: ")
    assert "an old line" not in out.stderr and "ready on" not in out.stderr
    assert daemon.proc.poll() is None
