"""`python -I -S supervise.py STATUS_FD [--step] ARGV...`: the process of every local run
(and every step command), which starts ARGV and records how it ended where the next broker
finds it.

The broker that started a run may be gone when the run ends (a `kill -9`, a crash): the
next broker adopts the run, but the run is not its child, so the exit status is not its
to see. This process is: the leader of the run's own session and process group (as the
run's process was before), it starts ARGV as its child in that group, waits for it,
writes `{"run_id", "code", "at", "pid"}` to the run's exit file (`exit_file`: in
MARBLE_RUN_DIR, named by MARBLE_RUN_ID) durably, and exits as the child
did: with its code, or killed by the same signal. `code` is what the broker's outcome
reads (`core/outcome.py`): the exit code, or minus the signal that ended the child.

- It forwards nothing: the broker signals the whole group (`signal_run`), so the child
  gets every signal itself. This process outlives SIGTERM, SIGINT, SIGHUP and SIGTSTP
  (Python handlers, installed before the child starts: the child's exec resets them, so
  the child gets the default action; a signal this process inherited as ignored stays
  ignored, for the child too, as it would without it). SIGKILL ends it: no exit file
  then, as for a run the broker kills, which the broker sees end itself.
- With STEP_FLAG before ARGV, ARGV is a batch system's step command (srun, jsrun): the
  broker's host runs it, it lives as long as the step does, and its exit is the step's,
  which the file records as step_exit_code reads it. A step that ends while no broker
  watches is then known too, on any node and with any number of tasks.
- STATUS_FD: a pipe to the broker, closed once ARGV runs; if ARGV cannot be started, the
  errno is written to it first and the broker raises the OSError a direct start would.
- A prestarted process (MARBLE_STANDBY_FILE, no MARBLE_RUN_ID yet) learns its run from its
  go file, read by a thread while the child waits for it; a cancelled one records
  nothing.

It runs before every run's command: the standard library's built-in modules only, run by
path with -I -S (no site, no user paths), so that it starts in a few milliseconds. Not
`signal`, whose import (enum, functools, collections) took longer than the interpreter's
own start: `_signal`, the built-in it wraps, has the same functions and numbers.
"""

import _signal as signal  # `signal` without its enums: see above
import os
import sys
import time

STANDBY_VAR = "MARBLE_STANDBY_FILE"  # as marbled.worker.protocol names it
STEP_FLAG = "--step"  # before ARGV: a step command's exit, as step_exit_code reads it
CAUGHT = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTSTP)


def launch_lock(run_dir: str) -> int:
    """Hold the launch lock of a job's directory (blocking); close the descriptor to let go.

    A shared supervisor holds it while it starts one of the job's runs, and starts none for
    a broker that is gone; a broker that recovers a run whose pid was never recorded holds
    it while it looks for the run's process. So a command its dead broker asked for is
    either found by the next broker, or never started: not started behind its back."""
    import fcntl  # only these two callers lock

    # the job's directory is the lock (flock on its descriptor): no file to create, where
    # a file's creation cost 0.1-0.5 ms of CPU on the ext4 measured (issue 32)
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        raise
    return fd


def step_exit_code(status: int) -> int:
    """A step command's exit as a run's code: srun and jsrun exit with 128+N when signal N
    ended the task, which is -N, as for local runs."""
    return -(status - 128) if 128 < status < 128 + 65 else status


def exit_file_name(run_id: int | str) -> str:
    """The exit file of run `run_id`, in its job's directory."""
    return f"exit-{run_id}.json"


def exit_record(run_id: int | str, code: int, at: float, pid: int) -> str:
    return f'{{"run_id": {int(run_id)}, "code": {int(code)}, "at": {at!r}, "pid": {pid}}}\n'


