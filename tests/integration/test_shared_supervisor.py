"""The shared supervisor of a local broker's runs (marbled.batch.spawner and
shared_supervisor.py), with real processes and signals: one process starts every plain run,
the leader of its own session and group, and records each exit where a later broker reads
it (lifecycle I2), also once its broker is gone."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from marbled.batch.base import LaunchRequest, process_start_time
from marbled.batch.local import AdoptedRun, LocalLauncher, find_launched_process
from marbled.batch.spawner import SHARED_SUPERVISOR, SpawnedRun, can_share
from marbled.batch.supervise import launch_lock, read_exit, write_exit

pytestmark = pytest.mark.skipif(not can_share(), reason="no pidfds on this host")


def request(tmp_path: Path, *argv: str, run_id: int | None = 7, cwd: Path | None = None,
            **env: str) -> LaunchRequest:
    run_env = {"MARBLE_RUN_DIR": str(tmp_path), **env}
    if run_id is not None:
        run_env["MARBLE_RUN_ID"] = str(run_id)
    return LaunchRequest(argv=argv, env=run_env, node="n1", devices=("0",), run_dir=tmp_path,
                         stdout=tmp_path / "out.log", stderr=tmp_path / "err.log", cwd=cwd)


def parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_one_supervisor_starts_every_run_as_its_own_group_and_records_each_exit(tmp_path):
    async def main():
        launcher = LocalLauncher(shared=True)
        runs = [await launcher.launch(request(
                    tmp_path / str(i), "sh", "-c",
                    f"echo out {i}; echo err {i} >&2; sleep 1; exit {i}", run_id=i))
                for i in range(4) if (tmp_path / str(i)).mkdir() is None]
        assert all(isinstance(r, SpawnedRun) for r in runs)
        # each still runs (1 s): every one is looked at, none left out for having ended
        groups = [(os.getsid(r.pid), os.getpgid(r.pid)) for r in runs]
        supervisors = {parent(r.pid) for r in runs}
        codes = [await r.wait() for r in runs]
        launcher.close()
        return runs, groups, supervisors, codes

    runs, groups, supervisors, codes = asyncio.run(main())
    assert codes == [0, 1, 2, 3]
    assert [read_exit(tmp_path / str(i), i) for i in range(4)] == [0, 1, 2, 3]
    assert all(sid == pgid for sid, pgid in groups)  # each the leader of its own
    assert len(supervisors) <= 1 and os.getpid() not in supervisors  # not the broker's child
    for i in range(4):
        assert (tmp_path / str(i) / "out.log").read_text() == f"out {i}\n"
        assert (tmp_path / str(i) / "err.log").read_text() == f"err {i}\n"
        assert (tmp_path / str(i) / "out.log").stat().st_mode & 0o077 == 0  # lifecycle I8


def test_a_signal_to_the_run_reaches_its_group_and_is_recorded_as_minus_the_signal(tmp_path):
    async def main():
        launcher = LocalLauncher(shared=True)
        run = await launcher.launch(request(tmp_path, "sh", "-c", "sleep 30 & wait"))
        assert run.signal(signal.SIGTERM)
        code = await run.wait()
        launcher.close()
        return code

    assert asyncio.run(main()) == -signal.SIGTERM
    assert read_exit(tmp_path, 7) == -signal.SIGTERM


@pytest.mark.parametrize("argv, cwd, missing", [
    (("no-such-command-here",), None, "no-such-command-here"),
    (("true",), "no-such-dir", "no-such-dir"),
])
def test_a_command_that_cannot_start_raises_as_a_direct_start_would(tmp_path, argv, cwd,
                                                                     missing):
    async def main():
        launcher = LocalLauncher(shared=True)
        try:
            await launcher.launch(request(tmp_path, *argv,
                                          cwd=tmp_path / cwd if cwd else None))
        finally:
            launcher.close()

    with pytest.raises(FileNotFoundError) as raised:
        asyncio.run(main())
    assert Path(raised.value.filename).name == missing
    assert read_exit(tmp_path, 7) is None


def test_runs_outlive_their_broker_and_their_exits_are_still_recorded(tmp_path):
    """The broker lets go (as when it is killed: its end of the socket closes): the
    supervisor records the run's exit when it comes, then exits itself."""
    async def main():
        launcher = LocalLauncher(shared=True)
        run = await launcher.launch(request(tmp_path, "sh", "-c", "sleep 1; exit 4"))
        supervisor = parent(run.pid)
        launcher.close()
        return run, supervisor

    run, supervisor = asyncio.run(main())
    assert read_exit(tmp_path, 7) is None and run.signal(0)  # still running
    assert wait_for(lambda: read_exit(tmp_path, 7) is not None) and read_exit(tmp_path, 7) == 4
    wait_for(lambda: process_start_time(supervisor) is None)  # and then it exits


