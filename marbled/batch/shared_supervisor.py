"""`python -I -S shared_supervisor.py SOCKET_FD`: one supervisor for all of a local broker's
runs (marbled.batch.spawner starts it), in place of an interpreter per run.

What marbled.batch.supervise does for one run, this process does for every run of its
broker: it starts the command, the leader of its own session and process group (the
broker signals that group), and records how the command ended in the run's exit file
(`supervise.write_exit`), where the next broker finds it (lifecycle I2). The broker
saves a fork and an interpreter's start per run; on 2 cores, six interpreters starting at
once held a round of six trivial runs back by about half its time.

- SOCKET_FD: a stream socket to the broker. Requests come as one JSON object a line:
  `{"id", "argv", "env", "cwd", "stdout", "stderr"}`. The answer is `{"id", "pid",
  "start"}` once the command runs (`start`: its start time in /proc), or `{"id", "errno",
  "filename"}` if it cannot start. When a command ends: `{"pid", "code"}`, the exit code or
  minus the signal that ended it.
- The exit file is written before the process is reaped (waitid with WNOWAIT): while a
  broker that adopted the run still sees the process, as a zombie, the record may not be
  there yet; once the process is gone, it is.
- A prestarted process (MARBLE_STANDBY_FILE, no MARBLE_RUN_ID) learns its run from its go
  file, read while the process runs (the broker may write the job's next go file once this
  one is taken), as supervise.py does.
- At the socket's end (its broker exited, or was killed) it goes on until every command
  it started has ended, recording each, then exits: runs outlive their broker. It starts
  a command under its job's launch lock (`supervise.launch_lock`), and none once its
  broker is gone, even one asked for before: the next broker, which looks for a run
  whose pid was never recorded under the same lock, finds it or knows it never ran.
- It runs in its own session: the broker's terminal and its process group reach it not.

It needs pidfds (Linux 5.3), and the standard library only: it is run by path with -I -S,
as supervise.py is, and imports supervise.py from beside it.
"""

import json
import os
import select
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves it out

import supervise  # noqa: E402
from supervise import STANDBY_VAR, _go_run_id, process_stat, write_exit  # noqa: E402

GO_POLL_MS = 20  # how often the go files of prestarted processes are read, as supervise.py


class Child:
    """A command this process started, watched through its pidfd."""

    def __init__(self, proc: subprocess.Popen, env: dict, stderr: str):
        self.proc, self.stderr = proc, stderr
        self.run_dir = env.get("MARBLE_RUN_DIR")
        self.run_id = env.get("MARBLE_RUN_ID") or None
        self.go_file = env.get(STANDBY_VAR) if not self.run_id else None

    def learn_run(self) -> None:
        """A prestarted process's run, once its go file names one ("": cancelled)."""
        if self.go_file and self.run_id is None:
            self.run_id = _go_run_id(self.go_file)

    def record(self) -> int:
        """Record the ended command's exit in its run's exit file, then reap it; its code."""
        info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOWAIT)
        code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        self.learn_run()
        if self.run_dir and self.run_id:
            try:
                write_exit(self.run_dir, self.run_id, code)
            except OSError as exc:  # the run's end is still the broker's to see, if it lives
                _tell_log(self.stderr, f"marbled: cannot record the exit of run {self.run_id}:"
                                       f" {exc}\n")
        self.proc.wait()
        return code


def _tell_log(path: str, text: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError:
        return
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _log(path: str) -> int:
    """A run's log, opened to append; created readable by its owner alone (lifecycle I8)."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


def broker_gone(sock_fd: int) -> bool:
    """Whether the broker's end of the socket is closed (it exited, or was killed), even
    with requests of its still unread."""
    poller = select.poll()
    poller.register(sock_fd, select.POLLRDHUP)
    return any(events & (select.POLLRDHUP | select.POLLHUP) for _, events in poller.poll(0))


def start(request: dict, sock_fd: int) -> tuple[Child | None, dict | None]:
    """Start one request's command, under its job's launch lock, unless its broker is gone
    (then nothing: the next broker finds no process and no record, and runs it again); the
    child (None if it did not start) and the answer."""
    env = request["env"]
    try:
        lock = supervise.launch_lock(env["MARBLE_RUN_DIR"]) if "MARBLE_RUN_DIR" in env else -1
    except OSError:  # no directory (the start fails below and says why), or no locks there
        lock = -1
    try:
        if broker_gone(sock_fd):
            return None, None
        return _start(request, env)
    finally:
        if lock >= 0:
            os.close(lock)


def _start(request: dict, env: dict) -> tuple[Child | None, dict]:
    out = err = -1
    try:
        out, err = _log(request["stdout"]), _log(request["stderr"])
        proc = subprocess.Popen(request["argv"], cwd=request["cwd"], env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)
    except OSError as exc:
        return None, {"id": request["id"], "errno": exc.errno or 0, "filename": exc.filename}
    finally:
        for fd in (out, err):
            if fd >= 0:
                os.close(fd)
    stat = process_stat(proc.pid)  # not reaped yet: there, a zombie at worst
    return (Child(proc, env, request["stderr"]),
            {"id": request["id"], "pid": proc.pid, "start": stat and stat[1]})


def serve(sock_fd: int) -> None:
    poller = select.poll()
    poller.register(sock_fd, select.POLLIN)
    children: dict[int, Child] = {}  # pidfd -> child
    pending, broker = b"", True

    def tell(message: dict) -> None:
        nonlocal broker
        if broker:
            try:
                os.write(sock_fd, (json.dumps(message) + "\n").encode())
            except OSError:  # the broker is gone: its successor reads the exit files
                broker = False

    while broker or children:
        waiting = any(c.go_file and c.run_id is None for c in children.values())
        for fd, _ in poller.poll(GO_POLL_MS if waiting else None):
            if fd == sock_fd:
                try:
                    data = os.read(sock_fd, 1 << 16)
                except OSError:  # ECONNRESET: it died with answers of ours unread
                    data = b""
                if not data:
                    poller.unregister(sock_fd)
                    broker = False
                    continue
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    child, answer = start(json.loads(line), sock_fd)
                    if child is not None:
                        pidfd = os.pidfd_open(child.proc.pid)
                        children[pidfd] = child
                        poller.register(pidfd, select.POLLIN)
                    if answer is not None:
                        tell(answer)
            else:
                child = children.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                tell({"pid": child.proc.pid, "code": child.record()})
        for child in children.values():
            child.learn_run()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -I -S shared_supervisor.py SOCKET_FD")
    serve(int(sys.argv[1]))
