"""Shared fixtures: a real marbled process on a real Unix socket, with its real SQLite file."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

from marbled.cli.client import BrokerClient, wait_until_serving
from marbled.paths import DB_NAME, socket_path

# The suite does not pass or fail by chance: every property test draws the same examples on
# every run (a random search once failed one run of many on a case no commit had touched).
# HYPOTHESIS_PROFILE=explore draws new ones, to hunt for cases.
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


def _no_local_constants() -> None:
    """Hypothesis also draws the literals of the project's modules loaded so far, so a
    derandomized test drew other examples after other tests (a worker's order differs
    from run to run): that pool stays empty. Private to Hypothesis; if it moves, the draws
    are as Hypothesis makes them."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:
        return
    empty = getattr(providers, "_local_constants", None)
    if empty is not None and hasattr(providers, "_get_local_constants"):
        providers._get_local_constants = lambda: empty


if os.environ.get("HYPOTHESIS_PROFILE", "deterministic") == "deterministic":
    _no_local_constants()

FINAL = {"done", "failed", "cancelled"}
DEBIAN_PACKAGES = Path(__file__).with_name("debian-packages.sh")
TIERS = ("core", "broker", "integration", "frameworks", "slurm", "lsf", "packaging")


# Tests that share one thing run one after another on one pytest-xdist worker (`make test`
# runs the tiers side by side, --dist loadgroup): the packaging tier's one wheel and venv
# (session fixtures), each half of the Slurm tier (commands, pyslurm: at most two
# allocations ask the lab cluster's two nodes at once), and the tests of a module that
# share a module-scoped fixture (a broker's state file, a DDP run), else made once a worker.
def _pyslurm_half(item) -> bool:
    return "/tests/slurm/" in str(item.path) and "[pyslurm" in item.nodeid


def _group(item, tier: str | None) -> str | None:
    if tier == "slurm":
        return "slurm-pyslurm" if _pyslurm_half(item) else "slurm"
    if tier == "packaging":
        return tier
    defs = getattr(item, "_fixtureinfo", None)
    if defs and any(d.scope == "module" for ds in defs.name2fixturedefs.values() for d in ds):
        return item.path.name
    return None


# tryfirst: xdist's own hook reads the groups into the test ids, so it must run after this
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items) -> None:
    """Each test carries its tier's marker (its directory): `pytest -m core`, `-m "not slurm"`."""
    for item in items:
        tier = next((t for t in TIERS if f"/tests/{t}/" in str(item.path)), None)
        if tier:
            item.add_marker(getattr(pytest.mark, tier))
        group = _group(item, tier)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    # without xdist (one process), the Slurm tier's pyslurm half last: its first test waits
    # for pyslurm's build, which `make test` starts beside the run (a stable sort: every
    # other test keeps its place); with it, the largest groups start first
    items.sort(key=_pyslurm_half)