def test_a_prestarted_process_records_the_run_its_go_file_names(tmp_path):
    go = tmp_path / "go.json"

    async def main():
        launcher = LocalLauncher(shared=True)
        run = await launcher.launch(request(
            tmp_path, "sh", "-c", f"while [ ! -s {go} ]; do sleep 0.05; done; exit 5",
            run_id=None, MARBLE_STANDBY_FILE=str(go)))
        await asyncio.sleep(0.2)
        go.write_text('{"MARBLE_RUN_ID": "12", "CUDA_VISIBLE_DEVICES": "0"}')
        code = await run.wait()
        launcher.close()
        return code

    assert asyncio.run(main()) == 5
    assert read_exit(tmp_path, 12) == 5


def test_a_killed_supervisor_leaves_its_runs_watched_and_the_next_launch_starts_another(
        tmp_path):
    """Nothing records the exit then (as for a killed per-run supervisor): the run is watched
    through /proc to its end, and its code is unknown (None)."""
    async def main():
        launcher = LocalLauncher(shared=True)
        run = await launcher.launch(request(tmp_path, "sh", "-c", "sleep 0.5; exit 4"))
        first = parent(run.pid)
        os.kill(first, signal.SIGKILL)
        code = await run.wait()
        (tmp_path / "b").mkdir()
        again = await launcher.launch(request(tmp_path / "b", "sh", "-c", "sleep 0.5; exit 6",
                                              run_id=8))
        second = parent(again.pid)
        codes = (code, await again.wait())
        launcher.close()
        return codes, first, second

    (lost, code), first, second = asyncio.run(main())
    assert (lost, code) == (None, 6)
    assert read_exit(tmp_path, 7) is None and read_exit(tmp_path / "b", 8) == 6
    assert second != first


def test_an_adopted_run_seen_as_a_zombie_waits_for_its_record(tmp_path):
    """The shared supervisor writes the exit file before it reaps the process: a broker that
    adopted the run and sees it end in between reads the record, not None."""
    pid = os.fork()
    if pid == 0:
        os._exit(9)
    start = wait_for(lambda: (os.stat(f"/proc/{pid}"), Path(f"/proc/{pid}/stat").read_text()
                              .rsplit(")", 1)[1].split()[19])[1])

    def record_then_reap():
        time.sleep(0.5)  # the zombie is seen first
        write_exit(str(tmp_path), 3, 9)
        os.waitpid(pid, 0)

    recorder = threading.Thread(target=record_then_reap)
    recorder.start()
    try:
        code = asyncio.run(AdoptedRun(pid, int(start), tmp_path, 3).wait())
    finally:
        recorder.join()
    assert code == 9


def raw_supervisor() -> tuple[socket.socket, subprocess.Popen]:
    """The shared supervisor with a bare socket in the broker's place."""
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen((sys.executable, "-I", "-S", SHARED_SUPERVISOR,
                             str(theirs.fileno())), pass_fds=(theirs.fileno(),),
                            start_new_session=True)
    theirs.close()
    return ours, proc


def send(sock: socket.socket, run_dir: Path, run_id: int, script: str) -> None:
    run_dir.mkdir(exist_ok=True)
    env = {**os.environ, "MARBLE_RUN_DIR": str(run_dir), "MARBLE_RUN_ID": str(run_id)}
    sock.sendall((json.dumps({"id": run_id, "argv": ["sh", "-c", script], "env": env,
                              "cwd": str(run_dir), "stdout": str(run_dir / "out.log"),
                              "stderr": str(run_dir / "err.log")}) + "\n").encode())


