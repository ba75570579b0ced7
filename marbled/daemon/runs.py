"""The life of every run: launch, suspension, escalation, exit.

A run starts when the policy says so. To suspend it the broker writes the job's
request file and sends SIGTSTP; the acknowledgement is the job's marker file,
found on SIGUSR1 or by the next look (every `monitor_interval` while a run is
suspending), whichever is first. No acknowledgement within `suspend_timeout`:
SIGCONT + SIGTERM, then SIGKILL after `kill_timeout`; after an acknowledgement
the process gets `kill_timeout` to exit before SIGKILL. The exit code, the
acknowledgement and the job's last progress report decide how the run ended
(`run_end.py`, with `core/outcome.py`; a failed run's reason, from its files:
`run_failures.py`); `Runs` records it and tells the broker.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Coroutine
from dataclasses import replace

from marbled.batch.base import Launcher
from marbled.core.model import Job, JobState, Start, State
from marbled.core.spec import JobSpec
from marbled.daemon.clock import Clock, Timer, call_later
from marbled.daemon.config import BrokerConfig
from marbled.daemon.ledger import Ledger
from marbled.daemon.live_run import Ended, LiveRun
from marbled.daemon.prestart import Standbys
from marbled.daemon.requests import (
    launch_request,
    not_prestartable,
    standby_env,
    start_failure,
)
from marbled.daemon.run_end import run_end
from marbled.daemon.workfiles import JobFiles

log = logging.getLogger("marbled")
# A SIGUSR1 this soon after a marker was found may be that job's, sent after its marker
LATE_SIGUSR1 = 2.0


class Runs:
    """The runs of a broker's jobs. It reads the broker's `state` and `specs`, and tells it
    when a run has started (`on_launched`), what a run reported last (`observe`) and when
    one is over (`on_end`)."""

    def __init__(self, config: BrokerConfig, launcher: Launcher, ledger: Ledger,
                 files: JobFiles, clock: Clock, state: State, specs: dict[int, JobSpec],
                 spawn: Callable[[Coroutine], asyncio.Task],
                 on_launched: Callable[[int], None], on_end: Callable[[Ended], None],
                 observe: Callable[[LiveRun, float], None] = lambda live, at: None):
        self.config, self.launcher, self.ledger = config, launcher, ledger
        self.files, self.clock, self.state, self.specs = files, clock, state, specs
        self._spawn, self._on_launched, self._on_end = spawn, on_launched, on_end
        self._observe = observe  # sees every run's last progress as it ends
        self.live: dict[int, LiveRun] = {}
        self.launching: set[int] = set()  # jobs whose process is being started
        self._cancel_pending: set[int] = set()  # ... and that were cancelled meanwhile
        self._suspend_pending: dict[int, str] = {}  # ... or asked to suspend (the reason)
        self.step_refusals: dict[int, int] = {}  # job -> refusals of its step in a row
        self.standby = Standbys(launcher.launch, spawn, self._record)
        self._look: Timer | None = None  # the next look for acknowledgement markers
        self._marker_at = float("-inf")  # when a marker was last found

    def _record(self, kind: str, job_id: int | None = None, run_id: int | None = None,
                **data) -> None:
        self.ledger.event(kind, self.clock.time(), job_id, run_id, **data)

    # ------------------------------------------------------------ launch

    def start(self, action: Start) -> int:
        """Record the run and start its process (in the background); the step it starts at."""
        run_id, start_step = self.ledger.run_started(action, self.clock.time())
        self.launching.add(action.job)
        self._spawn(self._launch(action, run_id, start_step))
        return start_step

    async def _launch(self, action: Start, run_id: int, start_step: int) -> None:
        """Start the run's process; whatever goes wrong fails the run, with the reason, and
        frees its GPUs (lifecycle I3: never `running` with no process and no launch)."""
        try:
            await self._start_process(action, run_id, start_step)
        except Exception as exc:  # noqa: BLE001 (any failure ends the run, visibly)
            log.exception("job %d: run %d could not be started", action.job, run_id)
            self.launching.discard(action.job)
            if action.job not in self.live:
                self._start_failed(action.job, run_id,
                                   f"could not start: {type(exc).__name__}: {exc}")

    async def _start_process(self, action: Start, run_id: int, start_step: int) -> None:
        job_id = action.job
        nodes = self.config.nodes
        devices = tuple(nodes[action.node][g] for g in action.gpus)
        others = tuple((n, tuple(nodes[n][g] for g in gpus)) for n, gpus in action.others)
        run_env = {"MARBLE_RUN_ID": str(run_id), "MARBLE_GPUS": str(len(devices)),
                   "MARBLE_GPU_SHARE": str(action.share), "MARBLE_ROLE": action.role.value,
                   "MARBLE_LAUNCH_TIME": repr(self.clock.time())}
        try:
            if self.ledger.fault is not None and not await self.ledger.until_written():
                # The broker stops first: never started. Its job waits again here; the next
                # broker finds the run open with no process, and starts the job once.
                self._on_end(Ended(job_id, JobState.SUSPENDED))
                return
            # its directories are made here, not in start(): a decision that starts hundreds
            # of new jobs (two mkdirs each) launches its first run without waiting for them all
            try:
                self.files.prepare_run(job_id)
            except OSError as exc:
                self._start_failed(job_id, run_id, f"could not prepare the job's directory "
                                   f"{self.files.dir(job_id)}: {exc.strerror or exc}")
                return
            standby = job_id in self.standby
            handle = await self.standby.take(job_id, {**run_env, "devices": devices,
                                                      "parts": ((action.node, devices), *others)})
            if standby:
                self.files.adopt_standby_logs(job_id, run_id)
            if handle is None:
                request = replace(launch_request(self.config, self.files, job_id,
                                                 self.specs[job_id], action.node, devices,
                                                 run_env), others=others)
                try:
                    handle = await self.launcher.launch(request)
                except OSError as exc:
                    self._start_failed(job_id, run_id, start_failure(request, exc))
                    return
                except (ValueError, UnicodeError) as exc:  # a NUL, a lone surrogate
                    self._start_failed(job_id, run_id, f"could not start {request.argv[0]!r}: "
                                       f"{exc} (change the job's command or environment)")
                    return
        finally:
            self.launching.discard(job_id)
        placed_by_launcher = hasattr(handle, "placement")  # the batch system picks the GPUs
        live = LiveRun(job_id, run_id, handle, start_step)
        self.watch(live)  # first: whatever fails below, its exit is still seen
        self.ledger.run_process(run_id, handle.pid, handle.pid_start,
                                None if placed_by_launcher else devices)
        if placed_by_launcher:
            self._spawn(self._record_placement(job_id, run_id, handle))
        if job_id in self._cancel_pending:  # cancelled while its process was being started
            self._cancel_pending.discard(job_id)
            live.cancel = True
            self.stop(live, "cancelled by the user")
        elif job_id in self._suspend_pending:  # a reshape asked while it was being started
            self.suspend(self.state.jobs[job_id], self._suspend_pending.pop(job_id))
        else:
            self._on_launched(job_id)

    def _start_failed(self, job_id: int, run_id: int, detail: str) -> None:
        self._cancel_pending.discard(job_id)
        self._suspend_pending.pop(job_id, None)
        self.ledger.run_ended(job_id, run_id, at=self.clock.time(), exit_code=None,
                              reason="failed", outcome=JobState.FAILED, detail=detail)
        self._on_end(Ended(job_id, JobState.FAILED))

    async def _record_placement(self, job_id: int, run_id: int, handle) -> None:
        info = await handle.placement()
        if info:
            self.ledger.run_placed(job_id, run_id, info, self.clock.time())

    def watch(self, live: LiveRun) -> None:
        self.live[live.job_id] = live

        async def wait_exit() -> None:
            code = await live.handle.wait()
            self._exited(live, code)

        self._spawn(wait_exit())

    # ------------------------------------------------------------ prestart

    def prestart(self, job: Job, once_training: bool = False) -> None:
        """Start the process of the job's next run now, on no GPU, waiting for its go file
        (a per-GPU job's: as many ranks as it is expected to get)."""
        if self.config.prestart == "off" or job.id in self.standby or not job.placement \
                or not self.files.waits_for_go(job.id, once_training):
            return
        go, spec = self.files.go_file(job.id), self.specs[job.id]
        why = not_prestartable(self.config, self.files, job.id, spec, job.placement.node)
        if why:  # its command is filled in at exec, and only the go knows its GPU count
            self.standby.decline(job.id, why)
            return
        self.files.clear_standby_logs(job.id)
        request = launch_request(
            self.config, self.files, job.id, spec, job.placement.node, (),
            standby_env(self.config, go, self.clock.time()))
        self.standby.start(job.id, go, replace(
            request, standby_ranks=job.next_run_gpus if spec.per_gpu else 0))

    # ------------------------------------------------------------ suspension and stops

    def suspend(self, job: Job, reason: str) -> None:
        """Ask a running job to checkpoint and exit, whatever its GPU count (lifecycle I1); one
        whose run has not reported is stopped; one whose process is still being started is
        asked once it has started."""
        live = self.live.get(job.id)
        if live is None:
            self._suspend_pending[job.id] = reason
            return
        live.reason = reason
        if not self.reported(live) and not job.malleable:
            # No report yet: a protocol job restores and reports before its first step, so
            # this run has trained nothing a checkpoint could keep; a plain command never
            # reports and cannot checkpoint. Either way waiting for an answer only delays.
            self.stop(live, reason)
            return
        now = live.asked_at = self.clock.time()
        self.files.ask_to_suspend(job.id, live.run_id, now)
        live.handle.signal(signal.SIGTSTP)
        self.ledger.suspend_requested(job.id, live.run_id, reason, now)
        live.timers.append(call_later(self.clock, self.config.suspend_timeout,
                                      lambda: self._no_ack(live)))
        self._look_for_acks()

    def reported(self, live: LiveRun) -> bool:
        """Has the run reported progress (it speaks the worker protocol and has restored)?"""
        return bool(self.files.progress(live.job_id, live.run_id))

    def expect_ack(self, live: LiveRun) -> None:
        """A run a restarted broker adopts while it was being suspended: escalate as usual."""
        live.timers.append(call_later(self.clock, self.config.suspend_timeout,
                                      lambda: self._no_ack(live)))
        self._look_for_acks()

    def cancel(self, job_id: int) -> bool:
        """Stop the job's run because the user cancelled it; False if it has no process yet
        and none is being started (then it is not running)."""
        live = self.live.get(job_id)
        if live is not None:
            live.cancel = True
            self.stop(live, "cancelled by the user")
            return True
        if job_id in self.launching:
            self._cancel_pending.add(job_id)
            return True
        return False

    def _no_ack(self, live: LiveRun) -> None:
        if self.live.get(live.job_id) is live and live.acked is None:
            self._record("suspend-timeout", live.job_id, live.run_id,
                         timeout=self.config.suspend_timeout)
            self.stop(live, live.reason or "suspend timed out")

    def stop(self, live: LiveRun, reason: str) -> None:
        """SIGTERM now, SIGKILL after the kill timeout."""
        live.escalated = True
        live.handle.signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        live.handle.signal(signal.SIGTERM)
        self._record("stop", live.job_id, live.run_id, signal="SIGTERM", reason=reason)
        live.timers.append(call_later(self.clock, self.config.kill_timeout,
                                      lambda: self._kill(live)))

    def _kill(self, live: LiveRun) -> None:
        if self.live.get(live.job_id) is live:
            live.escalated = True
            live.handle.signal(signal.SIGKILL)
            self._record("stop", live.job_id, live.run_id, signal="SIGKILL")

    # ------------------------------------------------------------ acknowledgements

    def _suspending(self) -> list[LiveRun]:
        return [r for r in self.live.values() if r.acked is None
                and self.state.jobs[r.job_id].state is JobState.SUSPENDING]

    def _look_for_acks(self) -> None:
        """Look for markers every monitor interval while a run waits for its answer."""
        if self._look is None and self._suspending():
            def look() -> None:
                self._look = None
                self.check_acks()
                self._look_for_acks()

            self._look = call_later(self.clock, self.config.monitor_interval, look)

    def check_acks(self, by_signal: bool = False) -> None:
        """SIGUSR1 or a look: find the acknowledgements of suspending runs.

        The marker file says which run and which step. A SIGUSR1 that comes with no
        marker (a job speaking only the paper's protocol) acknowledges the one run
        being suspended; with several, their markers or exits decide. Not within
        LATE_SIGUSR1 of a marker found: then it is that job's late signal, and taken for
        another run's answer it would cut that run's save short (kill_timeout).
        """
        waiting = self._suspending()
        found = [self._read_ack(live) for live in waiting]
        if by_signal and len(waiting) == 1 and not any(found) and \
                self.clock.time() - self._marker_at > LATE_SIGUSR1:
            live = waiting[0]
            self._accept_ack(live, {"run_id": live.run_id, "step": None, "via": "SIGUSR1"})

    def _read_ack(self, live: LiveRun) -> bool:
        ack = self.files.ack(live.job_id, live.run_id)
        if ack is None:
            return False
        self._marker_at = self.clock.time()  # its SIGUSR1 may come after: not another's
        self._accept_ack(live, {**ack, "via": "marker"})
        return True

    def _accept_ack(self, live: LiveRun, ack: dict) -> None:
        live.acked = ack
        live.clear_timers()
        now = self.clock.time()
        latency = (now - ack["signalled_at"]) if ack.get("signalled_at") else None
        self._record("acknowledged", live.job_id, live.run_id, step=ack.get("step"),
                     latency=latency, via=ack["via"], save_seconds=ack.get("save_seconds"))
        # It should exit on its own now; do not let a slow teardown hold the GPUs.
        live.timers.append(call_later(self.clock, self.config.kill_timeout,
                                      lambda: self._kill(live)))

    # ------------------------------------------------------------ exits

    def _exited(self, live: LiveRun, code: int | None) -> None:
        self.live.pop(live.job_id, None)
        if code is None or code < 0:
            # The process we watched (a run's supervisor, or a step command) may have been
            # killed after its command had ended and been recorded: the record is what the
            # command did (lifecycle I2); a 0 there is a completion, not a kill
            recorded = self.files.exit_code(live.job_id, live.run_id)
            code = code if recorded is None else recorded
        if live.acked is None:
            # It may have exited before we saw its marker -- or before a broker that
            # restarted knew it had been asked to suspend.
            self._read_ack(live)
        elif live.acked["via"] == "SIGUSR1" and (ack := self.files.ack(live.job_id, live.run_id)):
            # A lone SIGUSR1 was taken for its answer, but may have been a late one of another
            # run's: its own marker, written since, says at which step it stopped
            live.acked = {**ack, "via": "marker"}
        live.clear_timers()
        now = self.clock.time()  # one instant: the end recorded is where a retry counts from
        self._observe(live, now)
        end, retry_at, extra = run_end(self, live, code, now)
        self._check_restored(live, extra)
        progress = extra.pop("_progress")
        self.ledger.run_ended(live.job_id, live.run_id, at=now, exit_code=code,
                              reason=end.outcome.value, detail=end.why, end_step=end.end_step,
                              start_step=progress.get("start_step"), outcome=end.outcome,
                              retry_at=retry_at, **extra)
        if end.outcome.finished:
            self.standby.drop(live.job_id)
            self.files.forget(live.job_id)
        self._on_end(Ended(live.job_id, end.outcome, retry_at))

    def _check_restored(self, live: LiveRun, extra: dict) -> None:
        """A job that could not use the checkpoint it acknowledged: say so, never silently."""
        restored = extra["_progress"].get("start_step")
        if restored is not None and restored < live.start_step:
            self._record("checkpoint-fallback", live.job_id, live.run_id,
                         expected=live.start_step, restored=restored,
                         detail=f"resumed from step {restored}, not {live.start_step}: "
                                "its newest checkpoint was missing or unreadable")
