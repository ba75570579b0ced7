"""Prestart: the process of a job's next run, started before the job's GPUs are free.

It waits in `JobProtocol.ready()` for its go file, holding no GPU, so its
framework import is off the critical path of a promotion; `take()` hands it the
run (run id, GPUs), `drop()` tells it to exit.

A per-GPU run's process (marbled.batch.ranks) starts the ranks the job is expected to
get, each waiting in ready(); the go then carries the run's nodes and GPUs, from which
that process makes the world size, the rendezvous and each rank's GPUs, and starts or
cancels ranks where the count differs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path

from marbled.batch.base import LaunchRequest, RunHandle
from marbled.worker.protocol import atomic_write_json

log = logging.getLogger("marbled")

@dataclass
class Standby:
    launched: asyncio.Task  # the launch of the waiting process, giving its RunHandle
    go_file: Path
    ranks: int = 0  # a per-GPU run: the ranks started waiting


class Standbys:
    """The waiting processes, at most one per job."""

    def __init__(self, launch: Callable[[LaunchRequest], Coroutine],
                 spawn: Callable[[Coroutine], asyncio.Task],
                 record: Callable[..., None]):
        self._launch, self._spawn, self._record = launch, spawn, record
        self._waiting: dict[int, Standby] = {}
        self._declined: set[int] = set()  # jobs that cannot be prestarted (said once each)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._waiting

    def decline(self, job_id: int, why: str) -> None:
        """The job's next run is launched cold: say why, once per job."""
        if job_id not in self._declined:
            self._declined.add(job_id)
            log.info("%s", why)

    def start(self, job_id: int, go_file: Path, request: LaunchRequest) -> None:
        go_file.unlink(missing_ok=True)
        self._waiting[job_id] = Standby(self._spawn(self._launch(request)), go_file,
                                        request.standby_ranks)
        self._record("prestarted", job_id, **({"ranks": request.standby_ranks}
                                               if request.standby_ranks else {}))

    async def take(self, job_id: int, go: dict) -> RunHandle | None:
        """Hand the run to the job's prestarted process, if it is alive; None otherwise.
        `go`: the run's variables, its first node's `devices`, and `parts` ((node, devices)
        of every node, for a per-GPU run's ranks)."""
        standby = self._waiting.pop(job_id, None)
        if standby is None:
            return None
        try:
            handle = await standby.launched
        except OSError:
            return None
        if not handle.signal(0):
            return None
        devices, parts = go.pop("devices"), go.pop("parts")
        go["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        extra = {}
        if standby.ranks:
            go["parts"] = [[node, list(gpus)] for node, gpus in parts]
            extra = {"ranks": sum(len(gpus) for _, gpus in parts), "prestarted": standby.ranks}
        atomic_write_json(standby.go_file, go)
        self._record("go", job_id, int(go["MARBLE_RUN_ID"]), pid=handle.pid, **extra)
        return handle

    def drop(self, job_id: int) -> None:
        standby = self._waiting.pop(job_id, None)
        if standby is not None:
            atomic_write_json(standby.go_file, {"cancel": True})
            standby.launched.add_done_callback(
                lambda t: t.exception() or t.result().signal(signal.SIGKILL))

    def drop_all(self) -> None:
        for job_id in list(self._waiting):
            self.drop(job_id)

