"""The runs' ends that come together, decided as one (the broker's loop waits for them)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from marbled.core.model import JobState
from marbled.core.progress import end_forecast

if TYPE_CHECKING:
    from marbled.daemon.broker import Broker

log = logging.getLogger("marbled")


class EndCoalescer:
    def __init__(self, broker: Broker):
        self.broker = broker
        self.ending = False  # a run has ended since the last decision
        self.coalescing = False  # the loop waits for the ends that come together

    async def coalesce(self) -> None:
        """After a run's end, wait until no other has ended for `coalesce_s`, and until the
        runs whose progress says they end within `coalesce_max_s` have ended, at most
        `coalesce_max_s` in all: short jobs that end a few ms apart (their processes started
        a few ms apart) are one decision, as the simulator takes the ends of one instant, so
        a neighbour is not resized, nor a run started and reshaped, at each of their ends.
        With no other run due, the decision waits for the quiet period alone; with no run
        left at all (live or being started), for nothing: no other end can come; and with
        no unfinished job that a policy may move (`State.movable`: every job rigid), for
        nothing either: each runs on its own count and is never moved, so no decision at
        one end is undone at the next (`sleep 0.1` jobs: 3.5 ms p50 off each cycle; issue 32)."""
        b = self.broker
        quiet, loop = b.config.coalesce_s, asyncio.get_running_loop()
        first = loop.time()
        give_up = first + b.config.coalesce_max_s
        self.coalescing = True
        due: set[int] = set()
        waited_for: set[int] = set()
        while (self.ending or due & b.runs.live.keys()) and quiet > 0 and b.state.movable \
                and (b.runs.live or b.runs.launching) and loop.time() < give_up:
            began = loop.time()
            if self.ending:  # forecasts are read again at each end (a stat per live run)
                self.ending = False
                due = self._due_within(give_up - began)
                waited_for |= due
            # the reading is part of the quiet period, not added to it
            await asyncio.sleep(max(min(began + quiet, give_up) - loop.time(), 0.0))
        if waited_for:
            log.debug("deciding %.0f ms after a run's end: waited for jobs %s, due to end "
                      "(still running: %s)", (loop.time() - first) * 1000, sorted(waited_for),
                      sorted(waited_for & b.runs.live.keys()) or "none")
        self.ending = self.coalescing = False

    def _due_within(self, horizon: float) -> set[int]:
        """The running jobs whose run should end within `horizon` s, or should have ended
        less than `coalesce_max_s` ago (later than that, its forecast is not one to wait on)."""
        b = self.broker
        now, late = b.clock.time(), b.config.coalesce_max_s
        due = set()
        for job_id, live in b.runs.live.items():
            job, steps = b.state.jobs[job_id], b.specs[job_id].steps
            if job.state is not JobState.RUNNING or not steps or job.placement is None:
                continue
            end = end_forecast(b.files.progress(job_id, live.run_id), steps, len(job.gpus),
                               job.placement.share, job.curve, now)
            if end is not None and now - late <= end <= now + horizon:
                due.add(job_id)
        return due
