"""How fast a running job trains and when it will end (pure).

A run's speed is measured from its own progress reports: steps per second between its
first step and its last report (start-up is not training). Before it has trained for
`MIN_WINDOW_S` or `MIN_STEPS`, its curve (on the broker's clock) stands in. Its end is
its last report's time plus the steps left at that speed, so a report a second old
does not move the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from marbled.core.measure import first_point, throughput, training_point
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


def run_progress(report: dict, steps: int | None, gpus: int, share: int,
                 curve: ThroughputCurve | None, now: float) -> Progress:
    """A running job's speed and end from its last progress `report` ({} before the first)
    and its `curve` (None: unknown); `steps`: the job's total (None: it ends when it ends)."""
    step = int(report.get("step") or report.get("start_step") or 0)
    first, last = first_point(report), training_point(report)
    sample = throughput(first, last, gpus, share, 1.0) if first and last else None
    if sample is not None:
        rate, source, at = sample.value, "measured", last.time
    elif curve is not None and curve.possible(gpus):
        rate, source, at = curve.throughput(gpus, share), "profile", now
    else:
        return UNKNOWN
    if not steps or rate <= 0:
        return Progress(rate, source, None)
    return Progress(rate, source, at + max(steps - step, 0) / rate)
