"""The broker: one asyncio loop that turns events into policy decisions and effects.

Events (a submission, a run's exit, an acknowledgement, a cancel, the drain)
change the pure `State` through its transition methods; the policy then
decides, and the broker carries its actions out with the launcher, recording
every step in the store in the same transaction as its event row.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from marbled.batch.base import Launcher, LaunchRequest, RunHandle
from marbled.batch.local import find_run_process, process_start_time
from marbled.core.failures import TAIL_BYTES, memory_cause, tail
from marbled.core.model import (
    Cancel,
    Job,
    JobState,
    Node,
    Placement,
    Role,
    Start,
    State,
    Suspend,
)
from marbled.core.outcome import run_outcome
from marbled.core.policy import Policy
from marbled.core.profiles import ProfileBook
from marbled.core.spec import JobSpec, SpecError, size_job
from marbled.daemon.prestart import Standbys, worth_prestarting
from marbled.store.db import (
    GpuSampleRow,
    JobRow,
    RunRow,
    Store,
    placement_columns,
    placement_parts,
)
from marbled.worker.protocol import (
    ACK_FILE,
    GO_FILE,
    PROGRESS_FILE,
    SUSPEND_FILE,
    atomic_write_json,
    read_json,
)

log = logging.getLogger("marbled")


class Refused(Exception):
    """A request the broker understood but will not carry out; `status` is the HTTP code."""

    def __init__(self, message: str, status: int = 409, field: str | None = None):
        super().__init__(message)
        self.status = status
        self.field = field


@dataclass
class BrokerConfig:
    state_dir: Path
    nodes: dict[str, tuple[str, ...]]  # node name -> device names (CUDA_VISIBLE_DEVICES entries)
    book: ProfileBook
    profile_ref: str  # what emulated jobs load (name or path)
    time_scale: float = 1.0  # for emulated jobs
    suspend_timeout: float = 60.0  # SIGTSTP -> acknowledgement, before SIGTERM
    kill_timeout: float = 10.0  # SIGTERM -> exit, before SIGKILL
    monitor_interval: float = 1.0
    # When to start the process of a job's next run before its GPUs are free:
    # "ahead" keeps one waiting for every running secondary (the runs MARBLE
    # suspends) and starts one at any other suspension; "suspend" only at a
    # suspension; "off" never.
    prestart: str = "ahead"
    # The node the broker runs on: jobs there may also acknowledge with SIGUSR1; jobs on
    # other nodes only through their marker file on the shared state directory.
    broker_node: str | None = None
    # When the allocation ends (Unix time), and how long before it every job is suspended.
    end_time: float | None = None
    drain_before: float = 120.0
    retry_delay: float = 30.0  # before a failed job's first retry; doubles with each failure
    sample_interval: float = 10.0  # seconds between GPU samples (with a sampler)


@dataclass
class LiveRun:
    run_id: int
    handle: RunHandle
    start_step: int
    reason: str | None = None  # why it is being suspended or stopped
    acked: dict | None = None
    escalated: bool = False  # SIGTERM/SIGKILL were needed
    cancel: bool = False
    timers: list[asyncio.TimerHandle] = field(default_factory=list)

    def clear_timers(self) -> None:
        for t in self.timers:
            t.cancel()
        self.timers.clear()


class Broker:
    def __init__(self, config: BrokerConfig, store: Store, launcher: Launcher, policy: Policy):
        self.config = config
        self.store = store
        self.launcher = launcher
        self.policy = policy
        self.state = State(
            nodes={n: Node(n, tuple(range(len(d)))) for n, d in config.nodes.items()}
        )
        self.specs: dict[int, JobSpec] = {}
        self.names: dict[str, int] = {}
        self._next_id = store.next_job_id()  # only this broker writes the store
        self.live: dict[int, LiveRun] = {}
        self.draining = False
        self._end_reached = False
        self.started_at = time.time()
        self._wake = asyncio.Event()
        self._due: float | None = None  # when the policy wants to decide again, unasked
        self._idle = asyncio.Event()  # set when draining and nothing runs any more
        self._tasks: set[asyncio.Task] = set()
        self._cancel_pending: set[int] = set()
        self.standby = Standbys(launcher.launch, self._spawn, self._record_event)
        self.sampler = None  # an NvmlSampler of the broker's node, when it has real GPUs
        self._sampled_at = 0.0

    # ------------------------------------------------------------ paths

    def job_dir(self, job_id: int) -> Path:
        return self.config.state_dir / "jobs" / str(job_id)

    # ------------------------------------------------------------ start-up

    def recover(self) -> None:
        """Rebuild the state from the store; re-adopt runs whose process still lives."""
        open_runs = {r.job_id: r for r in self.store.runs() if r.ended_at is None}
        for row in self.store.jobs():
            spec = JobSpec.from_mapping(_spec_doc(row))
            self.specs[row.id] = spec
            if row.name:
                self.names[row.name] = row.id
            state = JobState(row.state)
            job = Job(row.id, row.demand, row.malleable, tuple(row.after), row.nodes,
                      suspensions=row.suspensions, not_before=row.not_before,
                      max_share=row.max_share)
            if row.not_before is not None:
                self._wake_at(row.not_before)
            run = open_runs.get(row.id)
            parts = placement_parts(run.node, run.gpu_ids) if run is not None else []
            if state.holds_gpus and parts and all(n in self.config.nodes for n, _ in parts):
                # Adopt the run: if its process still lives it is watched,
                # if it ended while no broker watched, its exit is handled right away.
                (node, gpus), *others = parts
                placement = Placement(node, gpus, tuple(others), run.share)
                self.state.submit(replace(job, state=state, role=Role(run.role),
                                          placement=placement, expected_end=self._expected_end(
                                              row.id, run.started_at, run.start_step or 0,
                                              len(gpus), run.share)))
                pid, pid_start = run.pid, run.pid_start
                if pid is None:  # the broker died before it could record the pid
                    pid = find_run_process(str(self.job_dir(job.id)), run.id)
                    pid_start = process_start_time(pid) if pid else None
                    if pid:
                        with self.store.tx() as s:
                            row_run = s.get(RunRow, run.id)
                            row_run.pid, row_run.pid_start = pid, pid_start
                handle = self.launcher.adopt(pid or 0, pid_start, self.job_dir(job.id), run.id)
                self._record_event("adopted", job.id, run.id, pid=pid, alive=handle.signal(0))
                live = LiveRun(run.id, handle, run.start_step or 0, reason="broker restart")
                self._watch(job.id, live)
                if state is JobState.SUSPENDING:  # asked before the restart: still escalate
                    live.timers.append(asyncio.get_running_loop().call_later(
                        self.config.suspend_timeout, self._no_ack, job.id, live))
                continue
            if run is not None:
                # Its node is not ours any more: the allocation it ran in has ended.
                self._end_run(job.id, run.id, exit_code=None, reason=JobState.SUSPENDED.value,
                              detail=f"node {run.node} left with its allocation before the run "
                                     "was suspended; resumes from its last checkpoint")
            if state.holds_gpus:
                state = JobState.SUSPENDED
            self.state.submit(replace(job, state=state))
        self._wake.set()

    # ------------------------------------------------------------ the loop

    async def run(self) -> None:
        """Decide and act until the drain has finished."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGUSR1, self.check_acks, True)
        self._spawn(self._monitor())
        while not (self.draining and not self.live):
            await self._wake.wait()
            self._wake.clear()
            if not self.draining:
                await self._reconcile()
                self._due = self.policy.next_decision(self.state, time.time())
        self._idle.set()

    async def _reconcile(self) -> None:
        while not self.draining:
            now = time.time()
            actions = self.policy.decide(self.state, now)
            if not actions:
                return
            applied = [(a, self.state.apply(a, now)) for a in actions]
            for action, job in applied:
                if isinstance(action, Start):
                    await self._launch(job, action)
                elif isinstance(action, Suspend):
                    self._suspend(job, action.reason)
                elif isinstance(action, Cancel):
                    self._finish_job(job.id, JobState.CANCELLED, action.reason)

    async def _monitor(self) -> None:
        while True:
            await asyncio.sleep(self.config.monitor_interval)
            self.check_acks()
            if self.sampler and time.time() >= self._sampled_at + self.config.sample_interval:
                self._record_gpu_samples()
            if self._due is not None and self._due <= time.time():
                self._due = None  # set again after the decision
                self._wake.set()  # a time-driven policy (slices, stable periods) wants to decide
            end = self.config.end_time
            if (end is not None and not self._end_reached
                    and time.time() >= end - self.config.drain_before):
                self._end_reached = True
                self._spawn(self.drain(f"the allocation ends at {time.ctime(end)}"))
            if (self.config.prestart == "ahead" and not self.draining
                    and getattr(self.policy, "promotes_secondaries", False)):
                for job_id in self.live:
                    job = self.state.jobs[job_id]
                    if job.role is Role.SECONDARY and job.state is JobState.RUNNING:
                        self._prestart(job, once_training=True)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------ requests

    def submit(self, specs: list[JobSpec]) -> list[JobRow]:
        """Accept all of `specs` or none: every check happens before anything is stored.
        The stored rows, in order."""
        if self.draining:
            raise Refused("the broker is shutting down; submit to the next broker", 503)
        if not self.state.nodes:
            raise Refused("the broker has no GPUs", 503)
        node_max = self.state.max_node_size
        sizings = []
        for i, spec in enumerate(specs):
            try:
                if spec.nodes > 1 and not getattr(self.policy, "multi_node", False):
                    raise SpecError("nodes", f"policy {self.policy.name} runs single-node jobs "
                                             "only; use --policy marble or rigid")
                sizings.append(size_job(spec, self.config.book, node_max, len(self.state.nodes)))
            except SpecError as exc:
                raise Refused(_in_batch(i, len(specs), exc), 400, exc.field) from None
        batch_names: dict[str, int] = {}  # taken into self.names once all are accepted
        with self.store.tx() as s:
            first = self._next_id
            resolved = []
            for i, spec in enumerate(specs):
                job_id = first + i
                after = []
                for ref in spec.after:
                    dep = (batch_names.get(ref, self.names.get(ref)) if isinstance(ref, str)
                           else ref)
                    if dep is None or dep >= job_id or (dep < first and dep not in self.specs):
                        raise Refused(
                            _in_batch(i, len(specs), SpecError(
                                "after", f"'{ref}' is not an earlier job (give the id or "
                                "name of a job submitted before this one)")),
                            400, "after")
                    after.append(dep)
                if spec.name:
                    batch_names[spec.name] = job_id
                resolved.append(tuple(after))
            now = time.time()
            rows = []
            for i, (spec, sizing, after) in enumerate(zip(specs, sizings, resolved, strict=True)):
                rows.append(JobRow(
                    id=first + i, name=spec.name, model=spec.model, steps=spec.steps,
                    gpus_request=spec.gpus, demand=sizing.demand, malleable=sizing.malleable,
                    max_share=sizing.max_share,
                    nodes=spec.nodes, retries=spec.retries,
                    command=list(spec.command), emulate=spec.emulate, after=list(after),
                    state=JobState.QUEUED.value, step=0, suspensions=0, submitted_at=now,
                    failures=0,
                ))
                s.add(rows[-1])
                self.store.log(s, "submitted", first + i, at=now, demand=sizing.demand,
                               malleable=sizing.malleable)
        for i, (spec, sizing, after) in enumerate(zip(specs, sizings, resolved, strict=True)):
            job_id = first + i
            self.specs[job_id] = spec
            self.state.submit(Job(job_id, sizing.demand, sizing.malleable, after, spec.nodes,
                                  max_share=sizing.max_share))
        self.names.update(batch_names)
        self._next_id = first + len(specs)
        self._wake.set()
        return rows

    def suspend(self, job_id: int) -> None:
        """Checkpoint a running job and put it back in the FIFO at its place (user request)."""
        job = self.state.jobs.get(job_id)
        if job is None:
            raise Refused(f"no job {job_id}", 404)
        if job.state is not JobState.RUNNING or job_id not in self.live:
            raise Refused(f"job {job_id} is {job.state}; only a running job can be suspended",
                          409)
        if not job.malleable:
            raise Refused(f"job {job_id} has a fixed GPU count and cannot checkpoint; "
                          "cancel it instead", 409)
        self._suspend_now(job_id, "requested by the user")

    def cancel(self, job_id: int) -> None:
        job = self.state.jobs.get(job_id)
        if job is None:
            raise Refused(f"no job {job_id}", 404)
        if job.state.finished:
            raise Refused(f"job {job_id} has already ended ({job.state})", 409)
        live = self.live.get(job_id)
        if live is None and job.state.holds_gpus:
            self._cancel_pending.add(job_id)  # its process is being started right now
        elif live is None:
            self._finish_job(job_id, JobState.CANCELLED, "cancelled by the user")
        else:
            live.cancel = True
            self._stop(job_id, live, "cancelled by the user")
        self._wake.set()

    async def drain(self, reason: str) -> None:
        """Suspend every running job to its checkpoint, record it, and stop."""
        if not self.draining:
            self.draining = True
            self._record_event("drain", reason=reason)
            self.standby.drop_all()
            for job in list(self.state.jobs.values()):
                if job.state is JobState.RUNNING and job.id in self.live:
                    self._suspend_now(job.id, reason)
                elif job.state is JobState.SUSPENDING and job.resume_on is not None:
                    # A promotion under way: keep the suspension, forget the reservation.
                    self.state.drop_reservation(job.id)
            self._wake.set()
        await self._idle.wait()

    # ------------------------------------------------------------ effects

    async def _launch(self, job: Job, action: Start) -> None:
        jdir = self.job_dir(job.id)
        (jdir / "checkpoint").mkdir(parents=True, exist_ok=True)
        for stale in (ACK_FILE, PROGRESS_FILE, SUSPEND_FILE):
            (jdir / stale).unlink(missing_ok=True)
        now = time.time()
        with self.store.tx() as s:
            row = s.get(JobRow, job.id)
            start_step = row.step
            resumed = row.started_at is not None
            parts = ((action.node, action.gpus), *action.others)
            node_col, gpus_col = placement_columns(parts)
            run = RunRow(job_id=job.id, node=node_col, gpu_ids=gpus_col,
                         gpu_count=sum(len(g) for _, g in parts), share=action.share,
                         role=action.role.value, started_at=now, start_step=start_step)
            s.add(run)
            s.flush()
            run_id = run.id
            row.state, row.not_before = JobState.RUNNING.value, None
            row.started_at = row.started_at or now
            self.store.log(s, "resumed" if resumed else "started", job.id, run_id, at=now,
                           node=node_col, gpus=list(action.gpus), role=action.role.value,
                           step=start_step, **({"others": action.others} if action.others
                                               else {}),
                           **({"share": action.share} if action.share > 1 else {}))
        self.state.expect(job.id, self._expected_end(job.id, now, start_step, len(action.gpus),
                                                     action.share))
        devices = tuple(self.config.nodes[action.node][g] for g in action.gpus)
        others = tuple((n, tuple(self.config.nodes[n][g] for g in gpus))
                       for n, gpus in action.others)
        run_env = {"MARBLE_RUN_ID": str(run_id), "MARBLE_GPUS": str(len(devices)),
                   "MARBLE_GPU_SHARE": str(action.share),
                   "MARBLE_ROLE": action.role.value, "MARBLE_LAUNCH_TIME": repr(time.time())}
        handle = await self.standby.take(job.id, {**run_env, "devices": devices})
        if handle is None:
            request = replace(self._request(job.id, action.node, devices, run_env),
                              others=others)
            try:
                handle = await self.launcher.launch(request)
            except OSError as exc:
                self._end_run(job.id, run_id, exit_code=None, reason="failed",
                              outcome=JobState.FAILED,
                              detail=f"could not start {request.argv[0]!r}: {exc.strerror or exc}")
                self.state.finished(job.id, JobState.FAILED)
                return
        placed_by_launcher = hasattr(handle, "placement")  # the batch system picks the GPUs
        with self.store.tx() as s:
            r = s.get(RunRow, run_id)
            r.pid, r.pid_start = handle.pid, handle.pid_start
            if not placed_by_launcher:
                r.devices = ",".join(devices)
        live = LiveRun(run_id, handle, start_step)
        self._watch(job.id, live)
        if placed_by_launcher:
            self._spawn(self._record_placement(job.id, run_id, handle))
        # A cancel or a drain that came while the process was being started.
        if job.id in self._cancel_pending:
            self._cancel_pending.discard(job.id)
            live.cancel = True
            self._stop(job.id, live, "cancelled by the user")
        elif self.draining:
            self._suspend_now(job.id, "shutdown")

    def _expected_end(self, job_id: int, started_at: float, start_step: int,
                      gpus: int, share: int = 1) -> float | None:
        """When a run should end by its profile curve (None without a curve or a step count);
        policies that weigh the time left read it."""
        spec = self.specs[job_id]
        curve = self.config.book.lookup(spec.model) if spec.model else None
        if curve is None or not spec.steps:
            return None
        scale = self.config.time_scale if spec.emulate else 1.0
        return started_at + (spec.steps - start_step) / curve.throughput(gpus, share) * scale

    def _wake_at(self, when: float) -> None:
        """Decide again at Unix time `when` (a retry's back-off ends)."""
        asyncio.get_running_loop().call_later(max(0.0, when - time.time()), self._wake.set)

    async def _record_placement(self, job_id: int, run_id: int, handle) -> None:
        """Record where the batch system really put a run (which GPUs, which step)."""
        info = await handle.placement()
        if info:
            with self.store.tx() as s:
                s.get(RunRow, run_id).devices = info.get("gpus")
                self.store.log(s, "placed", job_id, run_id, node=info.get("node"),
                               devices=info.get("gpus"), step=info.get("step_id"),
                               host=info.get("host"))

    def _request(self, job_id: int, node: str, devices: tuple[str, ...],
                 run_env: dict[str, str]) -> LaunchRequest:
        spec = self.specs[job_id]
        jdir = self.job_dir(job_id)
        env = {
            "MARBLE_JOB_ID": str(job_id),
            "MARBLE_RUN_DIR": str(jdir),
            "MARBLE_CHECKPOINT_DIR": str(jdir / "checkpoint"),
            **run_env,
        }
        if node == self.config.broker_node:  # a signal cannot reach the broker from elsewhere
            env["MARBLE_BROKER_PID"] = str(os.getpid())
        if spec.steps:
            env["MARBLE_TARGET_STEPS"] = str(spec.steps)
        if spec.model:
            env["MARBLE_MODEL"] = spec.model
        if spec.emulate:
            env["MARBLE_PROFILE"] = self.config.profile_ref
            env["MARBLE_TIME_SCALE"] = repr(self.config.time_scale)
        argv = spec.command or (sys.executable, "-m", "marbled.worker.emulate")
        return LaunchRequest(tuple(argv), env, node, devices, jdir,
                             jdir / "stdout.log", jdir / "stderr.log")

    # -- prestart: the resumed process imports its framework while the old one checkpoints

    def _prestart(self, job: Job, once_training: bool = False) -> None:
        """Start the process of the job's next run now, on no GPU, waiting for its go file."""
        if self.config.prestart == "off" or job.id in self.standby or not job.placement \
                or not worth_prestarting(self.job_dir(job.id), once_training):
            return
        go = self.job_dir(job.id) / GO_FILE
        self.standby.start(job.id, go, self._request(job.id, job.placement.node, (), {
            "MARBLE_STANDBY_FILE": str(go), "MARBLE_LAUNCH_TIME": repr(time.time())}))

    def _watch(self, job_id: int, live: LiveRun) -> None:
        self.live[job_id] = live

        async def wait_exit() -> None:
            code = await live.handle.wait()
            self._on_exit(job_id, live, code)

        self._spawn(wait_exit())

    def _suspend_now(self, job_id: int, reason: str) -> None:
        """Suspend a running job outside the policy (user, drain); it will wait in the FIFO."""
        self._suspend(self.state.apply(Suspend(job_id, None, reason)), reason)

    def _suspend(self, job: Job, reason: str) -> None:
        live = self.live[job.id]
        live.reason = reason
        if not job.malleable:
            # A rigid job cannot checkpoint: stop it; it will start again from scratch.
            self._stop(job.id, live, reason)
            return
        atomic_write_json(self.job_dir(job.id) / SUSPEND_FILE,
                          {"run_id": live.run_id, "at": time.time()}, durable=False)
        live.handle.signal(signal.SIGTSTP)
        with self.store.tx() as s:  # a broker that restarts now knows to expect its ack
            s.get(JobRow, job.id).state = JobState.SUSPENDING.value
            self.store.log(s, "suspend-requested", job.id, live.run_id, reason=reason)
        if not self.draining:
            self._prestart(job)
        loop = asyncio.get_running_loop()
        live.timers.append(
            loop.call_later(self.config.suspend_timeout, self._no_ack, job.id, live)
        )

    def _no_ack(self, job_id: int, live: LiveRun) -> None:
        if self.live.get(job_id) is live and live.acked is None:
            self._record_event("suspend-timeout", job_id, live.run_id,
                               timeout=self.config.suspend_timeout)
            self._stop(job_id, live, live.reason or "suspend timed out")

    def _stop(self, job_id: int, live: LiveRun, reason: str) -> None:
        """SIGTERM now, SIGKILL after the kill timeout."""
        live.escalated = True
        live.handle.signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        live.handle.signal(signal.SIGTERM)
        self._record_event("stop", job_id, live.run_id, signal="SIGTERM", reason=reason)
        live.timers.append(asyncio.get_running_loop().call_later(
            self.config.kill_timeout, self._kill, job_id, live))

    def _kill(self, job_id: int, live: LiveRun) -> None:
        if self.live.get(job_id) is live:
            live.escalated = True
            live.handle.signal(signal.SIGKILL)
            self._record_event("stop", job_id, live.run_id, signal="SIGKILL")

    def check_acks(self, by_signal: bool = False) -> None:
        """SIGUSR1 or the monitor tick: look for acknowledgements of suspending runs.

        The marker file says which run and which step. A SIGUSR1 that comes with no
        marker (a job speaking only the paper's protocol) acknowledges the one run
        being suspended; with several, their markers or exits decide.
        """
        waiting = [(job_id, live) for job_id, live in self.live.items()
                   if live.acked is None
                   and self.state.jobs[job_id].state is JobState.SUSPENDING]
        found = [self._read_ack(job_id, live) for job_id, live in waiting]
        if by_signal and len(waiting) == 1 and not any(found):
            job_id, live = waiting[0]
            self._accept_ack(job_id, live, {"run_id": live.run_id, "step": None,
                                            "via": "SIGUSR1"})

    def _read_ack(self, job_id: int, live: LiveRun) -> bool:
        ack = read_json(self.job_dir(job_id) / ACK_FILE)
        if ack is None or ack.get("run_id") != live.run_id:
            return False
        self._accept_ack(job_id, live, {**ack, "via": "marker"})
        return True

    def _accept_ack(self, job_id: int, live: LiveRun, ack: dict) -> None:
        live.acked = ack
        live.clear_timers()
        latency = (time.time() - ack["signalled_at"]) if ack.get("signalled_at") else None
        self._record_event("acknowledged", job_id, live.run_id, step=ack.get("step"),
                           latency=latency, via=ack["via"], save_seconds=ack.get("save_seconds"))
        # It should exit on its own now; do not let a slow teardown hold the GPUs.
        live.timers.append(asyncio.get_running_loop().call_later(
            self.config.kill_timeout, self._kill, job_id, live))

    # ------------------------------------------------------------ exits

    def _on_exit(self, job_id: int, live: LiveRun, code: int | None) -> None:
        self.live.pop(job_id, None)
        job = self.state.jobs[job_id]
        if live.acked is None:
            # It may have exited before we saw its marker -- or before a broker that
            # restarted knew it had been asked to suspend.
            self._read_ack(job_id, live)
        live.clear_timers()
        spec = self.specs[job_id]
        progress = read_json(self.job_dir(job_id) / PROGRESS_FILE) or {}
        if progress.get("run_id") != live.run_id:
            progress = {}
        end = run_outcome(code=code, cancelled=live.cancel,
                          suspending=job.state is JobState.SUSPENDING, escalated=live.escalated,
                          reason=live.reason, ack=live.acked,
                          progress_step=progress.get("step"), target_steps=spec.steps)
        outcome, why, end_step = end.outcome, end.why, end.end_step
        extra, retry_at = {}, None
        if outcome is JobState.FAILED:
            extra["stderr_tail"] = self._stderr_tail(job_id)
            cause = memory_cause(extra["stderr_tail"])
            if cause:
                why, extra["cause"] = f"{why}: {cause}", cause
            failures = self.store.jobs([job_id])[0].failures
            if failures < spec.retries:
                delay = self.config.retry_delay * 2 ** failures
                retry_at = time.time() + delay
                why = f"{why}; retry {failures + 1} of {spec.retries} in {delay:g} s"
                extra["retry_in"] = delay
        restored = progress.get("start_step")
        if restored is not None and restored < live.start_step:
            # The job could not use the checkpoint it acknowledged: say so, never silently.
            self._record_event("checkpoint-fallback", job_id, live.run_id,
                               expected=live.start_step, restored=restored,
                               detail=f"resumed from step {restored}, not {live.start_step}: "
                                      "its newest checkpoint was missing or unreadable")
        self._end_run(job_id, live.run_id, exit_code=code, reason=outcome.value, detail=why,
                      end_step=end_step, start_step=progress.get("start_step"),
                      outcome=outcome, phases=progress.get("phases"), retry_at=retry_at,
                      **extra)
        if retry_at is not None:
            self.state.suspended(job_id, not_before=retry_at)
            self._wake_at(retry_at)
        elif outcome is JobState.SUSPENDED:
            self.state.suspended(job_id)
        else:
            self.state.finished(job_id, outcome)
            self.standby.drop(job_id)
        self._wake.set()

    # ------------------------------------------------------------ records

    def _stderr_tail(self, job_id: int) -> str:
        path = self.job_dir(job_id) / "stderr.log"
        try:
            with open(path, "rb") as f:
                f.seek(max(0, path.stat().st_size - TAIL_BYTES))
                return tail(f.read())
        except OSError:
            return ""

    def _end_run(self, job_id: int, run_id: int, *, exit_code: int | None, reason: str,
                 detail: str, end_step: int | None = None, start_step: int | None = None,
                 outcome: JobState = JobState.SUSPENDED, phases: dict | None = None,
                 retry_at: float | None = None, **extra) -> None:
        """Close a run and record its outcome; `extra` goes into the event (e.g. stderr).
        A failed run with `retry_at` leaves its job waiting for a retry from then on."""
        now = time.time()
        with self.store.tx() as s:
            run = s.get(RunRow, run_id)
            run.ended_at, run.exit_code, run.end_reason = now, exit_code, reason
            run.end_step = end_step
            if start_step is not None:
                run.start_step = start_step
            row = s.get(JobRow, job_id)
            row.state = outcome.value
            if end_step is not None:
                row.step = end_step
            if outcome is JobState.FAILED:
                row.failures += 1
            if retry_at is not None:
                row.state, row.not_before = JobState.SUSPENDED.value, retry_at
                row.suspensions += 1
            elif outcome is JobState.SUSPENDED:
                row.suspensions += 1
            else:
                row.finished_at, row.exit_code = now, exit_code
            row.reason = detail
            if phases:
                extra["phases"] = phases
            self.store.log(s, reason, job_id, run_id, at=now, exit_code=exit_code,
                           step=end_step, detail=detail, **extra)

    def _finish_job(self, job_id: int, state: JobState, reason: str) -> None:
        """End a job that is not running (a cancel, a dependency that can never be met)."""
        if not self.state.jobs[job_id].state.finished:
            self.state.finished(job_id, state)
        self.standby.drop(job_id)
        now = time.time()
        with self.store.tx() as s:
            row = s.get(JobRow, job_id)
            row.state, row.finished_at, row.reason = state.value, now, reason
            self.store.log(s, state.value, job_id, at=now, reason=reason)

    def _record_gpu_samples(self) -> None:
        """One NVML reading of every GPU of the broker's node, with the job holding it."""
        self._sampled_at = now = time.time()
        node = self.config.broker_node
        devices = self.config.nodes.get(node, ())
        holder = {devices[g]: job.id for job in self.state.engaged() if job.placement
                  for n, gpus in job.placement.parts() if n == node for g in gpus}
        with self.store.tx() as s:
            for g in self.sampler.sample():
                s.add(GpuSampleRow(at=now, node=node, device=g.device,
                                   job_id=holder.get(g.device), util_gpu=g.util_gpu,
                                   util_mem=g.util_mem, mem_used=g.mem_used,
                                   mem_total=g.mem_total))

    def _record_event(self, kind: str, job_id: int | None = None, run_id: int | None = None,
                      **data) -> None:
        with self.store.tx() as s:
            self.store.log(s, kind, job_id, run_id, **data)

    # ------------------------------------------------------------ views

    def job_view(self, row: JobRow) -> dict:
        job = self.state.jobs.get(row.id)
        view = {
            "id": row.id, "name": row.name, "model": row.model, "steps": row.steps,
            "state": (job.state if job else JobState(row.state)).value,
            "role": job.role.value if job and job.role else None,
            "node": (",".join(n for n, _ in job.placement.parts())
                     if job and job.placement else None),
            "gpus": [g for _, gs in job.placement.parts() for g in gs]
                    if job and job.placement else [],
            "demand": row.demand, "nodes": row.nodes, "retries": row.retries,
            "failures": row.failures, "not_before": row.not_before, "malleable": row.malleable,
            "gpus_request": "auto" if row.gpus_request is None else row.gpus_request,
            "step": row.step, "suspensions": row.suspensions, "after": row.after,
            "command": row.command, "emulate": row.emulate,
            "submitted_at": row.submitted_at, "started_at": row.started_at,
            "finished_at": row.finished_at, "exit_code": row.exit_code, "reason": row.reason,
        }
        live = self.live.get(row.id)
        if live:
            progress = read_json(self.job_dir(row.id) / PROGRESS_FILE)
            if progress and progress.get("run_id") == live.run_id:
                view["step"] = progress["step"]
        return view

    def status(self) -> dict:
        counts: dict[str, int] = {}
        for job in self.state.jobs.values():
            counts[job.state.value] = counts.get(job.state.value, 0) + 1
        return {
            "pid": os.getpid(),
            "policy": self.policy.name,
            "profile": self.config.book.system,
            "nodes": {n: {"gpus": list(d), "free": self.state.free(n)}
                      for n, d in self.config.nodes.items()},
            "jobs": counts,
            "draining": self.draining,
            "started_at": self.started_at,
            "time_scale": self.config.time_scale,
        }


def _spec_doc(row: JobRow) -> dict:
    doc = {"emulate": row.emulate, "model": row.model, "steps": row.steps,
           "gpus": row.gpus_request or "auto", "after": row.after, "name": row.name,
           "nodes": row.nodes, "retries": row.retries}
    if row.command:
        doc["command"] = row.command
    return {k: v for k, v in doc.items() if v is not None}


def _in_batch(index: int, total: int, exc: SpecError) -> str:
    return str(exc) if total == 1 else f"jobs[{index}].{exc}"
