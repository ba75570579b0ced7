"""What a run tells about its model: throughput, start-up and suspend costs (pure).

Jobs report their progress (step, time, and when each start-up phase ended);
the broker keeps the last report of each run it read. From two reports of one
run, after its first step, comes the run's throughput over that window; from the
first step's time, its start-up; from the acknowledgement and the exit, what a
suspension cost. Times are the job's wall clock; `scale` turns them into the
profile's seconds (an emulated job runs `scale` real seconds per profiled one).
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_WINDOW_S = 1.0  # profiled seconds of training a throughput sample covers at least
MIN_STEPS = 2


@dataclass(frozen=True)
class Point:
    """One progress report of a run: `step` reached at `time`."""

    step: int
    time: float


@dataclass(frozen=True)
class Sample:
    kind: str  # 'throughput' (steps/s), 'startup' or 'suspend' (seconds)
    value: float
    gpus: int = 0  # for throughput: the run's GPU count
    share: int = 1


def training_point(progress: dict) -> Point | None:
    """The report as a point of the training phase (None before the first step)."""
    phases = progress.get("phases") or {}
    if "first_step" not in phases or "step" not in progress or "time" not in progress:
        return None
    return Point(int(progress["step"]), float(progress["time"]))


def trains(progress: dict) -> bool:
    """Has the run reported its first step? Until then it is starting up (interpreter,
    imports, restore) and a policy does not reshape it (lifecycle I6)."""
    if "first_step" in (progress.get("phases") or {}):
        return True
    step, start = progress.get("step"), progress.get("start_step")
    return isinstance(step, int) and isinstance(start, int) and step > start


def first_point(progress: dict) -> Point | None:
    """Where the training phase began: the first step, at its time."""
    phases = progress.get("phases") or {}
    start = progress.get("start_step")
    if "first_step" not in phases or start is None:
        return None
    return Point(int(start) + 1, float(phases["first_step"]))


def throughput(since: Point, now: Point, gpus: int, share: int, scale: float
               ) -> Sample | None:
    """Steps per profiled second between two points of one run, if the window is long
    enough to say anything."""
    steps, seconds = now.step - since.step, (now.time - since.time) / scale
    if steps < MIN_STEPS or seconds < MIN_WINDOW_S:
        return None
    return Sample("throughput", steps / seconds, gpus, share)


def startup(progress: dict, scale: float) -> Sample | None:
    """Launch to first step, in profiled seconds (a prestarted run's wait for its go file
    is not start-up: it is counted from the go)."""
    phases = progress.get("phases") or {}
    begin = phases.get("go", phases.get("launch"))
    if begin is None or "first_step" not in phases:
        return None
    return Sample("startup", max(phases["first_step"] - begin, 0.0) / scale)


def suspension(asked_at: float | None, ended_at: float, scale: float) -> Sample | None:
    """SIGTSTP to exit, in profiled seconds."""
    if asked_at is None:
        return None
    return Sample("suspend", max(ended_at - asked_at, 0.0) / scale)


def window_rates(points: list[Point], warmup: int, windows: int) -> list[float]:
    """Steps per second in `windows` consecutive windows of the points after step `warmup`
    (each window a run of points, as equal in steps as the reports allow)."""
    steady = [p for p in points if p.step >= warmup]
    if len(steady) < 2:
        return []
    span = steady[-1].step - steady[0].step
    edges = [steady[0].step + span * k / windows for k in range(windows + 1)]
    rates, start = [], steady[0]
    for edge in edges[1:]:
        end = next((p for p in steady if p.step >= edge), steady[-1])
        if end.step > start.step and end.time > start.time:
            rates.append((end.step - start.step) / (end.time - start.time))
            start = end
    return rates


def fill_curve(measured: dict[int, float], counts: int) -> list[float]:
    """Steps/s on 1..counts GPUs from the counts measured: those as they are, the others from
    the scaling model fitted to them (three counts or more), else by straight lines between
    neighbours (flat beyond the ends)."""
    from marbled.core.learning import fit_scaling, scaled

    coef = fit_scaling(measured)
    known = sorted(measured)
    out = []
    for g in range(1, counts + 1):
        if g in measured:
            out.append(measured[g])
            continue
        fitted = scaled(coef, g) if coef else None
        if fitted is not None:
            out.append(fitted)
            continue
        low = max((k for k in known if k < g), default=None)
        high = min((k for k in known if k > g), default=None)
        if low is None or high is None:
            out.append(measured[low if high is None else high])
        else:
            frac = (g - low) / (high - low)
            out.append(measured[low] + frac * (measured[high] - measured[low]))
    return out
