"""`marble profile`: a model's throughput curve and costs, measured by running it.

For each GPU count, one after another (so they do not disturb each other's
timing), the training command runs as a run of the worker protocol -- a local
process, or under Slurm a job step, through the same launchers as the broker --
with frequent progress reports. The steps after the warm-up are cut into
windows, each a throughput measurement; the median is the count's figure and
the windows' spread how far to trust it. Then the run is asked to suspend
(SIGTSTP, its checkpoint, its acknowledgement, its exit): what that took is the
suspend cost. Once, at the first count, the run is started again from that
checkpoint and timed to its first step: the start-up cost (import, build,
restore). The result is a profile entry, merged into a profile file.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from marbled.batch.base import Launcher, LaunchRequest
from marbled.core.measure import fill_curve, training_point, window_rates
from marbled.core.target import gpus_text
from marbled.worker.protocol import (
    ACK_FILE,
    PROGRESS_FILE,
    SUSPEND_FILE,
    atomic_write_json,
    read_json,
)

WINDOWS = 5
REPORT_INTERVAL = 0.05  # seconds between the job's progress reports while it is profiled


class ProfileRunError(RuntimeError):
    """A run of the command that cannot be measured (it failed, or made no progress)."""


@dataclass
class CountResult:
    gpus: int
    steps_per_second: float  # the median window, in profiled steps per second
    spread: float  # (max - min) / median of the windows
    windows: list[float]
    startup_s: float | None  # launch -> first step, fresh
    suspend_s: float | None  # SIGTSTP -> exit
    wall_s: float  # what measuring this count took

    def as_dict(self) -> dict:
        return {"gpus": self.gpus, "steps_per_second": self.steps_per_second,
                "spread": self.spread, "windows": self.windows, "startup_s": self.startup_s,
                "suspend_s": self.suspend_s, "wall_s": self.wall_s}


@dataclass
class Profiling:
    model: str
    command: tuple[str, ...]
    counts: list[int]
    steps: int = 100  # steps timed after the warm-up, at each count (more while too few
    # reports have come to time its windows)
    warmup: int = 10
    time_scale: float = 1.0  # real seconds per profiled second (emulated jobs)
    timeout: float = 1800.0  # per count
    results: list[CountResult] = field(default_factory=list)
    resume_s: float | None = None  # launch -> first step from a checkpoint
    chdir: Path = field(default_factory=Path.cwd)  # where the command runs: as for a job

    def curve(self) -> list[float]:
        return fill_curve({r.gpus: r.steps_per_second for r in self.results},
                          max(r.gpus for r in self.results))


class Profiler:
    def __init__(self, launcher: Launcher, node: str, devices: tuple[str, ...], workdir: Path,
                 progress: Callable[[str], None] = lambda line: None):
        self.launcher, self.node, self.devices = launcher, node, devices
        self.workdir, self.say = Path(workdir), progress

    async def run(self, job: Profiling) -> Profiling:
        for g in job.counts:
            if g > len(self.devices):
                raise ProfileRunError(f"{g} GPUs asked for, {self.node} has "
                                      f"{len(self.devices)}")
            job.results.append(await self._count(job, g, resume=g == job.counts[0]))
        return job

    async def _count(self, job: Profiling, g: int, resume: bool) -> CountResult:
        began = time.monotonic()
        run_dir = self.workdir / job.model / f"{g}-gpus"
        (run_dir / "checkpoint").mkdir(parents=True, exist_ok=True)
        target = job.warmup + job.steps
        handle, points, progress = await self._launch(job, g, run_dir, 1, target + 10 * job.steps)
        launched = time.time()
        while True:  # until the steps after the warm-up are timed
            progress = read_json(run_dir / PROGRESS_FILE) or progress
            point = training_point(progress) if progress.get("run_id") == 1 else None
            if point and (not points or point.step > points[-1].step):
                points.append(point)
                self.say(f"{job.model} on {gpus_text(g)}: step {point.step}/{target}")
            # past the steps asked, and with a report for each window's edge: a loaded node
            # may read the first report after the warm-up only past the target
            if point and point.step >= target and \
                    sum(p.step >= job.warmup for p in points) > WINDOWS:
                break
            if not handle.signal(0):
                raise ProfileRunError(f"the command ended at step "
                                      f"{points[-1].step if points else 0} of {target} on {g} "
                                      f"GPUs; its stderr ends:\n{_tail(run_dir / 'stderr.log')}")
            if time.monotonic() - began > job.timeout:
                handle.signal(signal.SIGKILL)
                raise ProfileRunError(f"no {target} steps on {gpus_text(g)} within {job.timeout} s")
            await asyncio.sleep(0.02)
        suspend_s = await self._suspend(handle, run_dir, 1, job.time_scale)
        phases = (read_json(run_dir / PROGRESS_FILE) or progress).get("phases", {})
        startup = (phases["first_step"] - phases.get("launch", launched)) / job.time_scale \
            if "first_step" in phases else None
        if resume:
            job.resume_s = await self._resume(job, g, run_dir)
        rates = [r * job.time_scale for r in window_rates(points, job.warmup, WINDOWS)]
        if not rates:
            raise ProfileRunError(f"too few progress reports on {g} GPUs to time; give more "
                                  "--steps")
        mid = statistics.median(rates)
        return CountResult(g, mid, (max(rates) - min(rates)) / mid, rates, startup, suspend_s,
                           time.monotonic() - began)

    async def _launch(self, job: Profiling, g: int, run_dir: Path, run_id: int, steps: int):
        for name in (ACK_FILE, PROGRESS_FILE, SUSPEND_FILE):
            (run_dir / name).unlink(missing_ok=True)
        env = {"MARBLE_JOB_ID": "0", "MARBLE_RUN_ID": str(run_id), "MARBLE_RUN_DIR": str(run_dir),
               "MARBLE_CHECKPOINT_DIR": str(run_dir / "checkpoint"), "MARBLE_GPUS": str(g),
               "MARBLE_MODEL": job.model, "MARBLE_TARGET_STEPS": str(steps),
               "MARBLE_LAUNCH_TIME": repr(time.time()),
               "MARBLE_REPORT_INTERVAL": str(REPORT_INTERVAL)}
        request = LaunchRequest(job.command, env, self.node, self.devices[:g], run_dir,
                                run_dir / "stdout.log", run_dir / "stderr.log", cwd=job.chdir)
        try:
            handle = await self.launcher.launch(request)
        except OSError as exc:
            raise ProfileRunError(f"cannot start {job.command[0]!r}: "
                                  f"{exc.strerror or exc}") from None
        return handle, [], {}

    async def _suspend(self, handle, run_dir: Path, run_id: int, scale: float) -> float | None:
        """SIGTSTP (and the request file) -> the acknowledgement and the exit; seconds."""
        asked = time.time()
        atomic_write_json(run_dir / SUSPEND_FILE, {"run_id": run_id, "at": asked}, durable=False)
        handle.signal(signal.SIGTSTP)
        try:
            await asyncio.wait_for(handle.wait(), 120.0)
        except TimeoutError:
            handle.signal(signal.SIGKILL)
            return None
        ack = read_json(run_dir / ACK_FILE)
        return (time.time() - asked) / scale if ack and ack.get("run_id") == run_id else None

    async def _resume(self, job: Profiling, g: int, run_dir: Path) -> float | None:
        """Start again from the checkpoint; launch -> first step, then stop it."""
        handle, _, _ = await self._launch(job, g, run_dir, 2, 10**9)
        deadline = time.monotonic() + job.timeout
        while time.monotonic() < deadline and handle.signal(0):
            progress = read_json(run_dir / PROGRESS_FILE) or {}
            phases = progress.get("phases", {})
            if progress.get("run_id") == 2 and "first_step" in phases:
                await self._suspend(handle, run_dir, 2, job.time_scale)
                return (phases["first_step"] - phases["launch"]) / job.time_scale
            await asyncio.sleep(0.02)
        handle.signal(signal.SIGKILL)
        return None


def gpu_name(devices: tuple[str, ...], emulated: bool) -> str:
    """What the curve was measured on: the GPU's name (NVML), else what stood in for one."""
    if emulated:
        return "emulated (GPU ids only, no GPU: the job ran on the CPU)"
    try:
        import pynvml  # the optional 'nvml' extra

        pynvml.nvmlInit()
        try:
            first = devices[0] if devices else "0"
            handle = (pynvml.nvmlDeviceGetHandleByIndex(int(first)) if first.isdigit()
                      else pynvml.nvmlDeviceGetHandleByUUID(first))
            name = pynvml.nvmlDeviceGetName(handle)
            return name.decode() if isinstance(name, bytes) else name
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML, no GPU: the job ran on what it found
        return "cpu (no GPU the profiler could name)"


