"""Issue 30 at the door of a real broker: input that cannot run is a 400 naming the field
(I7); a state directory that is not the user's alone is refused, and the broker's files are
0600 (I8); a submission with an Idempotency-Key is made once, however often it is sent (I5)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from marbled.cli.client import BrokerClient, _UnixConnection
from marbled.paths import DB_NAME, socket_path
from tests.conftest import start_daemon

pytestmark = pytest.mark.daemon

SLEEPER = {"gpus": 1, "command": ["sleep", "30"]}


def raw(daemon, body: bytes, headers: dict | None = None) -> tuple[int, dict, dict]:
    conn = _UnixConnection(str(socket_path(daemon.state_dir)), timeout=20)
    try:
        conn.request("POST", "/v1/jobs", body=body,
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}"), dict(resp.getheaders())
    finally:
        conn.close()


def post(daemon, doc, key: str | None = None) -> tuple[int, dict, dict]:
    return raw(daemon, json.dumps(doc).encode(),
               {"Idempotency-Key": key} if key is not None else None)


def marble(daemon, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", "--state-dir",
                           str(daemon.state_dir), *args], capture_output=True, timeout=60)


# ------------------------------------------------------------------ I7


@pytest.mark.parametrize(("doc", "field"), [
    ({**SLEEPER, "command": ["echo", "a\0b"]}, "jobs[0].command"),
    ({**SLEEPER, "command": ["echo", "\ud800"]}, "jobs[0].command"),
    ({**SLEEPER, "command": "echo 'x\0'"}, "jobs[0].command"),
    ({**SLEEPER, "name": "a\0b"}, "jobs[0].name"),
    ({**SLEEPER, "name": "two\nlines"}, "jobs[0].name"),
    ({**SLEEPER, "name": "\x1b[2Jwiped"}, "jobs[0].name"),
    ({**SLEEPER, "chdir": "/tmp/\udcff"}, "jobs[0].chdir"),
])
def test_text_that_cannot_run_is_a_400_naming_the_field(daemon, doc, field):
    # json.dumps writes a lone surrogate as the escape \ud800, as any JSON client may
    status, answer, _ = post(daemon, {"jobs": [doc]})
    assert status == 400, answer
    assert answer["field"] == field and answer["retry"] is False
    assert "remove it" in answer["error"] or "UTF-8" in answer["error"]
    assert daemon.jobs() == []  # nothing was created (not a job that fails later)
    assert daemon.proc.poll() is None


def test_json_nested_too_deep_is_a_400(daemon):
    deep = 200_000
    status, answer, _ = raw(daemon, b"[" * deep + b"]" * deep)
    assert status == 400, answer
    assert answer["field"] == "body" and "too deeply" in answer["error"]
    status, answer, _ = raw(daemon, b'{"jobs": ' + b"[" * deep + b"]" * deep + b"}")
    assert status == 400, answer
    assert daemon.submit(SLEEPER)  # still serving


def test_marble_submit_refuses_what_cannot_run(daemon):
    bad_word = os.fsdecode(b"\xff.py")  # a byte that is not UTF-8: a lone surrogate
    done = marble(daemon, "submit", "--gpus", "1", "--", "python", bad_word)
    assert done.returncode == 2, done
    assert b"COMMAND: word 2" in done.stderr and b"UTF-8" in done.stderr
    done = marble(daemon, "submit", "--gpus", "1", "--name", "a\nb", "--", "true")
    assert done.returncode == 2, done
    assert b"--name:" in done.stderr and b"control character" in done.stderr
    assert daemon.jobs() == []
    done = marble(daemon, "submit", "--gpus", "1", "--name", "réseau ü", "--", "true")
    assert done.returncode == 0 and b"submitted job 1 (r\xc3\xa9seau \xc3\xbc)" in done.stdout


# ------------------------------------------------------------------ I8


def start_refused(state_dir) -> str:
    done = subprocess.run([sys.executable, "-m", "marbled.cli.daemon_cmd", "--state-dir",
                           str(state_dir), "--gpus", "2"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode != 0, done
    return done.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_state_directory_of_another_user_is_refused(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, 65534, 65534)
    said = start_refused(state)
    assert "belongs to uid 65534" in said and "MARBLE_STATE_DIR" in said, said
    assert not (state / DB_NAME).exists()
    assert stat.S_IMODE(state.stat().st_mode) == 0o700 and state.stat().st_uid == 65534


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_state_directory_others_may_write_is_refused(tmp_path, mode):
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, mode)
    said = start_refused(state)
    assert f"chmod 700 {state}" in said and "writable by" in said, said
    assert stat.S_IMODE(state.stat().st_mode) == mode  # not changed behind the user's back
    assert not (state / DB_NAME).exists()


def test_the_brokers_files_are_private(tmp_path):
    state = tmp_path / "state"
    old = os.umask(0o022)  # a usual umask: files 0644 unless made otherwise
    try:
        d = start_daemon(state)
        try:
            d.submit({"gpus": 1, "command": ["true"]})
            d.wait_all()
            for name in (DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm", "marbled.lock"):
                assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name
            for path in (state, state / "jobs"):
                assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
            run_logs = list((state / "jobs").glob("*/run-*.log"))
            assert len(run_logs) == 2  # the run's stdout and stderr
            for path in run_logs:
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        finally:
            d.stop()
        # the detached broker's log too
        log = state / "marbled.log"
        log.unlink()
        done = subprocess.run([sys.executable, "-m", "marbled.cli.daemon_cmd", "--state-dir",
                               str(state), "--gpus", "1", "--detach"], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done
        try:
            assert stat.S_IMODE(log.stat().st_mode) == 0o600
        finally:
            BrokerClient(socket_path(state)).post("/v1/shutdown")
    finally:
        os.umask(old)


# ------------------------------------------------------------------ I5


def test_a_retry_with_the_same_key_makes_no_second_job(daemon):
    status, first, _ = post(daemon, {"jobs": [SLEEPER, SLEEPER]}, key="k-1")
    assert status == 201
    status, again, headers = post(daemon, {"jobs": [SLEEPER, SLEEPER]}, key="k-1")
    assert status == 200 and headers.get("Idempotent-Replayed") == "true"
    assert [j["id"] for j in again["jobs"]] == [j["id"] for j in first["jobs"]]
    assert len(daemon.jobs()) == 2
    # the same key with other jobs: refused, naming the header
    status, answer, _ = post(daemon, {"jobs": [{**SLEEPER, "name": "other"}]}, key="k-1")
    assert status == 409 and answer["field"] == "Idempotency-Key" and not answer["retry"]
    # client_token in the body is the same key
    status, by_token, _ = post(daemon, {"jobs": [SLEEPER, SLEEPER], "client_token": "k-1"})
    assert status == 200 and by_token["jobs"][0]["id"] == first["jobs"][0]["id"]
    status, _, _ = post(daemon, {"jobs": [SLEEPER], "client_token": "k-2"})
    assert status == 201
    status, _, _ = post(daemon, {"jobs": [SLEEPER], "client_token": "k-2"})
    assert status == 200
    assert len(daemon.jobs()) == 3
    status, answer, _ = post(daemon, {"jobs": [SLEEPER], "client_token": "k-3"}, key="k-4")
    assert status == 409 and answer["field"] == "client_token"
    status, answer, _ = post(daemon, {"jobs": [SLEEPER]}, key="has space")
    assert status == 400 and answer["field"] == "Idempotency-Key"


def test_a_retry_while_the_first_is_processed_gets_its_jobs(daemon):
    """Both requests wait in the socket of a stopped broker: the second is answered with the
    first's jobs."""
    answers: list = []

    def send():
        answers.append(post(daemon, {"jobs": [SLEEPER]}, key="same"))

    os.kill(daemon.proc.pid, signal.SIGSTOP)
    try:
        threads = [threading.Thread(target=send) for _ in range(3)]
        for t in threads:
            t.start()
            time.sleep(0.2)
    finally:
        os.kill(daemon.proc.pid, signal.SIGCONT)
    for t in threads:
        t.join(30)
    assert sorted(a[0] for a in answers) == [200, 200, 201]
    assert len({a[1]["jobs"][0]["id"] for a in answers}) == 1
    assert len(daemon.jobs()) == 1