def write_exit(run_dir: str, run_id: int | str, code: int) -> None:
    """Record run `run_id`'s exit `code` in `run_dir`, durably: it survives the host's crash
    once this returns. Written in place, in one write, not to a temporary file renamed into
    place (a rename a run fewer: 0.03 ms of CPU on the ext4 measured): a record read before
    it is whole (empty, or torn by a kill midway) does not parse, and `read_exit` takes it
    as none, as it took no file. The writers keep that window closed
    to the broker: a shared supervisor reaps the process after this returns, and a broker
    that sees the process as a zombie waits for the record."""
    dfd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = os.open(os.path.join(run_dir, exit_file_name(run_id)),
                     os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, exit_record(run_id, code, time.time(), os.getpid()).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.fsync(dfd)  # the file's name, too
    finally:
        os.close(dfd)


def process_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of `pid`: fields 3 and 22 of
    /proc/PID/stat; None once it is gone (reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def read_exit(run_dir, run_id: int | str) -> int | None:
    """The exit code the run's supervisor recorded (minus the signal that ended it); None if
    it recorded none (it still runs, was killed itself, or never started)."""
    import json

    try:
        with open(os.path.join(run_dir, exit_file_name(run_id))) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or str(doc.get("run_id")) != str(run_id):
        return None
    code = doc.get("code")
    return code if isinstance(code, int) else None


def _go_run_id(go_file: str) -> str | None:
    """The run a go file names; "" when it cancels the standby; None while there is none."""
    try:
        with open(go_file) as f:
            text = f.read()
    except OSError:
        return None
    import json  # only a prestarted process reads a go file

    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    return "" if doc.get("cancel") else str(doc.get("MARBLE_RUN_ID") or "")


def _watch_go(go_file: str, found: list) -> None:
    while not found:
        run_id = _go_run_id(go_file)
        if run_id is not None:
            found.append(run_id)
            return
        time.sleep(0.02)


def _ignore(signum, frame) -> None:
    pass


def exit_as(code: int) -> None:
    """End this process as the child ended: its exit code, or killed by its signal."""
    if code >= 0:
        os._exit(code & 0xFF)
    sig = -code
    if sig in (signal.SIGQUIT, signal.SIGILL, signal.SIGABRT, signal.SIGFPE, signal.SIGSEGV,
               signal.SIGBUS, signal.SIGSYS, signal.SIGTRAP, signal.SIGXCPU, signal.SIGXFSZ):
        import resource  # no core of this process for the child's crash

        resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    try:
        if sig != signal.SIGKILL:  # its action cannot be set, nor need it be
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
    except (OSError, ValueError):
        pass
    os._exit(128 + sig)  # a signal whose default is not to end a process


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: python -I -S supervise.py STATUS_FD [--step] ARGV...")
    status_fd, command = int(argv[0]), argv[1:]
    step = command[0] == STEP_FLAG
    if step:
        command = command[1:]
    caught = [sig for sig in CAUGHT if signal.getsignal(sig) != signal.SIG_IGN]
    for sig in caught:
        signal.signal(sig, _ignore)
    os.set_inheritable(status_fd, False)  # the child must not hold the broker's pipe open
    try:
        # SIGPIPE and SIGXFSZ: Python ignores them; the child gets them at their default, as
        # subprocess's restore_signals gives them
        child = os.posix_spawnp(command[0], command, os.environ, setsigdef=(
            signal.SIGPIPE, signal.SIGXFSZ, *caught))
    except OSError as exc:
        os.write(status_fd, str(exc.errno or 0).encode())
        os._exit(127)
    os.close(status_fd)
    run_dir, run_id = os.environ.get("MARBLE_RUN_DIR"), os.environ.get("MARBLE_RUN_ID")
    go_file = os.environ.get(STANDBY_VAR) if not run_id else None
    found: list = []
    if go_file:
        import _thread

        _thread.start_new_thread(_watch_go, (go_file, found))
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    if go_file:
        if not found:
            found.append(_go_run_id(go_file) or "")
        run_id = found[0]
    if run_dir and run_id:
        try:
            write_exit(run_dir, run_id, step_exit_code(code) if step else code)
        except OSError as exc:  # the run's end is still the broker's to see, if it lives
            os.write(2, f"marbled: cannot record the exit of run {run_id}: {exc}\n".encode())
    exit_as(code)


if __name__ == "__main__":
    main(sys.argv[1:])
