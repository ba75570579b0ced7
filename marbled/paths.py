"""Where a broker keeps its files. Standard library only (as is the registry of batch systems
it reads the allocation's id through): every `marble` command reads it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from marbled.batch import ALLOCATION_VARS

SOCKET_NAME = "marbled.sock"
DB_NAME = "marble.db"
LOCK_NAME = "marbled.lock"  # one broker per directory; it holds the broker's pid
TOKEN_NAME = "token"  # with --listen: what a TCP client must show (mode 0600)
ENDPOINT_NAME = "endpoint"  # with --listen: the URL of the TCP listener


def allocation_id() -> str:
    """The batch system's job id (SLURM_JOB_ID, LSB_JOBID, ...), else "local"."""
    for var in ALLOCATION_VARS.values():
        if os.environ.get(var):
            return os.environ[var]
    return "local"


def default_state_dir() -> Path:
    """MARBLE_STATE_DIR, else one directory per allocation under the XDG state home."""
    if os.environ.get("MARBLE_STATE_DIR"):
        return Path(os.environ["MARBLE_STATE_DIR"])
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "marble" / allocation_id()


def socket_path(state_dir: Path) -> Path:
    return Path(state_dir) / SOCKET_NAME


def workdir_problem(path: str) -> str | None:
    """What keeps a job from running in directory `path` (a job's `chdir`), or None."""
    if not os.path.isabs(path):
        return f"'{path}' is not an absolute path (marble submit makes a relative one absolute)"
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        return f"'{path}' {what}; give an existing directory to run the job in"
    if not os.access(path, os.X_OK):
        return f"'{path}' cannot be entered (no search permission)"
    return None


def state_dir_problem(state_dir: Path) -> str | None:
    """Why the existing directory `state_dir` may not hold this user's broker, as ssh refuses
    a key with loose modes: another user owns it, or others may write in it (and so read
    the database and logs, or move the socket away). None if it is fit."""
    info = os.stat(state_dir)
    if info.st_uid != os.geteuid():
        return (f"the state directory {state_dir} belongs to uid {info.st_uid}, not to you "
                f"(uid {os.geteuid()}): its owner could read the jobs and replace the "
                "socket; choose another (MARBLE_STATE_DIR or --state-dir) or remove it")
    loose = stat.S_IMODE(info.st_mode) & 0o022
    if loose:
        who = " and ".join(w for bit, w in ((0o020, "its group"), (0o002, "every user"))
                           if loose & bit)
        return (f"the state directory {state_dir} is writable by {who} (mode "
                f"{stat.S_IMODE(info.st_mode):04o}): they could read the jobs and replace the "
                f"socket; run 'chmod 700 {state_dir}' if you trust what is in it, or choose "
                "another (MARBLE_STATE_DIR or --state-dir)")
    return None
