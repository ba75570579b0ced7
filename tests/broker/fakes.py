"""Stand-ins that let a real `Broker` run in the test's own process, in milliseconds.

FAKE: the launcher starts no process (a `FakeRun` is driven by the test: it writes
the worker's protocol files and exits when told) and the clock is advanced by
hand. The broker, its policy, its store (SQLite in memory), its timers and the
protocol files on disk are the real ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import signal
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from marbled.core.model import JobState
from marbled.core.policy import get_policy
from marbled.core.spec import JobSpec
from marbled.daemon.broker import Broker
from marbled.daemon.config import BrokerConfig
from marbled.resources import load_profile
from marbled.store.db import Store, recorded_job
from marbled.worker.protocol import ACK_FILE, PROGRESS_FILE, atomic_write_json


@dataclass
class FakeTimer:
    when: float
    callback: Callable[[], object]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """Time stands still until `advance()`, which fires the timers that come due in order."""

    def __init__(self, start: float = 1_700_000_000.0):
        self.now = start
        self._timers: list[tuple[float, int, FakeTimer]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], object]) -> FakeTimer:
        timer = FakeTimer(max(when, self.now), callback)
        heapq.heappush(self._timers, (timer.when, next(self._seq), timer))
        return timer

    async def advance(self, seconds: float) -> None:
        target = self.now + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            self.now = when
            if not timer.cancelled:
                timer.callback()
                await pump()
        self.now = target
        await pump()


class FullDisk:
    """The ledger's connection, whose commits fail while `full` as SQLite's fail on a full
    disk (the transaction's statements ran; its commit could not be written)."""

    def __init__(self, con: sqlite3.Connection):
        self.con, self.full, self.refused = con, False, 0

    def commit(self) -> None:
        if self.full:
            self.refused += 1
            raise sqlite3.OperationalError("database or disk is full")
        self.con.commit()

    def __getattr__(self, name: str):
        return getattr(self.con, name)


class FakeRun:
    """A run's process as the broker sees it; the test plays the job's part."""

    def __init__(self, request, pid: int, alive: bool = True):
        self.request = request
        self.pid, self.pid_start = pid, 1
        self.signals: list[str] = []
        self._exit: asyncio.Future = asyncio.get_running_loop().create_future()
        if not alive:
            self._exit.set_result(None)  # ended while no broker watched

    @property
    def run_id(self) -> int:
        return int(self.request.env["MARBLE_RUN_ID"])

    @property
    def run_dir(self) -> Path:
        return Path(self.request.env["MARBLE_RUN_DIR"])

    async def wait(self) -> int | None:
        return await self._exit

    def signal(self, sig: int) -> bool:
        if self._exit.done():
            return False
        if sig:
            self.signals.append(signal.Signals(sig).name)
        return True

    def exit(self, code: int | None) -> None:
        self._exit.set_result(code)

    def report(self, step: int, start_step: int = 0, at: float | None = None,
               first_step_at: float | None = None) -> None:
        """A progress report at `at` (now); with `first_step_at`, of a run that trains."""
        atomic_write_json(self.run_dir / PROGRESS_FILE, {
            "run_id": self.run_id, "step": step, "start_step": start_step,
            "time": time.time() if at is None else at,
            "phases": {} if first_step_at is None else {"first_step": first_step_at}},
            durable=False)

    def acknowledge(self, step: int) -> None:
        atomic_write_json(self.run_dir / ACK_FILE, {
            "run_id": self.run_id, "step": step, "time": time.time(), "signalled_at": None},
            durable=False)


@dataclass
class FakeLauncher:
    name: str = "fake"
    runs: list[FakeRun] = field(default_factory=list)
    hold: asyncio.Event | None = None  # set: launches wait until it is set
    fail: OSError | None = None  # set: launches raise it
    adopt_alive: bool = True  # what adopt() finds

    async def launch(self, request) -> FakeRun:
        if self.hold is not None:
            await self.hold.wait()
        if self.fail is not None:
            raise self.fail
        run = FakeRun(request, 1000 + len(self.runs))
        self.runs.append(run)
        return run

    def close(self) -> None:
        pass

    def adopt(self, pid: int, pid_start, run_dir: Path, run_id: int) -> FakeRun:
        env = {"MARBLE_RUN_ID": str(run_id), "MARBLE_RUN_DIR": str(run_dir)}
        run = FakeRun(_AdoptedRequest(env), pid, alive=self.adopt_alive)
        self.runs.append(run)
        return run


@dataclass
class _AdoptedRequest:
    env: dict


def in_loop(test):
    """An async test, run in its own event loop."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return run


async def pump(rounds: int = 20) -> None:
    """Let the broker's tasks run until they wait on something the test controls."""
    for _ in range(rounds):
        await asyncio.sleep(0)


@dataclass
class Harness:
    broker: Broker
    clock: FakeClock
    launcher: FakeLauncher
    store: Store
    task: asyncio.Task

    def submit(self, **doc) -> int:
        (row,) = self.broker.submit([JobSpec.from_mapping(doc)])
        return row.id

    def job(self, job_id: int):
        """The job as the broker holds it, or as the store records it once it has ended and
        left the broker's state."""
        job = self.broker.state.jobs.get(job_id)
        if job is not None:
            return job
        (row,) = self.store.jobs([job_id])
        return replace(recorded_job(row), state=JobState(row.state))

    def events(self, job_id: int) -> list[str]:
        return [e.kind for e in self.store.events(job_id)]

    def runs(self, job_id: int):
        return self.store.runs(job_id)


@contextlib.asynccontextmanager
async def running_broker(state_dir: Path, *, policy: str = "marble", gpus: int = 6,
                         store: Store | None = None, launcher: FakeLauncher | None = None,
                         clock: FakeClock | None = None, options: dict | None = None,
                         **config):
    """A Broker on `gpus` GPUs of one node with the fakes; stopped (as by a crash) at the end."""
    clock = clock or FakeClock()
    launcher = launcher or FakeLauncher()
    store = store or Store(None)
    settings = {"monitor_interval": 1.0, "suspend_timeout": 60.0, "kill_timeout": 10.0,
                "prestart": "off", "retry_delay": 30.0,
                "coalesce_s": 0.0,  # a quiet period is real time: `pump` would not wait it
                **config}
    cfg = BrokerConfig(state_dir=state_dir, nodes={"n0": tuple(map(str, range(gpus)))},
                       book=load_profile(), profile_ref="summit-v100", broker_node="n0",
                       **settings)
    broker = Broker(cfg, store, launcher, get_policy(policy, **(options or {})), clock)
    broker.recover()
    task = asyncio.get_running_loop().create_task(broker.run())
    await pump()
    try:
        yield Harness(broker, clock, launcher, store, task)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