def profile_entry(job: Profiling, system: str, gpu: str, batch_size: int | None) -> dict:
    """The model's profile entry, with where its figures came from."""
    startups = [r.startup_s for r in job.results if r.startup_s is not None]
    suspends = [r.suspend_s for r in job.results if r.suspend_s is not None]
    entry: dict = {"steps_per_second": [round(v, 6) for v in job.curve()]}
    startup = job.resume_s if job.resume_s is not None else (
        statistics.median(startups) if startups else None)
    if startup is not None:
        entry["startup_s"] = round(startup, 3)
    if suspends:
        entry["suspend_s"] = round(statistics.median(suspends), 3)
    entry["measured"] = {
        "by": "marble profile", "system": system, "gpu": gpu,
        "host": socket.gethostname(), "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "command": list(job.command), "batch_size": batch_size,
        "steps_timed": job.steps, "warmup_steps": job.warmup,
        "counts": {r.gpus: {"steps_per_second": round(r.steps_per_second, 6),
                            "spread": round(r.spread, 4), "startup_s": _round(r.startup_s),
                            "suspend_s": _round(r.suspend_s), "seconds": round(r.wall_s, 1)}
                   for r in job.results},
        "filled": sorted(set(range(1, max(r.gpus for r in job.results) + 1))
                         - {r.gpus for r in job.results}),
    }
    return entry


def _tail(path: Path, lines: int = 10) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(nothing)"


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def merge_into(doc: dict | None, model: str, entry: dict, system: str,
               gpus_per_node: int) -> dict:
    """A profile document with `model`'s entry put in (replacing an older one)."""
    doc = dict(doc or {"system": system, "gpus_per_node": gpus_per_node, "models": {}})
    doc["gpus_per_node"] = max(doc.get("gpus_per_node", 0), len(entry["steps_per_second"]))
    doc["models"] = {**doc.get("models", {}), model: entry}
    return doc

