"""How fast a running job trains and when it will end (pure).

A run's speed follows its recent progress: a moving window over its progress reports,
from the point each report names as `since` (the job's newest earlier report at least
`marbled.worker.protocol.RATE_WINDOW_S`, 1 s, old) to the report itself. The window is
1 s, or one report interval where that is longer (MARBLE_REPORT_INTERVAL, 1 s by
default): a job whose speed halves shows it in its next report, where the average since
its first step kept a stale ETA for minutes. No smoothing beyond that: a training step
takes steady time, reports fall on step boundaries, so a window of whole steps measures
the speed it covers exactly; a stall (a checkpoint save) moves the ETA for one report.

The window never reaches back into start-up (start-up is not training). A report without
`since` (a job that writes its progress file itself) is timed from its first step. Before
it has trained for `MIN_WINDOW_S` and `MIN_STEPS`, its curve (on the broker's clock)
stands in. Its end is its last report's time plus the steps left at that speed, so a
report a second old does not move the estimate. All times are the broker's (real)
seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from marbled.core.measure import Point, first_point, throughput, training_point
from marbled.core.profiles import ThroughputCurve


@dataclass(frozen=True)
class Progress:
    rate: float | None  # steps per second (wall clock) of the current run
    source: str | None  # 'measured' (its reports), 'profile' (its curve) or None
    finish_at: float | None  # when the run should reach the job's last step

    def eta(self, now: float) -> float | None:
        """Seconds left, from `now`."""
        return None if self.finish_at is None else max(self.finish_at - now, 0.0)


UNKNOWN = Progress(None, None, None)


def recent_rate(report: dict, first: Point, last: Point) -> float | None:
    """Steps per second over the report's window: from its `since` point (or the run's
    first step, if that is later) to `last`; None when the report names no window."""
    since = report.get("since")
    if not isinstance(since, dict) or "step" not in since or "time" not in since:
        return None
    start = Point(int(since["step"]), float(since["time"]))
    if start.time < first.time:
        start = first
    if last.step <= start.step or last.time <= start.time:
        return None
    return (last.step - start.step) / (last.time - start.time)


def run_progress(report: dict, steps: int | None, gpus: int, share: int,
                 curve: ThroughputCurve | None, now: float) -> Progress:
    """A running job's speed and end from its last progress `report` ({} before the first)
    and its `curve` (None: unknown); `steps`: the job's total (None: it ends when it ends)."""
    step = int(report.get("step") or report.get("start_step") or 0)
    first, last = first_point(report), training_point(report)
    sample = throughput(first, last, gpus, share, 1.0) if first and last else None
    if sample is not None:
        rate = recent_rate(report, first, last) or sample.value
        source, at = "measured", last.time
    elif curve is not None and curve.possible(gpus):
        rate, source, at = curve.throughput(gpus, share), "profile", now
    else:
        return UNKNOWN
    if not steps or rate <= 0:
        return Progress(rate, source, None)
    return Progress(rate, source, at + max(steps - step, 0) / rate)


def end_forecast(report: dict, steps: int | None, gpus: int, share: int,
                 curve: ThroughputCurve | None, now: float) -> float | None:
    """When a running job should end, for the broker's wait for ends that come together
    (None: unknown). As `run_progress`, except that a run too short for a measured speed
    (under `MIN_WINDOW_S` of training: a short job may end before one is measured) is timed
    by its own steps so far, and its curve's estimate counts from its last report, not from
    `now`: the run's own pace, not the profile's, says whether it ends in the next ms."""
    if not report and steps and curve is not None:  # (the common case, made cheap)
        return now + steps / curve.throughput(gpus, share) if curve.possible(gpus) else None
    progress = run_progress(report, steps, gpus, share, curve, now)
    if progress.source == "measured" or not steps:
        return progress.finish_at
    first, last = first_point(report), training_point(report)
    if first is None or last is None:  # not training yet: not due before its whole run
        return progress.finish_at
    left = max(steps - last.step, 0)
    if last.step > first.step and last.time > first.time:
        return last.time + left / ((last.step - first.step) / (last.time - first.time))
    return last.time + left / progress.rate if progress.rate else None