def pytest_collection_finish(session) -> None:
    """On an xdist worker with --dist loadgroup, the groups must be in the test ids (which is
    how xdist schedules them): pytest 9.2 with xdist 3.8 dropped them without a word."""
    if getattr(session.config.option, "loadgroup", False):
        lost = [item.nodeid for item in session.items
                if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
        if lost:  # (xdist shows a worker's exit as an internal error: the reason first)
            why = (f"pytest-xdist did not group {len(lost)} tests (such as {lost[0]}): the "
                   "shared cluster, wheel and module fixtures would be used from several "
                   "workers at once; use the pytest that setup.cfg's test extra names")
            print(why, file=sys.__stderr__, flush=True)
            raise pytest.UsageError(why)


def require_debian(*packages: str) -> None:
    """Install Debian packages a test needs (tests/debian-packages.sh, as root); where that
    is impossible the test is skipped saying why, and in CI (CI set) it fails instead."""
    done = subprocess.run(["bash", str(DEBIAN_PACKAGES), *packages], capture_output=True,
                          text=True, timeout=900)
    if done.returncode != 0:
        reason = f"needs the Debian packages {', '.join(packages)}: {done.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@dataclass
class Daemon:
    state_dir: Path
    proc: subprocess.Popen
    client: BrokerClient

    def submit(self, *jobs: dict) -> list[dict]:
        return self.client.post("/v1/jobs", {"jobs": list(jobs)})["jobs"]

    def jobs(self) -> list[dict]:
        return self.client.get("/v1/jobs")["jobs"]

    def wait_all(self, timeout: float = 60.0) -> list[dict]:
        """Every job, once each has ended: the broker's long poll (GET /v1/wait) answers
        as the last one ends, and at least every second, to see that the broker lives."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            answer = self.client.get(f"/v1/wait?timeout={min(left, 1.0):.3f}")
            if answer["ended"]:
                jobs = self.jobs()
                assert all(j["state"] in FINAL for j in jobs), jobs  # as /v1/wait said
                return jobs
            assert self.proc.poll() is None, self.log()
            if answer["draining"]:  # answered at once: not a loop without a pause
                time.sleep(0.1)
        raise AssertionError(f"jobs not finished after {timeout} s: {self.jobs()}")

    def wait_for(self, predicate, timeout: float = 30.0, what: str = "condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    def query(self, sql: str, *args) -> list[sqlite3.Row]:
        """Read the broker's database directly, as centre staff would."""
        con = sqlite3.connect(self.state_dir / DB_NAME)
        con.row_factory = sqlite3.Row
        try:
            return con.execute(sql, args).fetchall()
        finally:
            con.close()

    def runs(self) -> list[sqlite3.Row]:
        return self.query("SELECT * FROM runs ORDER BY started_at, id")

    def log(self) -> str:
        path = self.state_dir / "marbled.log"
        return path.read_text() if path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)


def start_daemon(state_dir: Path, *args: str, gpus: int | None = 6, time_scale: float = 0.01,
                 env: dict | None = None, log: Path | None = None) -> Daemon:
    """A marbled on `gpus` emulated GPUs; with gpus=None, on what its launcher finds. Its
    log: `log`, else marbled.log in the state directory."""
    state_dir.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "marbled.cli.daemon_cmd", "--state-dir", str(state_dir),
            *(["--gpus", str(gpus)] if gpus else []),
            "--time-scale", str(time_scale), "--monitor-interval", "0.1",
            "--log-level", "debug", *args]
    log = log or state_dir / "marbled.log"
    out = open(log, "ab")  # noqa: SIM115 (the child holds it)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                            env={**os.environ, **(env or {})})
    client = BrokerClient(socket_path(state_dir), timeout=10)
    try:
        wait_until_serving(client, proc, timeout=30)
    except RuntimeError as exc:
        proc.kill()
        raise AssertionError(f"{exc}\n{log.read_text()}") from None
    return Daemon(state_dir, proc, client)

@pytest.fixture
def daemon_factory(tmp_path):
    started: list[Daemon] = []

    def make(*args: str, state_dir: Path | None = None, **kw) -> Daemon:
        d = start_daemon(state_dir or tmp_path / "state", *args, **kw)
        started.append(d)
        return d

    yield make
    for d in started:
        if d.proc.poll() is None:
            d.stop()
    for state_dir in {d.state_dir for d in started}:
        kill_left_runs(state_dir)


def kill_left_runs(state_dir: Path) -> None:
    """End the runs a test's brokers left open: a broker killed with SIGKILL and not
    followed by another leaves its runs alive (a `sleep 600` outlived its test)."""
    from marbled.batch.base import process_start_time

    try:
        with sqlite3.connect(state_dir / DB_NAME) as con:
            rows = con.execute("SELECT pid, pid_start FROM runs WHERE ended_at IS NULL "
                               "AND pid IS NOT NULL").fetchall()
    except sqlite3.Error:
        return
    for pid, start in rows:
        if process_start_time(pid) == start:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def daemon(daemon_factory) -> Daemon:
    return daemon_factory()
