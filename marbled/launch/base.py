"""The launcher interface the broker uses; one implementation per way of starting processes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class LaunchRequest:
    argv: tuple[str, ...]
    env: dict[str, str]  # added to the broker's environment
    node: str
    devices: tuple[str, ...]  # device names for CUDA_VISIBLE_DEVICES
    cwd: Path
    stdout: Path
    stderr: Path
    # A multi-node run's further nodes and their devices (the same count on each)
    others: tuple[tuple[str, tuple[str, ...]], ...] = ()


class RunHandle(Protocol):
    pid: int
    pid_start: int | None  # process start time, to tell a live process from a reused pid

    async def wait(self) -> int:
        """The exit code; minus the signal number if a signal ended the run."""
        ...

    def signal(self, sig: int) -> bool:
        """Send `sig` to the whole run (its process group); False if it is gone."""
        ...


class Launcher(Protocol):
    name: str

    async def launch(self, request: LaunchRequest) -> RunHandle: ...

    def adopt(self, pid: int, pid_start: int | None, run_dir: Path, run_id: int) -> RunHandle:
        """A handle on a run an earlier broker launched (process `pid`, started at `pid_start`)."""
        ...
