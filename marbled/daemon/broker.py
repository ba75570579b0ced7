"""The broker: one asyncio loop that turns events into policy decisions and effects.

Events -- a submission, a run's start or end, a cancel, a deadline, the drain --
change the pure `State`; the loop then lets the policy decide (`core.decision`)
and hands each action to the module that carries it out: `Runs` (the life of a
run), `Ledger` (every store write). `Intake` admits submissions into the state.
Deadlines known in advance (a policy's next decision, a retry's back-off, the
allocation's end, GPU samples) are timers (`Timers`). Ends that come together are one
decision (`EndCoalescer`); clients that wait for every job to end are answered from the
loop (`EndWaiters`).
What the broker holds grows with the live jobs, not with every job ever: a job that has
ended for good leaves it (`Intake.forget_ended`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine

from marbled.batch.base import Launcher
from marbled.core.decision import settle
from marbled.core.errors import Never, NotNow
from marbled.core.learning import LearnedBook
from marbled.core.model import Action, Cancel, Job, JobState, Node, Role, Start, State, Suspend
from marbled.core.policy.base import Policy
from marbled.core.profiles import ThroughputCurve
from marbled.core.shapes import UNFIT_WAIT
from marbled.core.spec import JobSpec
from marbled.daemon.clock import Clock, LoopClock
from marbled.daemon.coalesce import EndCoalescer
from marbled.daemon.config import BrokerConfig
from marbled.daemon.intake import Intake, Names, recorded
from marbled.daemon.learner import Learner, starts_up
from marbled.daemon.ledger import Ledger, StorageLost, StoreRefused
from marbled.daemon.live_run import Ended
from marbled.daemon.metrics import BrokerMetrics
from marbled.daemon.recovery import recover
from marbled.daemon.runs import Runs
from marbled.daemon.timers import Timers
from marbled.daemon.views import run_speed
from marbled.daemon.waiters import EndWaiters
from marbled.daemon.workfiles import JobFiles
from marbled.store.db import Store

log = logging.getLogger("marbled")


class Broker:
    def __init__(self, config: BrokerConfig, store: Store, launcher: Launcher, policy: Policy,
                 clock: Clock | None = None):
        self.config, self.store, self.launcher, self.policy = config, store, launcher, policy
        self.clock = clock or LoopClock()
        self.state = State(
            nodes={n: Node(n, tuple(range(len(d)))) for n, d in config.nodes.items()},
            ended=lambda job_id: recorded(store, job_id))
        self.specs: dict[int, JobSpec] = {}  # of the jobs the state holds
        self.names = Names(store)
        self.metrics = BrokerMetrics(self.state)
        self.ledger = Ledger(store, self.metrics.event, on_failure=self._store_failed)
        self.metrics.watch_store(lambda: self.ledger.held)
        self.failure: BaseException | None = None  # a commit that failed: the broker stops
        self.files = JobFiles(config.state_dir)
        self.book = (LearnedBook(config.book, config.learning, self.state.max_node_size)
                     if config.learning and self.state.nodes else config.book)
        self.learner = Learner(
            self.book, self.state, self.specs, self.files, self.ledger, self.clock,
            config.time_scale, live=lambda: self.runs.live.values(), curve_of=self.curve_of,
            wake=self.wake) if isinstance(self.book, LearnedBook) else None
        self.runs = Runs(config, launcher, self.ledger, self.files, self.clock, self.state,
                         self.specs, self.spawn, self._launched, self._ended,
                         self.learner.observe if self.learner else lambda live, at: None)
        self.draining = False
        self.started_at = self.clock.time()
        self.sampler = None  # an NvmlSampler of the broker's node, when it has real GPUs
        self._wake = asyncio.Event()
        self.ends = EndCoalescer(self)  # the ends that come together: one decision
        self._reshaped: dict[int, float] = {}  # job -> when the policy last reshaped it
        self._refused: dict[int, float] = {}  # job -> the reshape whose repeat was logged
        self._held: dict[int, int | None] = {}  # job -> its run whose move waits (I6), logged
        self._idle = asyncio.Event()  # set when draining and nothing runs any more
        self._tasks: set[asyncio.Task] = set()
        self.intake = Intake(self)
        self.timers = Timers(self)
        self.end_waiters = EndWaiters(lambda: self.state.unfinished - self.state.unfit_count,
                                      self._settled, self.ledger.flush)

    def recover(self) -> None:
        """Rebuild the state from the store; re-adopt runs whose process still lives."""
        if self.learner:
            self.learner.replay(self.store.samples())
        recover(self.store, self.runs, self.config.nodes, self.intake.add, self._expect,
                self.wake_at, self.state.ended_before)
        # jobs whose open run was settled as their end: they leave the state as any other
        self.intake.leaving += [job.id for job in self.state.jobs.values() if job.state.finished]
        for job_id, why in self.state.unfit().items():
            log.warning("job %d cannot run in this allocation: %s; %s", job_id, why, UNFIT_WAIT)
        # cancels the last broker recorded and died before they were carried out (lifecycle I2)
        for job_id in sorted(self.store.cancels_requested() & self.state.jobs.keys()):
            if not self.state.jobs[job_id].state.finished:
                self._cancel(job_id, "cancelled by the user (before a broker restart)")
        self.wake()

    # ------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Decide and act until the drain has finished. While the store cannot be written
        (`ledger.fault`) no decision is made: a run started then, and lost with the held
        writes if this broker died, would be started again by the next one; the ledger
        wakes the loop when its writes are committed again."""
        self._timers()
        self.ledger.on_recovered = self.wake
        while not (self.draining and not self.runs.live and not self.runs.launching):
            await self._wake.wait()
            await self.ends.coalesce()
            self._wake.clear()
            if self.failure is not None:
                raise self.failure
            if not self.draining and self.ledger.fault is None:
                self.decide()
            else:
                self.ledger.commit_ends()  # no decision to join them: a drain's ends
            self.end_waiters.check()
        self.ledger.flush()  # once more: the store may take what is held now
        self._idle.set()
        if self.ledger.fault is not None:
            held, saved = self.ledger.held, self.ledger.spill()
            raise StorageLost(
                f"stopping with {held} writes the store never took ({self.ledger.fault}); "
                + (f"they are saved in {saved} for the next broker" if saved else
                   "the next broker settles the runs left open from the jobs' own files"))

    def _store_failed(self, exc: BaseException) -> None:
        """A commit failed with submissions in it: the state holds jobs the store does not,
        so the broker stops (no 201 was sent for them); a new one rebuilds from the store.
        A group the store refused for want of space or access (`StoreRefused`: 503) was
        never accepted: its jobs leave the state (no count or view shows them) and the
        broker goes on."""
        if isinstance(exc, StoreRefused):
            self.intake.withdraw(exc.jobs)
            return
        log.error("the store could not commit (%s): stopping", exc)
        self.failure = exc
        self.wake()

    def wake(self) -> None:
        self._wake.set()

    def wake_at(self, when: float) -> None:
        self.clock.call_at(when, self.wake)

    def decide(self) -> None:
        began = time.perf_counter()  # the loop's own busy time, not self.clock (tests fake it)
        now = self.clock.time()
        with self.ledger.batch():  # one transaction for the decision's changes
            for action, job in settle(self.policy, self.state, now,
                                      lambda action: self._refuse(action, now)):
                match action:
                    case Start():
                        self._start(job, action, now)
                    case Suspend(reason=reason):
                        self._reshaped[job.id] = now
                        self._suspend(job, reason)
                    case Cancel(reason=reason):
                        self._finish(job.id, JobState.CANCELLED, reason)
        self.ledger.commit_ends()  # the ends that woke it, if it wrote nothing to join them
        self.intake.forget_ended()  # once their ends are committed
        self.timers.decide_at(self.policy.next_decision(self.state, self.clock.time()))
        self.metrics.decision.observe(time.perf_counter() - began)

    def _refuse(self, action: Action, now: float) -> bool:
        """Is `action` a move the broker does not take now?

        * A reshape of a run that has not reported its first step (lifecycle I6: it has
          trained nothing, and its start-up would be thrown away): held, logged once per
          run as `reshape-held`, and decided again each monitor interval until it trains
          (one that reports nothing at all: until its model's start-up has passed,
          `learner.starts_up`).
        * A reshape of a run whose start-up is counted only now: decided again at once,
          priced at the start-up measured (the learner has updated its model's curve).
        * A reshape of a job the policy reshaped less than `reshape_window` ago. Such a
          loop makes no progress (each run is undone before it trains): the reshape is
          refused and logged once, and the policy may decide again once the window is past.
        """
        if isinstance(action, Suspend):
            live = self.runs.live.get(action.job)
            reports = self.specs[action.job].emulate or bool(
                self.learner and self.learner.reports(action.job))
            if starts_up(action, self.state, live, self.files, now, reports):
                run = live.run_id if live else None
                if self._held.get(action.job, -1) != run:
                    self._held[action.job] = run
                    log.info("job %d: not reshaped before its first step (%s)", action.job,
                             action.reason)
                    self.ledger.event("reshape-held", now, action.job, run,
                                      reason=action.reason)
                self.wake_at(now + self.config.monitor_interval)
                return True
            if live is not None and self.learner and self.learner.before_move(live):
                return True
        last = self._reshaped.get(action.job) if isinstance(action, Suspend) else None
        if last is None or now - last >= self.config.reshape_window:
            return False
        if self._refused.get(action.job) != last:
            self._refused[action.job] = last
            log.warning("job %d: the policy reshaped it again %.3f s after its last reshape; "
                        "refused (%s)", action.job, now - last, action.reason)
            self.ledger.event("reshape-refused", now, action.job, reason=action.reason,
                              since_s=round(now - last, 3))
            self.wake_at(last + self.config.reshape_window)
        return True

    def spawn(self, coro: Coroutine) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        """A background task's failure is a bug of the broker's: never left unobserved
        (lifecycle I3), it is logged with its traceback and recorded."""
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.error("a background task of the broker failed: %r", exc, exc_info=exc)
        try:
            self.ledger.event("broker-error", self.clock.time(), error=repr(exc))
        except Exception:  # noqa: BLE001 (the store may be what failed)
            log.exception("could not record the failure")

    def _timers(self) -> None:
        """The periodic and one-off deadlines the broker knows at its start."""
        self.timers.start()
        if self.policy.promotes and self.config.prestart == "ahead":
            self.timers.every(self.config.monitor_interval, self._prestart_secondaries)
        if self.learner:
            self.timers.every(self.config.learn_interval, self.learner.tick)
        self.timers.every(self.config.learn_interval, self._measured_ends)

    # ------------------------------------------------------------ actions

    def _start(self, job: Job, action: Start, now: float) -> None:
        self._expect(job.id, now, self.runs.start(action), len(action.gpus), action.share)

    def _expect(self, job_id: int, started_at: float, start_step: int, gpus: int,
                share: int) -> None:
        """A run started (or adopted at a restart): the state takes its expected end."""
        self.state.expect(job_id, self.expected_end(job_id, started_at, start_step, gpus, share))

    def _measured_ends(self) -> None:
        """The expected end of each run whose speed is measured, at that speed: the policies
        (adaptive's work left, malleable's guard, the planner's simulations) then read when
        a job that runs slower or faster than its profile really ends, not the profile's."""
        for job_id in self.runs.live:
            p = run_speed(self, job_id, self.specs[job_id].steps)
            if p.source == "measured" and p.finish_at is not None:
                self.state.expect(job_id, p.finish_at)

    def _suspend(self, job: Job, reason: str) -> None:
        self.runs.suspend(job, reason)
        if job.malleable and not self.draining:
            self.runs.prestart(job)

    def _suspend_now(self, job_id: int, reason: str) -> None:
        """Suspend a running job outside the policy (user, drain); it will wait in the FIFO."""
        self._suspend(self.state.apply(Suspend(job_id, None, reason)), reason)

    def _finish(self, job_id: int, state: JobState, reason: str) -> None:
        """End a job that is not running (a cancel, a dependency that can never be met)."""
        if not self.state.jobs[job_id].state.finished:
            self.state.finished(job_id, state)
        self.runs.standby.drop(job_id)
        self._forget_reshapes(job_id)
        self.ledger.job_ended(job_id, state, reason, self.clock.time())
        self.intake.leaving.append(job_id)

    def _settled(self, job_id: int) -> bool:
        """Whether a job that exists has ended (one the state no longer holds has), or can
        never run in this allocation (`State.unfit`): a wait for it would last until the
        allocation's end, so `marble wait` says so instead and the batch script goes on."""
        job = self.state.jobs.get(job_id)
        return job is None or job.state.finished or self.state.misfit_of(job_id) is not None

    def _forget_reshapes(self, job_id: int) -> None:
        """An ended job is reshaped no more: the loop guard need not keep it."""
        self._reshaped.pop(job_id, None)
        self._refused.pop(job_id, None)
        self._held.pop(job_id, None)

    def curve_of(self, job_id: int, spec: JobSpec | None = None) -> ThroughputCurve | None:
        """What the book knows of the job's model, on the broker's clock (an emulated job
        trains at its profile's pace times --time-scale); `spec`: the job's, if the broker
        no longer holds it."""
        spec = spec or self.specs[job_id]
        curve = self.book.lookup(spec.model) if spec.model else None
        scale = self.config.time_scale if spec.emulate else 1.0
        return curve.in_time(scale) if curve else None

    def expected_end(self, job_id: int, started_at: float, start_step: int,
                     gpus: int, share: int = 1) -> float | None:
        """When a run should end by its curve (None without a curve or a step count);
        policies that weigh the time left read it."""
        spec, curve = self.specs[job_id], self.state.jobs[job_id].curve
        if curve is None or not spec.steps:
            return None
        return started_at + (spec.steps - start_step) / curve.throughput(gpus, share)

    # ------------------------------------------------------------ what runs tell

    def _launched(self, job_id: int) -> None:
        if self.draining:  # the drain came while the process was being started
            self._suspend_now(job_id, "shutdown")
        self.wake()

    def _ended(self, ended: Ended) -> None:
        self.ends.ending = True
        if ended.retry_at is not None:
            self.state.suspended(ended.job_id, not_before=ended.retry_at)
            self.wake_at(ended.retry_at)
        elif ended.outcome is JobState.SUSPENDED:
            self.state.suspended(ended.job_id)
        else:
            self.state.finished(ended.job_id, ended.outcome)
            self._forget_reshapes(ended.job_id)
            self.intake.leaving.append(ended.job_id)
        self.wake()

    def _prestart_secondaries(self) -> None:
        """Keep the next run of every running secondary waiting (MARBLE promotes them)."""
        if not self.draining:
            for job_id in list(self.runs.live):
                job = self.state.jobs[job_id]
                if job.role is Role.SECONDARY and job.state is JobState.RUNNING:
                    self.runs.prestart(job, once_training=True)

    # ------------------------------------------------------------ requests

    def submit_grouped(self, specs: list[JobSpec],
                       key: str | None = None) -> tuple[list, asyncio.Future, bool]:
        """`Intake.submit_grouped`: the API's `commands` submit through the broker."""
        return self.intake.submit_grouped(specs, key)

    def submit(self, specs: list[JobSpec]) -> list:
        """`Intake.submit`, committed on return (the tests' and benchmarks' submission)."""
        return self.intake.submit(specs)

    def suspend(self, job_id: int) -> None:
        """Checkpoint a running job and put it back in the FIFO at its place (user request)."""
        state = self.intake.state_of(job_id)
        running = state is JobState.RUNNING
        if not running or (job_id not in self.runs.live and job_id not in self.runs.launching):
            raise NotNow(f"job {job_id} is {state}; only a running job can be suspended")
        job = self.state.jobs[job_id]
        live = self.runs.live.get(job_id)
        if not job.malleable and (live is None or not self.runs.reported(live)):
            # A fixed count is the policy's business, not the checkpoint's (lifecycle I1); but
            # a run that has not reported has no checkpoint to keep: it would start again.
            raise NotNow(f"job {job_id} has not reported progress yet, so there is no "
                         "checkpoint to keep: suspended now it would start again from scratch. "
                         "A job that speaks the worker protocol reports once it has restored "
                         "(try again then); a plain command never does: cancel it instead")
        # A process still being started is asked once it runs (Runs.suspend).
        self._suspend_now(job_id, "requested by the user")

    def cancel(self, job_id: int) -> None:
        state = self.intake.state_of(job_id)
        if state.finished:
            raise Never(f"job {job_id} has already ended ({state})")
        self.ledger.cancel_requested(job_id, self.clock.time())  # on disk before it acts
        self._cancel(job_id, "cancelled by the user")
        self.wake()

    def _cancel(self, job_id: int, reason: str) -> None:
        if not self.runs.cancel(job_id):
            self._finish(job_id, JobState.CANCELLED, reason)

    async def drain(self, reason: str) -> None:
        """Suspend every running job to its checkpoint, record it, and stop."""
        if not self.draining:
            self.draining = True
            self.end_waiters.close()
            self.ledger.event("drain", self.clock.time(), reason=reason)
            self.runs.standby.drop_all()
            self.ledger.stop_waits()  # a run not yet recorded is not started now
            for job in self.state.active():
                if job.state is JobState.RUNNING and job.id in self.runs.live:
                    self._suspend_now(job.id, reason)
                elif job.state is JobState.SUSPENDING and job.resume_on is not None:
                    # A promotion under way: keep the suspension, forget the reservation.
                    self.state.drop_reservation(job.id)
            self.wake()
        await self._idle.wait()
