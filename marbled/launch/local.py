"""Run jobs as local processes, each in its own session and process group.

The own session keeps a Ctrl-Z in the broker's terminal away from the jobs and
makes the group an orphaned one, where a default-action SIGTSTP is discarded:
a wrapper such as `sh -c` is not stopped by the broker's SIGTSTP, while the
training process, which catches it, checkpoints and exits.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from marbled.launch.base import LaunchRequest


def process_start_time(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


@dataclass
class LocalRun:
    process: asyncio.subprocess.Process
    pid: int
    pid_start: int | None

    async def wait(self) -> int:
        return await self.process.wait()

    def signal(self, sig: int) -> bool:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        return True


class LocalLauncher:
    name = "local"

    async def launch(self, request: LaunchRequest) -> LocalRun:
        env = {**os.environ, **request.env, "CUDA_VISIBLE_DEVICES": ",".join(request.devices)}
        with open(request.stdout, "ab") as out, open(request.stderr, "ab") as err:
            proc = await asyncio.create_subprocess_exec(
                *request.argv,
                cwd=request.cwd,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        return LocalRun(proc, proc.pid, process_start_time(proc.pid))