def test_a_key_outlives_a_restart(daemon_factory, tmp_path):
    first = daemon_factory()
    status, answer, _ = post(first, {"jobs": [SLEEPER]}, key="kept")
    assert status == 201
    first.stop()
    again = daemon_factory(state_dir=first.state_dir)
    status, replay, _ = post(again, {"jobs": [SLEEPER]}, key="kept")
    assert status == 200 and replay["jobs"][0]["id"] == answer["jobs"][0]["id"]
    status, _, _ = post(again, {"jobs": [{**SLEEPER, "gpus": 2}]}, key="kept")
    assert status == 409
    assert len(again.jobs()) == 1


def test_the_client_sends_a_submission_again_after_a_timeout(daemon):
    """As issue 30's item 6: the broker stops for longer than the client waits. The client
    sends the same request again with its key; one job is made."""
    said: list[str] = []
    client = BrokerClient(socket_path(daemon.state_dir), timeout=1.0)
    os.kill(daemon.proc.pid, signal.SIGSTOP)
    threading.Timer(2.5, os.kill, (daemon.proc.pid, signal.SIGCONT)).start()
    answer = client.submit({"jobs": [SLEEPER]}, on_retry=said.append)
    assert said and "same Idempotency-Key" in said[0]
    assert len(daemon.jobs()) == 1 and answer["jobs"][0]["id"] == daemon.jobs()[0]["id"]
