"""`marble wait` and the long poll it makes (GET /v1/wait), on a real broker over its
socket: answered as the last job ends, whatever ended it (a plain command's exit, an
emulated job's last step, a failure, a cancel), on several nodes; a wait that times out
says so; a drain answers a held wait at once and is not held by it; a broker killed under
a wait leaves `marble wait` to say so from the records (exit 3)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from marbled.cli.client import ApiError, BrokerClient
from marbled.paths import socket_path

pytestmark = pytest.mark.daemon


def marble(state_dir, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", *args],
                          env={**os.environ, "MARBLE_STATE_DIR": str(state_dir)},
                          capture_output=True, text=True, timeout=120, **kw)


def long_client(daemon) -> BrokerClient:
    return BrokerClient(socket_path(daemon.state_dir), timeout=120)


def held(client: BrokerClient, path: str) -> tuple[threading.Thread, dict]:
    """GET `path` in a thread: (the thread, {'answer' | 'error', 'at': time it came})."""
    got: dict = {}

    def get() -> None:
        try:
            got["answer"] = client.get(path)
        except Exception as exc:  # noqa: BLE001 (the test reads it)
            got["error"] = exc
        got["at"] = time.time()

    thread = threading.Thread(target=get)
    thread.start()
    return thread, got


def test_the_wait_ends_as_the_last_job_ends_on_two_nodes(daemon_factory):
    """Two emulated nodes of 2 GPUs: a plain command on a fixed count of 2, an emulated
    job on `auto`, a plain command that fails. The wait holds while they run and is
    answered within a moment of the last end (the old `marble wait` polled every
    --interval: 30 s in the batch scripts), with the counts of all three."""
    d = daemon_factory("--nodes", "2", gpus=2)
    d.submit({"command": ["sleep", "1.5"], "gpus": 2},
             {"model": "resnet-50", "steps": 300, "emulate": True},
             {"command": ["sh", "-c", "sleep 0.5; exit 3"], "gpus": 1})
    began = time.time()
    answer = long_client(d).get("/v1/wait?timeout=60")
    answered = time.time()
    assert answer["ended"] is True and answer["draining"] is False
    assert answer["jobs"] == {"done": 2, "failed": 1}
    last_end = d.query("SELECT max(ended_at) AS t FROM runs")[0]["t"]
    assert answered - began >= 1.4  # it held until the 1.5 s command had ended
    assert 0 <= answered - last_end < 2.0, (answered, last_end)
    assert {r["node"] for r in d.runs()} == {"node0", "node1"}  # both nodes ran jobs

    out = marble(d.state_dir, "wait", "--json")
    assert out.returncode == 1, out.stderr  # one job failed
    assert sorted(j["state"] for j in json.loads(out.stdout)["jobs"]) == \
        ["done", "done", "failed"]
    assert "3/3 ended  done=2 failed=1" in out.stderr


def test_a_cancel_ends_a_held_wait_and_a_timeout_says_not_ended(daemon):
    (job,) = daemon.submit({"command": ["sleep", "600"], "gpus": 1})
    client = long_client(daemon)
    began = time.monotonic()
    answer = client.get("/v1/wait?timeout=0.3")
    assert answer["ended"] is False and answer["jobs"] in ({"running": 1}, {"queued": 1})
    assert 0.3 <= time.monotonic() - began < 5

    out = marble(daemon.state_dir, "wait", "--timeout", "0.5")
    assert out.returncode == 2 and "timed out after 0.5 s with 1 jobs not ended" in out.stderr

    thread, got = held(client, "/v1/wait?timeout=60")
    time.sleep(0.3)
    cancelled = time.time()
    client.post(f"/v1/jobs/{job['id']}/cancel")
    thread.join(timeout=30)
    assert got["answer"]["ended"] is True and got["answer"]["jobs"] == {"cancelled": 1}
    assert got["at"] - cancelled < 5  # the plain command's stop, then the answer


@pytest.mark.parametrize("timeout", ["-1", "300.5", "abc", "nan", ""])
def test_a_bad_timeout_is_refused_with_what_to_change(daemon, timeout):
    with pytest.raises(ApiError) as refused:
        daemon.client.get(f"/v1/wait?timeout={timeout}")
    assert refused.value.status == 400 and refused.value.field == "timeout"
    assert "seconds from 0 to 300" in str(refused.value)


def test_a_drain_answers_a_held_wait_at_once_and_stops_without_waiting_for_it(daemon):
    """The server waits for its requests when it stops: a long poll held to its 300 s would
    keep a drained broker alive. The drain answers it (draining, not ended) instead."""
    daemon.submit({"command": ["sleep", "600"], "gpus": 1})
    daemon.wait_for(lambda: daemon.jobs()[0]["state"] == "running", what="the job to run")
    thread, got = held(long_client(daemon), "/v1/wait?timeout=300")
    time.sleep(0.3)
    stopping = time.time()
    daemon.proc.send_signal(signal.SIGTERM)
    thread.join(timeout=60)
    assert got["answer"]["ended"] is False and got["answer"]["draining"] is True, got
    assert got["at"] - stopping < 10
    assert daemon.proc.wait(timeout=60) == 75  # a job is left for the next broker
    assert time.time() - stopping < 30


def test_marble_wait_says_so_when_its_broker_is_killed_under_it(daemon):
    """kill -9 while the long poll is held: the connection closes unanswered, and `marble
    wait` reads the records: the job is not ended (exit 3), no traceback."""
    daemon.submit({"model": "resnet-50", "steps": 200_000, "emulate": True})
    waiter = subprocess.Popen([sys.executable, "-m", "marbled.cli.client_cmd", "--state-dir",
                               str(daemon.state_dir), "wait"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    daemon.wait_for(lambda: daemon.jobs()[0]["step"] > 0, what="the job's first steps")
    time.sleep(0.3)  # the wait is held by now
    daemon.proc.kill()
    daemon.proc.wait(timeout=30)
    _, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 3, err
    assert "the broker stopped without draining (killed, or it failed: its log says " \
           "which) with 1 of 1 jobs not ended" in err, err
    assert "Traceback" not in err


def test_a_wait_for_named_jobs_ends_as_they_end_while_others_run(daemon):
    """`marble wait JOB...` (ids or names) and `GET /v1/wait?job=`: answered as the jobs
    named have ended, a fixed-count plain command and an emulated one on `auto`, while a
    third runs on; a job that does not exist is a 404, and a name no job has says so."""
    first, second, _ = daemon.submit(
        {"command": ["sleep", "1"], "gpus": 2, "name": "prepare"},
        {"model": "resnet-50", "steps": 200, "emulate": True},
        {"command": ["sleep", "600"], "gpus": 1, "name": "server"})
    out = marble(daemon.state_dir, "wait", "prepare", str(second["id"]), "--json")
    assert out.returncode == 0, out.stderr
    assert [(j["id"], j["state"]) for j in json.loads(out.stdout)["jobs"]] == \
        [(first["id"], "done"), (second["id"], "done")]
    assert "2/2 ended  done=2" in out.stderr
    answer = daemon.client.get(f"/v1/wait?timeout=0&job={first['id']}&job={first['id']}")
    assert answer == {"ended": True, "jobs": {"done": 1}, "draining": False,
                      "cannot_run": {}}
    assert daemon.client.get("/v1/wait?timeout=0")["ended"] is False  # the server runs on

    with pytest.raises(ApiError) as missing:
        daemon.client.get("/v1/wait?timeout=5&job=999")
    assert missing.value.status == 404 and "no job 999" in str(missing.value)
    with pytest.raises(ApiError) as bad:
        daemon.client.get("/v1/wait?job=0")
    assert bad.value.status == 400 and bad.value.field == "job"
    out = marble(daemon.state_dir, "wait", "no-such-name")
    assert out.returncode == 1 and "no job is named 'no-such-name'" in out.stderr


def test_a_wait_for_more_jobs_than_a_request_names_goes_in_parts(daemon):
    """A request line holds 300 ids (of up to 18 digits): the API refuses more, saying to
    name none (every job); `marble wait` waits for more 300 at a time, and its counts and
    exit status are those of them all (a failure in the first part: exit 1), while a job
    it was not asked about runs on."""
    from marbled.api.openapi import MAX_WAIT_JOBS
    from marbled.cli.client import MAX_WAIT_JOBS as CLIENTS

    assert CLIENTS == MAX_WAIT_JOBS  # the client's copy (it does not import the API's)
    query = "&".join(f"job={i}" for i in range(1, MAX_WAIT_JOBS + 2))
    with pytest.raises(ApiError) as refused:
        daemon.client.get(f"/v1/wait?timeout=0&{query}")
    assert refused.value.status == 400 and "name none" in str(refused.value)
    # names, not ids, and too many of them: a request line past aiohttp's 8 KiB default,
    # refused by the handler in JSON as documented (not by the HTTP parser, in plain text)
    names = "&".join(f"job=a-name-where-an-id-goes-{i:04d}" for i in range(MAX_WAIT_JOBS + 1))
    assert len(names) > 8190
    with pytest.raises(ApiError) as refused:
        daemon.client.get(f"/v1/wait?timeout=0&{names}")
    assert refused.value.status == 400 and refused.value.field == "job"
    daemon.submit({"command": ["sleep", "600"], "gpus": 1})
    jobs = daemon.submit({"command": ["false"], "gpus": 1},
                         *[{"command": ["true"], "gpus": 1}] * MAX_WAIT_JOBS)
    out = marble(daemon.state_dir, "wait", "--json", *(str(j["id"]) for j in jobs))
    assert out.returncode == 1, out.stderr
    assert "301/301 ended  done=300 failed=1" in out.stderr, out.stderr
    views = json.loads(out.stdout)["jobs"]
    assert [j["id"] for j in views] == [j["id"] for j in jobs]
    assert [j["state"] for j in views] == ["failed"] + ["done"] * MAX_WAIT_JOBS


def test_submit_wait_returns_as_its_jobs_end_with_their_exit_status(daemon_factory):
    """`marble submit --wait` (sbatch --wait, hq submit --wait), on two nodes: a plain
    command on a fixed count returns 0 once it is done, one that fails returns 1, while a
    job submitted before runs on; `--file --wait --json` prints one JSON document, the
    file's jobs (an emulated one on `auto`, a plain one on 2 GPUs) as they ended."""
    d = daemon_factory("--nodes", "2", gpus=2)
    d.submit({"command": ["sleep", "600"], "gpus": 1, "name": "server"})
    out = marble(d.state_dir, "submit", "--gpus", "2", "--wait", "--", "sh", "-c",
                 "sleep 0.3; echo trained")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("submitted job 2: 2 GPUs (fixed)"), out.stdout
    assert "1/1 ended  done=1" in out.stderr
    assert d.client.get("/v1/jobs/2")["state"] == "done"
    out = marble(d.state_dir, "submit", "--wait", "--gpus", "1", "--", "false")
    assert out.returncode == 1 and "1/1 ended  failed=1" in out.stderr, out.stderr

    jobs = d.state_dir.parent / "jobs.yaml"
    jobs.write_text("- {model: resnet-50, steps: 200, emulate: true}\n"
                    "- {command: [sh, -c, 'sleep 0.2'], gpus: 2}\n")
    out = marble(d.state_dir, "submit", "--file", str(jobs), "--wait", "--json")
    assert out.returncode == 0, out.stderr
    views = json.loads(out.stdout)["jobs"]  # one document: the jobs as they ended
    assert [(j["id"], j["state"]) for j in views] == [(4, "done"), (5, "done")]
    assert views[0]["malleable"] and not views[1]["malleable"]
    assert d.client.get("/v1/jobs/1")["state"] == "running"  # the server was not waited for
