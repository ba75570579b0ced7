"""What the broker learns from its runs, and how later decisions use it.

Every `learn_interval` and at each run's end, the progress a run reported gives
samples of its model (`core.measure`): throughput over the window since the last
sample, start-up once per run, and what an acknowledged suspension took. They
go to the store (the `samples` table, so they survive a restart) and to the
learned book (`core.learning`), which then names each model's curve and the count
its next run should use. The model's waiting jobs take that count and curve at
once; a running one whose count is now below it becomes a secondary, so a policy
that promotes (MARBLE) moves it up when GPUs free: how a model no profile knew is
explored, one doubling at a time, while each pays. One above it (a doubling that did
not pay) is brought back down by MARBLE when the move pays. The count and its reason
are `core.target`'s, which `marble curves`, `status` and `explain` show.

What a move costs is learned the same way (lifecycle I6): a model's start-up (launch
to first step: interpreter, imports, restore) and its suspension (SIGTSTP to exit:
checkpoint) are the medians of its last runs on this broker's machine, and its jobs'
curves carry them, so policies price a reshape at them. A run's start-up is counted
at the latest when a policy would first move it (`before_move()`), not only at the
next tick. A run that has not reported its first step is not moved at all
(`starts_up()`, the daemon's side of `core.decision.starting_up`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from marbled.core.decision import starting_up
from marbled.core.learning import DEFAULT_STARTUP_S, LearnedBook
from marbled.core.measure import (
    Point,
    Sample,
    first_point,
    startup,
    suspension,
    throughput,
    training_point,
    trains,
)
from marbled.core.profiles import model_key

if TYPE_CHECKING:
    from marbled.core.model import Action, State
    from marbled.core.profiles import ThroughputCurve
    from marbled.core.spec import JobSpec
    from marbled.daemon.clock import Clock
    from marbled.daemon.ledger import Ledger
    from marbled.daemon.live_run import LiveRun
    from marbled.daemon.workfiles import JobFiles


def starts_up(action: Action, state: State, live: LiveRun | None, files: JobFiles,
              now: float, reports: bool) -> bool:
    """Is `action` a policy's reshape of a run that has not reported its first step
    (`core.decision.starting_up`)? The broker does not take it (lifecycle I6). The run's
    last progress report tells; a run whose process is still being started has not
    trained. A run that has reported nothing at all, of a job not known to report
    (`reports`: emulated, or its model's runs have reported their start-ups here), may be
    importing still, or may never report (the paper's SIGTSTP/SIGUSR1 protocol alone, a
    plain command): it is held while younger than its model's start-up (measured, else
    assumed: `core.learning.DEFAULT_STARTUP_S`), and taken as one that does not report
    after that."""

    def trained(job_id: int) -> bool:
        if live is None:
            return False
        progress = files.progress(job_id, live.run_id)
        if trains(progress):
            return True
        if progress or reports:  # it speaks the protocol: its first step will be told
            return False
        job = state.jobs[job_id]
        curve = job.curve
        expected = curve.startup_s if curve is not None and curve.startup_s is not None \
            else DEFAULT_STARTUP_S
        return job.run_started is not None and now - job.run_started >= expected

    return starting_up(action, state, trained)


class Learner:
    """Takes the broker's parts it reads and writes, not the broker: `live` names the runs
    to sample, `curve_of` a job's curve on the broker's clock, `wake` asks for a decision."""

    def __init__(self, book: LearnedBook, state: State, specs: Mapping[int, JobSpec],
                 files: JobFiles, ledger: Ledger, clock: Clock, time_scale: float, *,
                 live: Callable[[], Iterable[LiveRun]],
                 curve_of: Callable[[int], ThroughputCurve | None], wake: Callable[[], None]):
        self.book, self.state, self.specs, self.files = book, state, specs, files
        self.ledger, self.clock, self.time_scale = ledger, clock, time_scale
        self._live, self._curve_of, self._wake = live, curve_of, wake
        self._last: dict[int, Point] = {}  # run id -> where its last sample ended
        self._started: set[int] = set()  # runs whose start-up is counted
        self._jobs: dict[str, set[int]] = {}  # model key -> its resizable jobs

    def replay(self, rows: Iterable) -> None:
        """Learn again the store's `samples` rows (at a broker's start)."""
        for row in rows:
            self.book.record(row.model, row.kind, row.value, row.gpus)

    def track(self, job_id: int) -> None:
        """A job whose count follows what is learned of its model."""
        spec = self.specs[job_id]
        if spec.model and spec.gpus is None and spec.nodes == 1:
            self._jobs.setdefault(model_key(spec.model), set()).add(job_id)

    def untrack(self, job_id: int) -> None:
        """A job that has ended and left the broker's state (`track`'s undoing)."""
        spec = self.specs.get(job_id)
        if spec is not None and spec.model:
            jobs = self._jobs.get(model_key(spec.model))
            if jobs is not None:
                jobs.discard(job_id)
                if not jobs:
                    del self._jobs[model_key(spec.model)]

    def tick(self) -> None:
        for live in list(self._live()):
            self.observe(live, None)

    def observe(self, live: LiveRun, ended_at: float | None) -> None:
        """Sample the run's last progress report; `ended_at`: it has just exited."""
        spec, job = self.specs[live.job_id], self.state.jobs[live.job_id]
        if not spec.model or job.placement is None or job.nodes > 1:
            return
        progress = self.files.progress(live.job_id, live.run_id)
        scale = self.time_scale if spec.emulate else 1.0
        samples: list[Sample] = []
        if live.run_id not in self._started and (first := startup(progress, scale)):
            self._started.add(live.run_id)
            samples.append(first)
        now = training_point(progress)
        since = self._last.get(live.run_id) or first_point(progress)
        if now and since and (
                sample := throughput(since, now, len(job.gpus), job.placement.share, scale)):
            samples.append(sample)
            self._last[live.run_id] = now
        if ended_at is not None:
            if live.acked and (cost := suspension(live.asked_at, ended_at, scale)):
                samples.append(cost)
            self._last.pop(live.run_id, None)
            self._started.discard(live.run_id)
        if samples:
            self._learn(spec.model, live, samples)

    def reports(self, job_id: int) -> bool:
        """Do the job's runs report their progress? Its model's runs here have told their
        start-ups (so its worker speaks the protocol)."""
        spec = self.specs[job_id]
        return bool(spec.model) and bool(self.book.knowledge(spec.model).startup)

    def before_move(self, live: LiveRun) -> bool:
        """A policy would move the run, which trains: count its start-up now if it is not
        counted yet, so that the move is priced at what this model's start-up measures
        (the next tick may be 30 s away). True if that was learned (its jobs' curves have
        changed: the move is to be decided again)."""
        if live.run_id in self._started:
            return False
        self.observe(live, None)
        return live.run_id in self._started

    def _learn(self, model: str, live: LiveRun, samples: list[Sample]) -> None:
        self.ledger.samples(model, live.job_id, live.run_id, samples, self.clock.time())
        for s in samples:
            if s.kind != "throughput" or s.share == 1:  # shared runs: the profile's figures
                self.book.record(model, s.kind, s.value, s.gpus)
        aim = self.book.target(model, self.state.max_node_size)
        for job_id in self._jobs.get(model_key(model), ()):
            if not self.state.jobs[job_id].state.finished:
                self.state.resize(job_id, aim.count, self._curve_of(job_id), aim.move)
        self._wake()
