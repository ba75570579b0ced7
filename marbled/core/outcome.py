"""How a run ended, from what the broker saw of it (pure).

The broker knows whether the user cancelled the run, whether it had asked the
run to suspend (and with what reason), whether it had to force it (SIGTERM or
SIGKILL), the exit code (None when the run was adopted after a restart: it is
not the broker's child), the job's acknowledgement and its last progress report.

Without an exit code the job's own files decide: an acknowledgement is a
checkpoint on disk; a last report at the job's last step means it finished (a
worker saves its last step before it reports it); a run that never reported
never restored, so it trained nothing and ends where it started.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from marbled.core.model import JobState

RECOVERED = "recovered after a broker restart"


@dataclass(frozen=True)
class RunEnd:
    outcome: JobState  # DONE, SUSPENDED (resume later), FAILED or CANCELLED
    why: str
    end_step: int | None  # the step the job can resume from; None when not known


def run_outcome(*, code: int | None, cancelled: bool, suspending: bool, escalated: bool,
                reason: str | None, ack: dict | None, progress_step: int | None,
                target_steps: int | None, start_step: int | None = None,
                recovered: bool = False) -> RunEnd:
    """`start_step`: where the run began (its end when it never reported a step);
    `recovered`: its process ended while no broker watched (the why says so)."""
    end_step = ack.get("step") if ack else progress_step
    reached = target_steps is not None and end_step is not None and end_step >= target_steps
    if cancelled:
        outcome, why = JobState.CANCELLED, "cancelled by the user"
    elif code is None and reached:  # exit not observed: the files say it finished
        outcome, why = JobState.DONE, "done"
    elif suspending or ack:
        if ack:
            outcome, why = (JobState.DONE, "done") if reached else (JobState.SUSPENDED, reason)
        elif code == 0 and not escalated:
            outcome, why = JobState.DONE, "done before it saw the suspension"
        elif escalated or code is None:
            outcome, why = JobState.SUSPENDED, f"{reason}: stopped without a checkpoint"
        else:
            outcome, why = JobState.FAILED, f"exited with {code} while suspending"
    elif code == 0:
        outcome, why = JobState.DONE, "done"
    elif code is None:
        outcome, why = JobState.SUSPENDED, "exit not observed; resumes from its checkpoint"
    else:
        outcome, why = JobState.FAILED, f"exited with {describe_exit(code)}"
    if outcome is JobState.DONE and end_step is None:
        end_step = target_steps
    if outcome is JobState.SUSPENDED and not ack:
        if progress_step is None and start_step is not None:
            # It never reported, so never restored its checkpoint: it trained nothing.
            why, end_step = f"{why} (no step reported: resumes from step {start_step})", \
                start_step
        else:
            # Stopped by force: the step it reached and the step of its last checkpoint
            # are unknown (progress reports lag); the next run reports where it resumed.
            why, end_step = f"{why} (last reported step {end_step})", None
    if recovered:
        why = f"{RECOVERED}: {_recovered_why(outcome, ack, end_step, progress_step, why)}"
    return RunEnd(outcome, why or "suspended", end_step)


def _recovered_why(outcome: JobState, ack: dict | None, end_step: int | None,
                   progress_step: int | None, why: str | None) -> str | None:
    """What the files of a run that ended while no broker watched showed."""
    if outcome is JobState.DONE:
        return f"done (its last report: step {end_step})"
    if outcome is JobState.SUSPENDED and ack:
        return f"suspended at its checkpoint of step {end_step}"
    if outcome is JobState.SUSPENDED and progress_step is None and end_step is not None:
        return f"ended before its first report; resumes from step {end_step}"
    if outcome is JobState.SUSPENDED:
        return (f"ended without acknowledging a checkpoint (last reported step "
                f"{progress_step}); resumes from its last checkpoint")
    return why


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
