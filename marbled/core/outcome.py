"""How a run ended, from what the broker saw of it (pure).

The broker knows whether the user cancelled the run, whether it had asked the
run to suspend (and with what reason), whether it had to force it (SIGTERM or
SIGKILL), the exit code, the job's acknowledgement and its last progress report.

A run adopted after a broker restart is not the broker's child: its exit code is
the one its supervisor recorded (marbled.batch.supervise), so a finished run is
done or failed with its true code, never run again. The code is None only when
no record exists (the run never started, its supervisor was killed, or it ran
under a batch system's step): then the job's own files decide, as far as they
can: an acknowledgement is a checkpoint on disk; a last report at the job's last
step means it finished (a worker saves its last step before it reports it);
otherwise the outcome is unknown and the run is run again, from where it started
(it never reported, so never restored: it trained nothing the broker knows of)
or from its last checkpoint, and its why says so.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from marbled.core.model import JobState

RECOVERED = "recovered after a broker restart"
UNKNOWN = "outcome unknown: run again"  # no exit status, no process, nothing in its files


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
    # An exit 0 as the broker stopped or cancelled the run is its completion (its exit raced
    # the signal, or it finished what it was doing first; exit 0 is success, as a batch
    # system counts it): run again, a plain command would complete twice (lifecycle I2).
    # Not when it acknowledged a checkpoint, or its own report says steps are left: then it
    # made a graceful stop.
    left = target_steps is not None and end_step is not None and end_step < target_steps
    completed = code == 0 and not ack and not left
    if cancelled:
        outcome, why = (JobState.DONE, "done as it was cancelled (exit 0)") if completed \
            else (JobState.CANCELLED, "cancelled by the user")
    elif code is None and reached:  # exit not observed: the files say it finished
        outcome, why = JobState.DONE, "done"
    elif code is None and not ack:  # exit not observed, and the files do not say
        outcome, why = JobState.SUSPENDED, UNKNOWN
    elif suspending or ack:
        if ack:
            outcome, why = (JobState.DONE, "done") if reached else (JobState.SUSPENDED, reason)
        elif code == 0 and not escalated:
            outcome, why = JobState.DONE, "done before it saw the suspension"
        elif completed:
            outcome, why = JobState.DONE, "done as it was stopped (exit 0)"
        elif escalated:
            outcome, why = JobState.SUSPENDED, f"{reason}: stopped without a checkpoint"
        else:
            outcome, why = JobState.FAILED, f"exited with {code} while suspending"
    elif code == 0:
        outcome, why = JobState.DONE, "done"
    else:
        outcome, why = JobState.FAILED, f"exited with {describe_exit(code)}"
    if outcome is JobState.DONE and end_step is None:
        end_step = target_steps
    if outcome is JobState.SUSPENDED and not ack and code is None:
        # Not known to have finished: it starts again, where it last started or from the
        # last checkpoint it made (the next run reports which).
        if progress_step is None:
            end_step = start_step
            if start_step:
                why = f"{why} from step {start_step} (no step reported)"
        else:
            why, end_step = f"{why} from its last checkpoint (last reported step " \
                f"{progress_step})", None
    elif outcome is JobState.SUSPENDED and not ack:
        if progress_step is None and start_step is not None:
            # It never reported, so never restored its checkpoint: it trained nothing.
            why, end_step = f"{why} (no step reported: resumes from step {start_step})", \
                start_step
        else:
            # Stopped by force: the step it reached and the step of its last checkpoint
            # are unknown (progress reports lag); the next run reports where it resumed.
            why, end_step = f"{why} (last reported step {end_step})", None
    if recovered:
        why = f"{RECOVERED}: {_recovered_why(outcome, ack, end_step, code, why)}"
    return RunEnd(outcome, why or "suspended", end_step)


# How a batch system ends the steps of an allocation that ends: SIGTERM, then SIGKILL
# (Slurm: SIGCONT and SIGTERM, KillWait later SIGKILL); srun's own SIGINT or SIGHUP
ALLOCATION_END_SIGNALS = frozenset({signal.SIGTERM, signal.SIGKILL, signal.SIGINT,
                                    signal.SIGHUP})


def ended_with_allocation(code: int | None, said: dict | None) -> bool:
    """Whether a run whose node left with its allocation was ended by that end, not by
    itself: it exited non-zero, and the batch system's record says it ended the step (not
    for running out of memory), or a signal the batch system ends steps with killed it.
    Such an exit is not the job's failure: it runs again from its last checkpoint."""
    if not code:
        return False
    if said is not None:
        return said.get("state") != "OUT_OF_MEMORY"
    return code < 0 and -code in ALLOCATION_END_SIGNALS


def _recovered_why(outcome: JobState, ack: dict | None, end_step: int | None,
                   code: int | None, why: str | None) -> str | None:
    """How a run that ended while no broker watched did end: its recorded exit code, or
    what its files showed."""
    if outcome is JobState.DONE and code is not None:
        return f"done (exited with {describe_exit(code)})"
    if outcome is JobState.DONE:
        return f"done (its last report: step {end_step})"
    if outcome is JobState.SUSPENDED and ack:
        return f"suspended at its checkpoint of step {end_step}"
    return why


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"
