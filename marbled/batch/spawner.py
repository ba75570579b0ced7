"""The broker's side of its shared supervisor (marbled.batch.shared_supervisor): one
long-lived process that starts the local runs and records their exits.

`Spawner.launch` sends a run's command, environment, directory and logs, and returns a
`SpawnedRun` once the command runs (or raises the OSError that kept it from starting,
as a direct start would). Its `wait` ends with the exit the supervisor reports. The
supervisor is started at the first launch, in its own session; if it dies, the runs it
started are watched through /proc as an adopted run is (their exits then unrecorded),
and the next launch starts another.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from marbled.batch.base import LaunchRequest
from marbled.batch.supervise import process_stat

log = logging.getLogger("marbled")

SHARED_SUPERVISOR = str(Path(__file__).with_name("shared_supervisor.py"))
LOST = object()  # an exit never reported: the supervisor died first


def can_share() -> bool:
    """Whether this host can run the shared supervisor: it watches runs through pidfds."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


@dataclass
class SpawnedRun:
    """A run the shared supervisor started: the leader of its own session and group."""

    pid: int
    pid_start: int | None
    _exit: asyncio.Future = field(repr=False)
    run_dir: Path | None = None
    run_id: int | None = None

    async def wait(self) -> int | None:
        code = await asyncio.shield(self._exit)
        if code is LOST:  # watched as an earlier broker's run would be
            from marbled.batch.local import AdoptedRun

            return await AdoptedRun(self.pid, self.pid_start, self.run_dir, self.run_id).wait()
        return code

    def signal(self, sig: int) -> bool:
        from marbled.batch.local import signal_run

        return signal_run(self.pid, sig)


class Spawner:
    """One shared supervisor per broker (per LocalLauncher)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._buffer = b""
        self._next_id = 0
        self._starts: dict[int, asyncio.Future] = {}  # request id -> its answer
        self._exits: dict[int, asyncio.Future] = {}  # pid -> its exit code

    def _ensure_started(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        ours, theirs = socket.socketpair()
        try:
            self._proc = subprocess.Popen(
                (sys.executable, "-I", "-S", SHARED_SUPERVISOR, str(theirs.fileno())),
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        asyncio.get_running_loop().add_reader(ours.fileno(), self._readable)
        self._sock = ours
        log.debug("shared supervisor %d started", self._proc.pid)
        return ours

    async def launch(self, request: LaunchRequest, env: dict[str, str]) -> SpawnedRun:
        loop = asyncio.get_running_loop()
        sock = self._ensure_started()
        self._next_id += 1
        started = self._starts[self._next_id] = loop.create_future()
        message = {"id": self._next_id, "argv": list(request.argv), "env": env,
                   "cwd": str(request.workdir), "stdout": str(request.stdout),
                   "stderr": str(request.stderr)}
        try:
            await loop.sock_sendall(sock, (json.dumps(message) + "\n").encode())
        except OSError:
            self._lost()
        answer = await started
        run_id = env.get("MARBLE_RUN_ID")
        run_id = int(run_id) if run_id else None
        if answer is LOST:  # it may have started the command before it died
            pid = await asyncio.to_thread(_started_anyway, request, run_id)
            lost = loop.create_future()
            lost.set_result(LOST)
            stat = process_stat(pid)
            return SpawnedRun(pid, stat and stat[1], lost, request.run_dir, run_id)
        if "pid" not in answer:
            errno = answer.get("errno", 0)
            raise OSError(errno, os.strerror(errno), answer.get("filename") or request.argv[0])
        return SpawnedRun(answer["pid"], answer["start"], answer["exit"], request.run_dir,
                          run_id)

    def _readable(self) -> None:
        assert self._sock is not None
        try:
            data = self._sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._lost()
            return
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        for line in lines:
            message = json.loads(line)
            if "id" in message:
                if "pid" in message:  # before its exit can be read: the stream keeps order
                    message["exit"] = self._exits[message["pid"]] = \
                        asyncio.get_running_loop().create_future()
                future = self._starts.pop(message["id"], None)
                if future is not None and not future.done():
                    future.set_result(message)
            else:
                future = self._exits.pop(message["pid"], None)
                if future is not None and not future.done():
                    future.set_result(message["code"])

    def _lost(self) -> None:
        """The supervisor is gone: what it still owed is answered, and the next launch
        starts another."""
        code = self._proc.poll() if self._proc is not None else None
        log.warning("the shared supervisor of local runs ended (exit %s); %d run(s) are "
                    "watched through /proc", code, len(self._exits))
        self.close()
        for future in self._starts.values():
            if not future.done():
                future.set_result(LOST)
        for future in self._exits.values():
            if not future.done():
                future.set_result(LOST)
        self._starts.clear()
        self._exits.clear()

    def close(self) -> None:
        """Stop talking to the supervisor: it records the runs it started to their ends,
        then exits."""
        if self._sock is not None:
            with contextlib.suppress(RuntimeError, ValueError):  # a loop already closed
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None


def _started_anyway(request: LaunchRequest, run_id: int | None) -> int:
    """The pid of a run whose launch a dying supervisor left unanswered, if its command runs
    (found as a broker finds a run it launched just before a crash); else the launch failed."""
    from marbled.batch.local import find_run_process

    pid = find_run_process(str(request.run_dir), run_id) if run_id is not None else None
    if pid is None:
        raise OSError(5, "the shared supervisor of local runs ended during the launch",
                      request.argv[0])
    return pid
