"""Start a broker on a state directory: lock it, open the store, serve the API, run the loop."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import json
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from aiohttp import web

from marbled.api.openapi import MAX_REQUEST_LINE
from marbled.api.server import build_app
from marbled.batch.base import Launcher
from marbled.batch.local import LocalLauncher
from marbled.core.policy import Policy
from marbled.core.target import gpus_text
from marbled.daemon.broker import Broker
from marbled.daemon.config import BrokerConfig
from marbled.daemon.gpu_samples import NoNvml, NvmlSampler
from marbled.daemon.planner import plan_beside
from marbled.daemon.views import Views
from marbled.paths import (
    DB_NAME,
    ENDPOINT_NAME,
    LOCK_NAME,
    TOKEN_NAME,
    socket_path,
    state_dir_problem,
)
from marbled.store.damage import DamagedValue, damaged_value
from marbled.store.db import SchemaError, Store

log = logging.getLogger("marbled")

MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the trailing NUL


class StartupError(RuntimeError):
    pass


def prepare_state_dir(state_dir: Path) -> int:
    """Create the directory (0700) and take its lock; returns the lock's file descriptor.
    One that exists must be this user's and writable by no one else (state_dir_problem)."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    problem = state_dir_problem(state_dir)
    if problem:
        raise StartupError(problem)
    os.chmod(state_dir, 0o700)  # this user's own, writable only by them: no longer readable
    if len(str(socket_path(state_dir).absolute())) > MAX_SOCKET_PATH:
        raise StartupError(
            f"state directory path is too long for a Unix socket ({MAX_SOCKET_PATH} bytes "
            "at most with the socket name); choose a shorter --state-dir"
        )
    fd = os.open(state_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.read(fd, 32).decode().strip() or "?"
        os.close(fd)
        raise StartupError(
            f"another marbled (pid {other}) is running on {state_dir}; "
            "stop it with 'marble shutdown' or use another --state-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def private_files(state_dir: Path) -> None:
    """The database exists, and it and its -wal and -shm files are 0600 (SQLite makes the
    -wal and -shm files with the database's mode); the job directories' root is 0700."""
    db = state_dir / DB_NAME
    os.close(os.open(db, os.O_RDWR | os.O_CREAT, 0o600))
    for path in (db, db.with_name(DB_NAME + "-wal"), db.with_name(DB_NAME + "-shm")):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(path, 0o600)
    jobs = state_dir / "jobs"
    with contextlib.suppress(FileExistsError):
        os.mkdir(jobs, 0o700)
    os.chmod(jobs, 0o700)


@contextlib.contextmanager
def _values_read(store: Store) -> Iterator[None]:
    """A value of the store that cannot be read is a start-up error naming it."""
    try:
        yield
    except DamagedValue as exc:
        raise StartupError(damaged_value(store.path, exc)) from None


async def serve(config: BrokerConfig, policy: Policy, gpu_source: str,
                launcher: Launcher | None = None,
                listen: tuple[str, int] | None = None) -> int:
    """Serve until drained; the number of jobs left unfinished (to resume later).

    `listen` (host, port) adds a TCP listener, for clients on other nodes, that takes
    only requests carrying the token this start writes to the state directory.
    """
    launcher = launcher or LocalLauncher()
    traced = _tracemalloc_start()
    lock_fd = prepare_state_dir(config.state_dir)
    try:
        private_files(config.state_dir)
        store = Store(config.state_dir / DB_NAME)
        store.check_whole()
    except SchemaError as exc:  # (StoreDamaged too)
        os.close(lock_fd)
        raise StartupError(str(exc)) from None
    store.set_meta(policy=policy.name, profile=config.book.system,
                   profile_ref=config.profile_ref,
                   nodes=json.dumps(config.nodes), gpu_source=gpu_source,
                   time_scale=config.time_scale, launcher=launcher.name)
    with _values_read(store):
        broker = Broker(config, store, launcher, policy)
    planner = plan_beside(policy, broker.metrics)
    if config.sample_interval > 0 and launcher.name == "local" \
            and not gpu_source.startswith("emulated"):
        try:
            broker.sampler = NvmlSampler(config.nodes[config.broker_node])
        except NoNvml as exc:
            log.info("no GPU samples: %s", exc)
    with _values_read(store):  # (the jobs are read before any run is adopted)
        broker.recover()
    loop = asyncio.get_running_loop()
    draining: list[asyncio.Task] = []

    def shutdown(reason: str = "shutdown") -> None:
        if not draining:
            log.info("draining: %s", reason)
            draining.append(loop.create_task(broker.drain(reason)))

    token = secrets.token_urlsafe(32) if listen else None
    app = build_app(broker, Views(broker), shutdown, token, metrics=broker.metrics)
    runner = web.AppRunner(app, access_log=None, handle_signals=False,
                           max_line_size=MAX_REQUEST_LINE)
    await runner.setup()
    path = socket_path(config.state_dir)
    path.unlink(missing_ok=True)  # we hold the lock, so any socket here is stale
    old_umask = os.umask(0o177)  # the socket is born 0600: no window for other users
    try:
        await web.UnixSite(runner, str(path)).start()
        if listen:
            endpoint = await _listen_tcp(runner, listen, config.state_dir, token)
            log.info("listening on %s (token in %s)", endpoint, config.state_dir / TOKEN_NAME)
    finally:
        os.umask(old_umask)
    # SIGUSR2 is the allocation's end warning (sbatch --signal=B:USR2@SECONDS, forwarded by
    # the batch script); SIGUSR1 is taken by the jobs' acknowledgements.
    for sig, why in ((signal.SIGTERM, "received SIGTERM"), (signal.SIGINT, "received SIGINT"),
                     (signal.SIGUSR2, "the allocation is about to end (SIGUSR2)")):
        loop.add_signal_handler(sig, shutdown, why)
    loop.add_signal_handler(signal.SIGUSR1, broker.runs.check_acks, True)  # a job's ack
    nodes = ", ".join(f"{n}: {gpus_text(len(d))}" for n, d in config.nodes.items())
    log.info("marbled %d ready on %s (%s, policy %s, %s, %s launcher)", os.getpid(), path,
             nodes, policy.name, gpu_source, launcher.name)
    # What start-up made (the modules, the app, the recovered state) lives as long as the
    # broker: out of the collector's sight, a full collection walks only what came since
    # (20,000 submitted jobs: 0.29 s of full collections; benchmarks/README.md, submit_load)
    gc.freeze()
    if config.end_time is not None:
        log.info("the allocation ends at %s: every job is suspended %g s before",
                 time.ctime(config.end_time), config.drain_before)
    try:
        await broker.run()
    finally:
        await runner.cleanup()
        launcher.close()
        if planner is not None:
            planner.shutdown(wait=False, cancel_futures=True)
        for stale in (path, config.state_dir / TOKEN_NAME, config.state_dir / ENDPOINT_NAME):
            stale.unlink(missing_ok=True)
        if broker.sampler:
            broker.sampler.close()
        try:
            broker.ledger.flush()  # what waits for company (a run's pid) is committed too
        except Exception as exc:  # noqa: BLE001 (the store failed: the error is logged)
            log.error("could not commit the last writes: %s", exc)
        store.close()
        os.close(lock_fd)
        _tracemalloc_write(traced)
    left = broker.state.unfinished
    log.info("marbled stopped (%d jobs left for the next broker)", left)
    return left


def _tracemalloc_start() -> str | None:
    """MARBLE_TRACEMALLOC=PATH (benchmarks/soak.py): trace allocations, and write the top
    ones to PATH at exit (`_tracemalloc_write`)."""
    path = os.environ.get("MARBLE_TRACEMALLOC")
    if path:
        import tracemalloc

        tracemalloc.start()
    return path or None


def _tracemalloc_write(path: str | None, top: int = 30) -> None:
    if path:
        import tracemalloc

        stats = tracemalloc.take_snapshot().statistics("lineno")
        with open(path, "w") as f:
            f.write(f"traced {sum(s.size for s in stats) / 2**20:.1f} MiB\n")
            f.writelines(f"{s}\n" for s in stats[:top])


async def _listen_tcp(runner: web.AppRunner, listen: tuple[str, int], state_dir: Path,
                      token: str) -> str:
    """Open the TCP site; write the token and the URL (the umask makes them 0600)."""
    host, port = listen
    await web.TCPSite(runner, host, port).start()
    port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
    shown = socket.gethostname() if host in ("", "0.0.0.0", "::") else host
    endpoint = f"http://{shown}:{port}"
    for name, text in ((TOKEN_NAME, token), (ENDPOINT_NAME, endpoint)):
        (state_dir / name).unlink(missing_ok=True)
        (state_dir / name).write_text(text + "\n")
    return endpoint
