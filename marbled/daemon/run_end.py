"""How a run ended: the outcome of its exit code, its acknowledgement and its last report
(`core/outcome.py`), as the batch system and the run's files tell it (`run_failures.py`), and
when a failed run is retried (`Runs` records it and tells the broker)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from marbled.core.model import JobState
from marbled.core.outcome import RunEnd, ended_with_allocation, run_outcome
from marbled.daemon.live_run import LiveRun
from marbled.daemon.run_failures import failure_reason, refused_start

if TYPE_CHECKING:
    from marbled.daemon.runs import Runs


def run_end(runs: Runs, live: LiveRun, code: int | None,
            now: float) -> tuple[RunEnd, float | None, dict]:
    """How the run ended, when a failed one is retried, and what its event adds."""
    spec = runs.specs[live.job_id]
    suspending = runs.state.jobs[live.job_id].state is JobState.SUSPENDING
    progress = runs.files.progress(live.job_id, live.run_id)
    ended_by = getattr(live.handle, "ended_by", None)
    other = getattr(live.handle, "allocation_of_its_own", lambda: None)() if code else None
    said = ended_by(runs.files.stderr_tail(live.job_id, live.run_id)) if other else None
    if other and ended_with_allocation(code, said):
        # a run of an earlier allocation that ended with it, as one on a node that left
        # (recovery): not the job's failure; it runs again from its last checkpoint
        code = None
    end = run_outcome(code=code, cancelled=live.cancel, suspending=suspending,
                      escalated=live.escalated, reason=live.reason, ack=live.acked,
                      progress_step=progress.get("step"), target_steps=spec.steps,
                      start_step=live.start_step, recovered=live.recovered)
    extra: dict = {"_progress": progress}
    if live.recovered:
        extra["recovered"] = True
    if progress.get("phases"):
        extra["phases"] = progress["phases"]
    why, retry_at = end.why, None
    if other and code is None:
        why = f"{why}; its allocation {other} ended, and the run with it"
    if not ended_by or end.outcome is JobState.DONE:
        said = None
    elif not other:  # (read above for a run of another allocation)
        said = ended_by(runs.files.stderr_tail(live.job_id, live.run_id))
    refusals = runs.step_refusals.pop(live.job_id, 0) + bool(said and said.get("never_ran"))
    refused = None if live.cancel else refused_start(said, refusals, live.start_step, now)
    if refused:  # its step was not created: its command never ran
        runs.step_refusals[live.job_id] = refusals
        return refused[0], refused[1], {**extra, **refused[2]}
    if said:  # the batch system ended it (scancel, time limit, OOM): its words
        why, extra["ended_by"] = f"{why}: {said['detail']}", said
    if end.outcome is JobState.FAILED:
        why = failure_reason(runs.files, live.job_id, live.run_id, spec.per_gpu, why,
                             extra)
        failures = runs.ledger.failures(live.job_id)
        if failures < spec.retries:
            delay = runs.config.retry_delay * 2 ** failures
            retry_at = now + delay
            why = f"{why}; retry {failures + 1} of {spec.retries} in {delay:g} s"
            extra["retry_in"] = delay
    end_step = end.end_step
    if retry_at is not None and live.acked is None:
        # Its last report is not a checkpoint: the retry resumes from whatever checkpoint
        # there is, and its first report says which (as after a stop by force).
        end_step, extra["last_reported_step"] = None, end.end_step
    return RunEnd(end.outcome, why, end_step), retry_at, extra
