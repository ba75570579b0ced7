"""A broker's start on a state directory: rebuild the state from the store, adopt open runs.

A run the store shows as open is adopted if its node is still the broker's: if
its process lives it is watched until it exits; if it ended while no broker
watched, its exit is handled at once. Nothing is started twice: if the last
broker died between writing a run's row and recording its pid, the process is
found by its environment. A run on a node that is no longer the broker's ended
with its allocation.

A process that is not the broker's child has an exit code the broker cannot
wait for: its supervisor (marbled.batch.supervise; a per-GPU run's ranks process)
records it in the run's exit file, so a finished run is done or failed with its
true code, and never run again (lifecycle I2). Without that record (a run under a
batch system's step, or one whose supervisor was killed) the job's own files say
what they can (`core/outcome.py`): its acknowledged checkpoint, its last progress
report (at the job's last step: done, with no relaunch), or nothing: then the
outcome is unknown and the run is run again, and its record says so ("outcome
unknown: run again"). Its detail says "recovered after a broker restart".

Only the unfinished jobs (and those whose run is open) are read and rebuilt: a job that
ended is what the store records of it, and the broker asks the store when it needs one (a
dependency, a name, a view). The state counts the ended ones all the same (`ended_before`).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace

from marbled.batch.local import find_launched_process, process_start_time
from marbled.core.model import Job, JobState, Placement, Role
from marbled.core.outcome import RunEnd, ended_with_allocation, run_outcome
from marbled.core.spec import JobSpec
from marbled.daemon.live_run import LiveRun
from marbled.daemon.runs import Runs
from marbled.store.db import Store, job_spec, recorded_job
from marbled.store.schema import placement_parts

# The broker's side, as callbacks: a job enters the state (with the steps it has done); an
# adopted run's expected end, from (job, started at, start step, GPUs, share); a wake-up at.
Add = Callable[[Job, JobSpec, int], None]
Expect = Callable[[int, float, int, int, int], None]
# The jobs that ended before, which the state does not hold: their counts by state, and the
# ids of those submitted after the oldest job it holds (`State.ended_before`).
EndedBefore = Callable[[Mapping[JobState, int], Iterable[int]], None]
UNFINISHED = tuple(s.value for s in JobState if not s.finished)
FINISHED = tuple(s.value for s in JobState if s.finished)


def recover(store: Store, runs: Runs, nodes: Collection[str], add: Add, expect: Expect,
            wake_at: Callable[[float], None], ended_before: EndedBefore) -> None:
    """Rebuild the unfinished jobs of `store` through `add`, adopt their open runs on `nodes`
    into `runs`, and count the ended ones through `ended_before`."""
    # Only the open runs (an index of them), and the unfinished jobs as light records (plain
    # SQL, no ORM objects): what a start reads is what is live, not every job ever.
    open_runs = {r.job_id: r for r in store.open_runs()}
    environments = store.environments()
    rows = store.job_page(states=UNFINISHED, also=list(open_runs))
    ended = {JobState(s): n for s, n in store.job_counts().items() if s in FINISHED}
    for row in rows:
        if row.state in FINISHED:  # read for its open run: counted as it is settled
            ended[JobState(row.state)] -= 1
    held = {row.id for row in rows}
    ended_before(ended, [i for i in store.job_ids(FINISHED, after=rows[0].id) if i not in held]
                 if rows else ())
    for row in rows:
        state = JobState(row.state)
        job = recorded_job(row)
        if row.not_before is not None:
            wake_at(row.not_before)
        run = open_runs.get(row.id)
        parts = placement_parts(run.node, run.gpu_ids) if run is not None else []
        if state.holds_gpus and parts and all(n in nodes for n, _ in parts):
            # when its run started, as the broker that launched it knew: a policy moves a
            # run (promotes, reshapes, slices) only once it has run a while (`settled`)
            add(replace(job, state=state, role=Role(run.role), placement=Placement(
                *parts[0], tuple(parts[1:]), run.share), run_started=run.started_at),
                job_spec(row, environments), row.step)
            expect(job.id, run.started_at, run.start_step or 0, len(parts[0][1]), run.share)
            _adopt(runs, job.id, state, run)
            continue
        done = row.step
        if run is not None:  # its node left with its allocation, and the run with it
            code = runs.files.exit_code(row.id, run.id)
            killed = code is None and _kill_left_behind(runs, row.id, run)
            said = _ended_by(runs, row.id, run.id) if code else None
            end = _unwatched_end(runs, row, run, state,
                                 None if ended_with_allocation(code, said) else code)
            why = f"{end.why}: {said['detail']}" if said else end.why
            runs.ledger.run_ended(
                job.id, run.id, at=runs.clock.time(), exit_code=code,
                reason=end.outcome.value, outcome=end.outcome, end_step=end.end_step,
                start_step=runs.files.progress(row.id, run.id).get("start_step"),
                detail=f"{why}; node {run.node} left with its allocation" + (
                    "; its process still ran on this host: killed" if killed else ""),
                recovered=True,
                **({"ended_by": said} if said else {}))
            state, done = end.outcome, done if end.end_step is None else end.end_step
        elif state.holds_gpus:
            state = JobState.SUSPENDED
        add(replace(job, state=state), job_spec(row, environments), done)


def _kill_left_behind(runs: Runs, job_id: int, run) -> bool:
    """Kill the process of a run on a node this allocation does not have, where it still
    lives on this host (nodes emulated on this machine, or an allocation not ended yet):
    its job runs again, and two runs of one job must never run at once (a plain command
    completed twice: a broker of two emulated nodes killed, the next on one). Whether it
    lived."""
    pid, pid_start = _process(runs, job_id, run)
    if pid is None:
        return False
    handle = runs.launcher.adopt(pid, pid_start, runs.files.dir(job_id), run.id)
    if not handle.signal(signal.SIGKILL):
        return False
    runs.ledger.event("stop", runs.clock.time(), job_id, run.id, signal="SIGKILL",
                      reason=f"its node {run.node} is not in this allocation")
    return True


def _ended_by(runs: Runs, job_id: int, run_id: int) -> dict | None:
    """How the batch system itself ended a run's step, from the step's stderr (Slurm's
    "CANCELLED AT" line); None for a local run, or a step Slurm did not end."""
    ended_by = getattr(runs.launcher.adopt(0, None, runs.files.dir(job_id), run_id),
                       "ended_by", None)
    return ended_by(runs.files.stderr_tail(job_id, run_id)) if ended_by else None


def _unwatched_end(runs: Runs, row, run, state: JobState, code: int | None) -> RunEnd:
    """How a run no broker saw end did end: `code`, the exit its supervisor recorded (None:
    no record, or the allocation's end made it), else what its job's files show
    (`core/outcome.py`)."""
    progress = runs.files.progress(row.id, run.id)
    return run_outcome(code=code, cancelled=False,
                       suspending=state is JobState.SUSPENDING,
                       escalated=False, reason="broker restart", ack=runs.files.ack(
                           row.id, run.id), progress_step=progress.get("step"),
                       target_steps=row.steps, start_step=run.start_step, recovered=True)


def _process(runs: Runs, job_id: int, run) -> tuple[int | None, int | None]:
    """The pid of an open run's process, and its start time; where the broker died before
    it could record them, the process launched for the run, if any (recorded now)."""
    if run.pid is not None:
        return run.pid, run.pid_start
    pid = find_launched_process(str(runs.files.dir(job_id)), run.id)
    pid_start = process_start_time(pid) if pid else None
    if pid:
        runs.ledger.run_process(run.id, pid, pid_start)
    return pid, pid_start


def _adopt(runs: Runs, job_id: int, state: JobState, run) -> None:
    """Watch the process of an open run (the job is in the state already)."""
    run_dir = runs.files.dir(job_id)
    pid, pid_start = _process(runs, job_id, run)
    handle = runs.launcher.adopt(pid or 0, pid_start, run_dir, run.id)
    alive = handle.signal(0)
    runs.ledger.event("adopted", runs.clock.time(), job_id, run.id, pid=pid, alive=alive)
    # One that ended while no broker watched is settled from its files as it is seen to end.
    live = LiveRun(job_id, run.id, handle, run.start_step or 0, reason="broker restart",
                   recovered=not alive)
    runs.watch(live)
    if state is JobState.SUSPENDING:  # asked before the restart: still escalate
        runs.expect_ack(live)
