"""`marble status`, `show`, `explain`, `logs` and `schedule` after the broker has stopped:
they read the records it left in the state directory (read-only), and say so once.

A real broker runs an emulated job and a plain command that prints to stdout and stderr
to their end; the commands' answers then are compared with what the same commands give
once it has stopped (`marble shutdown`), read by the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.daemon

EMULATED = {"model": "resnet-50", "steps": 200, "emulate": True}
PRINTER = {"gpus": 1, "name": "printer", "command": ["sh", "-c", "echo hello; echo oops >&2"]}
NOTE = "marble: no broker is running; read the records it left in"

# each command, and whether its text is the live one's whole (status: but for its first line)
COMMANDS = (["status", "--all"], ["status"], ["show", "1"], ["show", "printer"],
            ["explain", "1"], ["explain", "printer"], ["logs", "printer"],
            ["logs", "printer", "--stderr"], ["logs", "1", "--all-runs"],
            ["logs", "printer", "-f"], ["schedule"])
AS_JSON = (["show", "1"], ["show", "printer"], ["explain", "1"], ["logs", "printer"],
           ["logs", "printer", "--stderr", "--all-runs"], ["schedule"])


def marble(state_dir, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", "--state-dir",
                           str(state_dir), *args], capture_output=True, text=True, timeout=60,
                          **kw)


def listing(state_dir) -> dict[str, tuple[int, int]]:
    """Every file under the state directory, with its size and modification time."""
    out = {}
    for top, dirs, files in os.walk(state_dir):
        for name in dirs + files:
            path = os.path.join(top, name)
            info = os.lstat(path)
            out[os.path.relpath(path, state_dir)] = (info.st_size, info.st_mtime_ns)
    return out


def test_read_commands_answer_from_the_records_once_the_broker_has_stopped(daemon):
    daemon.submit(EMULATED, PRINTER)
    daemon.wait_all()
    pid = daemon.proc.pid
    live = {tuple(c): marble(daemon.state_dir, *c) for c in COMMANDS}
    live_json = {tuple(c): marble(daemon.state_dir, *c, "--json") for c in AS_JSON}
    live_status = json.loads(marble(daemon.state_dir, "status", "--all", "--json").stdout)
    for done in [*live.values(), *live_json.values()]:
        assert done.returncode == 0 and not done.stderr, done
    assert live[("logs", "printer")].stdout == "hello\n"
    assert live[("logs", "printer", "--stderr")].stdout == "oops\n"
    stop = marble(daemon.state_dir, "shutdown")
    assert stop.returncode == 0, stop.stderr
    assert daemon.proc.wait(timeout=30) == 0
    before = listing(daemon.state_dir)

    began = time.monotonic()
    for command, was in live.items():
        now = marble(daemon.state_dir, *command)
        assert now.returncode == 0, (command, now.stderr)
        assert now.stderr.count(NOTE) == 1 and now.stderr.count("\n") == 1, now.stderr
        assert str(daemon.state_dir) in now.stderr and "(as of " in now.stderr
        if command[0] == "status":  # no broker: no GPU is free, the rest as it was
            head, _, rest = now.stdout.partition("\n")
            assert head == f"marbled {pid} policy=marble profile=summit-v100 vm: 6 GPUs"
            assert rest == was.stdout.partition("\n")[2], command
        else:
            assert now.stdout == was.stdout, command
    for command, was in live_json.items():
        now = marble(daemon.state_dir, *command, "--json")
        assert now.returncode == 0 and now.stderr.count(NOTE) == 1, (command, now.stderr)
        assert json.loads(now.stdout) == json.loads(was.stdout), command

    status = json.loads(marble(daemon.state_dir, "--json", "status", "--all").stdout)
    for key in ("jobs", "ended", "failed", "more"):
        assert status[key] == live_status[key], key
    broker, was = status["broker"], live_status["broker"]
    assert broker["pid"] == pid and broker["running"] is False and broker["as_of"]
    assert broker["nodes"] == {"vm": {"gpus": was["nodes"]["vm"]["gpus"], "free": None}}
    for key in set(broker) - {"nodes", "started_at", "running", "as_of"}:
        assert broker[key] == was[key], key
    # what only a live broker has: the requests it takes (none are taken now)
    assert set(was) - set(broker) <= {"max_request_bytes", "max_jobs_per_request"}
    assert status["forecast"]["jobs"] == [] and status["forecast"]["finish_at"] is None

    refused = marble(daemon.state_dir, "cancel", "1")  # a request needs a broker
    assert refused.returncode == 1 and "no broker" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    missing = marble(daemon.state_dir, "show", "9")  # the records' own refusal
    assert missing.returncode == 1 and "refused (404): no job 9" in missing.stderr
    assert missing.stderr.count(NOTE) == 1
    assert listing(daemon.state_dir) == before, "the records were written to"
    assert time.monotonic() - began < 60


def test_a_broker_that_answers_with_an_error_is_not_read_past(daemon):
    """Only a broker that is not there sends the commands to the records: a refusal of a
    running broker is the answer."""
    daemon.submit(PRINTER)
    daemon.wait_all()
    for command in (["show", "7"], ["explain", "7"], ["logs", "7"], ["logs", "printer",
                                                                     "--run", "99"]):
        done = marble(daemon.state_dir, *command)
        assert done.returncode == 1 and "refused (404)" in done.stderr, done.stderr
        assert NOTE not in done.stderr
    assert NOTE not in marble(daemon.state_dir, "status").stderr


def test_no_records_no_broker_is_the_error_it_was(tmp_path):
    done = marble(tmp_path / "none", "status")
    assert done.returncode == 1 and "no broker listens on" in done.stderr, done.stderr
    assert not (tmp_path / "none").exists()


def test_wait_ends_with_a_note_when_the_broker_drains_and_the_records_show_the_jobs(daemon):
    """A batch script's normal end when jobs are left: the broker drains (the allocation
    ends, a shutdown) while `marble wait` waits. It says so and exits 3, no error; the
    records then show the suspended job, and `logs -f` of it does not wait for ever."""
    daemon.submit({"model": "resnet-50", "steps": 200_000, "emulate": True})
    waiter = subprocess.Popen(
        [sys.executable, "-m", "marbled.cli.client_cmd", "--state-dir",
         str(daemon.state_dir), "wait", "--interval", "0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    daemon.wait_for(lambda: daemon.jobs()[0]["step"] > 0, what="the job's first steps")
    assert marble(daemon.state_dir, "shutdown").returncode == 0
    _, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 3, err
    assert "the broker stopped (it drained) with 1 of 1 jobs not ended" in err, err
    assert "Error" not in err
    shown = marble(daemon.state_dir, "status")
    assert shown.returncode == 0 and shown.stderr.count(NOTE) == 1
    assert " suspended " in shown.stdout.splitlines()[2], shown.stdout
    followed = marble(daemon.state_dir, "logs", "1", "-f")
    assert followed.returncode == 1 and followed.stderr.count(NOTE) == 1, followed.stderr


def test_records_of_a_broker_killed_while_a_job_ran_say_so(daemon):
    """kill -9: the records end with the job running (its run open, the database with its
    -wal file); they are read as they are, and nothing is settled."""
    daemon.submit({"model": "resnet-50", "steps": 3000, "emulate": True})
    daemon.wait_for(lambda: daemon.jobs()[0]["step"] > 0, what="the job's first steps")
    daemon.stop(signal.SIGKILL)
    shown = marble(daemon.state_dir, "status")
    assert shown.returncode == 0 and shown.stderr.count(NOTE) == 1, shown.stderr
    assert " running " in shown.stdout.splitlines()[2], shown.stdout
    said = marble(daemon.state_dir, "explain", "1")
    assert said.returncode == 0, said.stderr
    assert said.stdout.splitlines()[1] == (
        f"  it was running when its broker stopped without draining: a marbled started on "
        f"{daemon.state_dir} settles its run")
    assert "run 1: primary" in marble(daemon.state_dir, "show", "1").stdout
    run = json.loads(marble(daemon.state_dir, "schedule", "--json").stdout)["runs"][0]
    assert run["end"] is None and run["why"] == "running"


def test_submit_does_not_import_the_offline_reader():
    done = subprocess.run(
        [sys.executable, "-c", "import sys; import marbled.cli.jobs, marbled.cli.logs, "
         "marbled.cli.session; print('marbled.cli.offline_api' in sys.modules)"],
        capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