def test_a_broker_killed_with_answers_unread_leaves_the_supervisor_recording(tmp_path):
    """Closing a socket with unread data resets the peer's reads (ECONNRESET): the
    supervisor takes it as its broker's end, not as its own."""
    sock, proc = raw_supervisor()
    send(sock, tmp_path / "1", 1, "sleep 1; exit 4")
    for run_id in (2, 3):
        send(sock, tmp_path / str(run_id), run_id, "exit 0")
    wait_for(lambda: all(read_exit(tmp_path / str(r), r) == 0 for r in (2, 3)))
    sock.close()  # its answers unread, as by a broker killed -9
    assert wait_for(lambda: read_exit(tmp_path / "1", 1)) == 4
    assert proc.wait(timeout=10) == 0


def test_a_command_asked_for_by_a_broker_now_gone_is_never_started(tmp_path):
    """The request is in the socket, but the job's launch lock is held (as by a broker
    recovering the run) until the broker has gone: the supervisor then starts nothing, so
    the next broker rightly finds no process and no record and runs it again."""
    run_dir = tmp_path / "1"
    run_dir.mkdir()
    lock = launch_lock(str(run_dir))
    sock, proc = raw_supervisor()
    try:
        send(sock, run_dir, 1, "echo ran > mark")
        time.sleep(0.3)  # the supervisor has read it and waits for the lock
        sock.close()
    finally:
        os.close(lock)
    assert proc.wait(timeout=10) == 0
    assert not (run_dir / "mark").exists() and read_exit(run_dir, 1) is None
    assert not (run_dir / "out.log").exists()


def test_a_run_whose_pid_was_never_recorded_is_found_under_the_launch_lock(tmp_path):
    async def main():
        launcher = LocalLauncher(shared=True)
        run = await launcher.launch(request(tmp_path, "sleep", "5"))
        found = find_launched_process(str(tmp_path), 7)
        run.signal(signal.SIGKILL)
        await run.wait()
        launcher.close()
        return run.pid, found

    pid, found = asyncio.run(main())
    assert found == pid


def test_a_process_in_the_midst_of_its_exec_is_read_with_its_environment():
    """Right after Popen returns (the exec closed the pipe that says it succeeded), the
    kernel may not have laid out the new environment yet: /proc/PID/environ reads empty
    (144 times in 2,000 here), and find_run_process would pass over the run. It reads the
    environment again until it is there."""
    from marbled.batch.local import _environ

    for _ in range(200):  # about 14 empty first reads expected (144 in 2,000)
        proc = subprocess.Popen(["sleep", "5"], env={"MARBLE_RUN_ID": "7"},
                                start_new_session=True)
        try:
            assert _environ(proc.pid) == b"MARBLE_RUN_ID=7\0"
        finally:
            proc.kill()
            proc.wait()


def test_an_exit_record_that_is_not_whole_reads_as_none(tmp_path):
    """Exit files are written in place, not renamed into place (a rename a run fewer): one
    read before its write, or torn by a kill midway, must read as no record, as no file
    does, never as a code."""
    write_exit(str(tmp_path), 5, 3)
    whole = (tmp_path / "exit-5.json").read_bytes()
    assert read_exit(tmp_path, 5) == 3 and not list(tmp_path.glob(".*"))  # no temporary left
    for torn in (b"", whole[:len(whole) // 2], whole[:-3]):
        (tmp_path / "exit-5.json").write_bytes(torn)
        assert read_exit(tmp_path, 5) is None, torn


def test_the_launch_lock_is_the_job_directory_itself(tmp_path):
    """The lock creates no file in the job's directory, and still excludes: a second holder
    waits until the first lets go."""
    first = launch_lock(str(tmp_path))
    got = threading.Event()

    def second() -> None:
        os.close(launch_lock(str(tmp_path)))
        got.set()

    waiter = threading.Thread(target=second)
    waiter.start()
    try:
        assert not got.wait(0.3) and list(tmp_path.iterdir()) == []
    finally:
        os.close(first)
    assert got.wait(5)
    waiter.join()
