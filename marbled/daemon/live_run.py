"""A run the broker watches (`LiveRun`), and what it hears when a run is over (`Ended`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from marbled.batch.base import RunHandle
from marbled.core.model import JobState
from marbled.daemon.clock import Timer


@dataclass
class LiveRun:
    """A run whose process the broker watches, and what it has asked of it."""

    job_id: int
    run_id: int
    handle: RunHandle
    start_step: int
    reason: str | None = None  # why it is being suspended or stopped
    asked_at: float | None = None  # when it was asked to suspend
    acked: dict | None = None
    escalated: bool = False  # SIGTERM/SIGKILL were needed
    cancel: bool = False
    recovered: bool = False  # adopted after it ended: no broker saw it end
    timers: list[Timer] = field(default_factory=list)

    def clear_timers(self) -> None:
        for t in self.timers:
            t.cancel()
        self.timers.clear()


@dataclass(frozen=True)
class Ended:
    """What the broker hears when a run is over."""

    job_id: int
    outcome: JobState  # DONE, SUSPENDED, FAILED or CANCELLED
    retry_at: float | None = None  # a failed run that will be retried from then on
