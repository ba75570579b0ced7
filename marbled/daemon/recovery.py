"""A broker's start on a state directory: rebuild the state from the store, adopt open runs.

A run the store shows as open is adopted if its node is still the broker's: if
its process lives it is watched until it exits; if it ended while no broker
watched, its exit is handled at once. Nothing is started twice: if the last
broker died between writing a run's row and recording its pid, the process is
found by its environment. A run on a node that is no longer the broker's ended
with its allocation.

The exit code of a process that is not the broker's child is not knowable, so
the job's own files say how such a run ended (`core/outcome.py`): its
acknowledged checkpoint, its last progress report (at the job's last step: done,
with no relaunch), or none (it never restored: it ends where it started). Its
detail says "recovered after a broker restart".
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from marbled.batch.local import find_run_process, process_start_time
from marbled.core.model import Job, JobState, Placement, Role
from marbled.core.outcome import RunEnd, run_outcome
from marbled.daemon.runs import LiveRun
from marbled.store.db import job_spec, placement_parts

if TYPE_CHECKING:
    from marbled.daemon.broker import Broker


def recover(broker: Broker) -> None:
    if broker.learner:
        broker.learner.replay()
    open_runs = {r.job_id: r for r in broker.store.runs() if r.ended_at is None}
    for row in broker.store.jobs():
        if row.name:
            broker.names[row.name] = row.id
        state = JobState(row.state)
        job = Job(row.id, row.demand, row.malleable, tuple(row.after), row.nodes,
                  suspensions=row.suspensions, not_before=row.not_before,
                  max_share=row.max_share)
        if row.not_before is not None:
            broker.wake_at(row.not_before)
        run = open_runs.get(row.id)
        parts = placement_parts(run.node, run.gpu_ids) if run is not None else []
        if state.holds_gpus and parts and all(n in broker.config.nodes for n, _ in parts):
            _adopt(broker, job, job_spec(row), row.step, state, run, parts)
            continue
        done = row.step
        if run is not None:  # its node left with its allocation, and the run with it
            end = _unwatched_end(broker, row, run, state)
            broker.ledger.run_ended(
                job.id, run.id, at=broker.clock.time(), exit_code=None,
                reason=end.outcome.value, outcome=end.outcome, end_step=end.end_step,
                start_step=broker.files.progress(row.id, run.id).get("start_step"),
                detail=f"{end.why}; node {run.node} left with its allocation", recovered=True)
            state, done = end.outcome, done if end.end_step is None else end.end_step
        elif state.holds_gpus:
            state = JobState.SUSPENDED
        broker.add(replace(job, state=state), job_spec(row), done)
    broker.wake()


def _unwatched_end(broker: Broker, row, run, state: JobState) -> RunEnd:
    """How a run no broker saw end did end, from its job's files (`core/outcome.py`)."""
    progress = broker.files.progress(row.id, run.id)
    return run_outcome(code=None, cancelled=False, suspending=state is JobState.SUSPENDING,
                       escalated=False, reason="broker restart", ack=broker.files.ack(
                           row.id, run.id), progress_step=progress.get("step"),
                       target_steps=row.steps, start_step=run.start_step, recovered=True)


def _adopt(broker: Broker, job: Job, spec, done: int, state: JobState, run, parts) -> None:
    (node, gpus), *others = parts
    broker.add(replace(job, state=state, role=Role(run.role),
                       placement=Placement(node, gpus, tuple(others), run.share)), spec, done)
    broker.state.expect(job.id, broker.expected_end(job.id, run.started_at, run.start_step or 0,
                                                    len(gpus), run.share))
    run_dir = broker.files.dir(job.id)
    pid, pid_start = run.pid, run.pid_start
    if pid is None:  # the broker died before it could record the pid
        pid = find_run_process(str(run_dir), run.id)
        pid_start = process_start_time(pid) if pid else None
        if pid:
            broker.ledger.run_process(run.id, pid, pid_start)
    handle = broker.launcher.adopt(pid or 0, pid_start, run_dir, run.id)
    alive = handle.signal(0)
    broker.ledger.event("adopted", broker.clock.time(), job.id, run.id, pid=pid, alive=alive)
    # One that ended while no broker watched is settled from its files as it is seen to end.
    live = LiveRun(job.id, run.id, handle, run.start_step or 0, reason="broker restart",
                   recovered=not alive)
    broker.runs.watch(live)
    if state is JobState.SUSPENDING:  # asked before the restart: still escalate
        broker.runs.expect_ack(live)
