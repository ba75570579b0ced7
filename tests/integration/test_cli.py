"""The `marbled` and `marble` commands as a user runs them: detach, submit, status, show,
schedule, wait, cancel, shutdown, with and without --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.daemon


def run(state_dir, *args: str, module: str = "client_cmd", check: bool = True):
    out = subprocess.run([sys.executable, "-m", f"marbled.cli.{module}", *args],
                         env={**os.environ, "MARBLE_STATE_DIR": str(state_dir)},
                         capture_output=True, text=True, timeout=120)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def test_batch_script_session(tmp_path):
    state = tmp_path / "state"
    out = run(state, "--gpus", "6", "--time-scale", "0.01", "--monitor-interval", "0.1",
              "--detach", module="daemon_cmd")
    assert "ready" in out.stdout
    assert state.stat().st_mode & 0o777 == 0o700
    assert (state / "marbled.sock").stat().st_mode & 0o777 == 0o600
    try:
        out = run(state, "submit", "--model", "resnet-50", "--steps", "300", "--emulate",
                  "--name", "first")
        assert "submitted job 1 (first): 3 GPUs (auto)" in out.stdout
        jobs = tmp_path / "jobs.yaml"
        jobs.write_text("- {model: inception-v3, steps: 400, emulate: true, after: first}\n"
                        "- {command: [sleep, '60'], gpus: 1, name: sleeper}\n")
        out = run(state, "submit", "--file", str(jobs), "--json")
        accepted = json.loads(out.stdout)["jobs"]
        assert [j["id"] for j in accepted] == [2, 3] and accepted[0]["after"] == [1]

        # --all: job 1 (300 emulated steps) may have ended by now on a loaded machine
        status = json.loads(run(state, "status", "--all", "--json").stdout)
        assert status["broker"]["policy"] == "marble" and len(status["jobs"]) == 3
        table = run(state, "status").stdout
        assert "sleeper" in table and "WANT" in table

        run(state, "cancel", "3")
        out = run(state, "wait", "--timeout", "60", check=False)
        assert out.returncode == 1  # one job was cancelled
        assert "3/3 ended" in out.stderr

        shown = json.loads(run(state, "show", "2", "--json").stdout)
        assert shown["state"] == "done" and shown["runs"][0]["role"] == "primary"
        assert any(e["kind"] == "started" for e in shown["events"])
        assert run(state, "show", "3").stdout.count("cancelled") >= 1

        sched = run(state, "schedule").stdout
        assert "gpu0 |" in sched and "A=1 first" in sched
        rows = json.loads(run(state, "schedule", "--json").stdout)["runs"]
        assert {r["job"] for r in rows} == {1, 2, 3}
    finally:
        out = run(state, "shutdown", check=False)
    assert "marbled stopped" in out.stdout
    assert not (state / "marbled.sock").exists()


def test_schedule_is_in_real_seconds_and_profiled_ones_only_for_emulated_jobs(daemon):
    # the daemon fixture runs emulated jobs at --time-scale 0.01
    daemon.submit({"model": "resnet-50", "steps": 300, "emulate": True})
    daemon.wait_all(timeout=60)
    (emulated,) = daemon.runs()
    took = emulated["ended_at"] - emulated["started_at"]
    profiled = json.loads(run(daemon.state_dir, "schedule", "--profiled", "--json").stdout)
    assert profiled["clock"] == "profiled"
    assert profiled["runs"][0]["end"] == pytest.approx(took / 0.01)
    out = run(daemon.state_dir, "schedule", "--profiled").stdout
    assert "times in profiled seconds since the first run started (real / time scale 0.01)" \
        in out and " profiled s\n" in out

    daemon.submit({"gpus": 1, "command": ["sleep", "1"], "name": "sleeper"})
    daemon.wait_all(timeout=60)
    sleeper = daemon.runs()[-1]
    shown = json.loads(run(daemon.state_dir, "schedule", "--json").stdout)
    assert shown["clock"] == "real"
    rows = {r["job"]: r for r in shown["runs"]}
    assert rows[1]["end"] - rows[1]["start"] == pytest.approx(took)
    # the real job's bar is its real duration (it was 100 times that: the 961 to
    # 5,564 s for a job of 460 s)
    assert rows[2]["end"] - rows[2]["start"] == pytest.approx(
        sleeper["ended_at"] - sleeper["started_at"])
    assert rows[2]["start"] == pytest.approx(sleeper["started_at"] - emulated["started_at"])
    out = run(daemon.state_dir, "schedule").stdout
    assert out.startswith("times in real seconds since the first run started\n")
    refused = run(daemon.state_dir, "schedule", "--profiled", check=False)
    assert refused.returncode == 2
    assert "--profiled is for emulated jobs only: job(s) 2 ran a real command, timed in " \
        "real seconds; leave out --profiled" in refused.stderr


def test_second_daemon_on_same_state_dir_is_refused(daemon):
    out = run(daemon.state_dir, "--gpus", "2", module="daemon_cmd", check=False)
    assert out.returncode == 1 and "another marbled" in out.stderr
    assert daemon.proc.poll() is None


def test_client_without_broker_says_how_to_start_one(tmp_path):
    out = run(tmp_path / "nowhere", "status", check=False)
    assert out.returncode == 1 and "start one with 'marbled'" in out.stderr


def test_help_teaches(tmp_path):
    assert "Examples:" in run(tmp_path, "--help", module="daemon_cmd").stdout
    out = run(tmp_path, "submit", "--help").stdout
    assert "--gpus" in out and "never suspended" in out


def test_trace_of_a_real_broker_replays_in_the_simulator(daemon, tmp_path):
    """marble trace: the broker's own log becomes a workload for marble simulate."""
    daemon.submit({"model": "resnet-50", "steps": 200, "emulate": True},
                  {"model": "vgg-16", "steps": 100, "emulate": True},
                  {"gpus": 1, "command": ["true"]})
    daemon.wait_all(timeout=60)
    csv = tmp_path / "history.csv"
    out = run(daemon.state_dir, "trace", str(daemon.state_dir / "marble.db"), "-o", str(csv))
    assert "wrote 2 jobs" in out.stdout and "1 without model or steps" in out.stdout
    out = run(daemon.state_dir, "simulate", "--workload", str(csv), "--json")
    results = json.loads(out.stdout)["results"]
    from marbled.core.policy import POLICIES

    assert {r["policy"] for r in results} == set(POLICIES)
    assert all(r["jobs"] == 2 for r in results)


def test_requests_asked_at_once_answer_as_one_by_one(daemon):
    """`BrokerClient.get_many` (what `marble status` asks, at once): each answer as a
    request of its own gives it, in the order asked; a refusal among them is raised, the
    first in that order; with no broker, BrokerUnreachable."""
    from marbled.cli.client import ApiError, BrokerClient, BrokerUnreachable

    daemon.submit({"command": ["sleep", "30"], "gpus": 1, "name": "one"})
    paths = ["/v1/jobs?name=one", "/v1/jobs/1", "/v1/jobs?state=running&limit=1"]
    together = daemon.client.get_many(paths)
    assert [doc["jobs"][0]["id"] if "jobs" in doc else doc["id"] for doc in together] == [1] * 3
    assert together[0] == daemon.client.get(paths[0])
    with pytest.raises(ApiError) as refused:
        daemon.client.get_many(["/v1/status", "/v1/jobs/99", "/v1/jobs?state=nonsense"])
    assert refused.value.status == 404
    with pytest.raises(BrokerUnreachable):
        BrokerClient(daemon.state_dir / "nowhere.sock").get_many(["/v1/status"])
