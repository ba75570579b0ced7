"""Why a failed run failed, in its own words: what the broker adds to the reason of a run
that ended with `failed` from the run's files (`run_end.py`).

A per-GPU run's failing rank (the local launcher's record, or the task srun names) and
that rank's error line, not the launcher's summary; a cause the stderr names (out of
memory); the event's `stderr_tail`. And a run whose command never ran because the batch
system refused to create its step (`refused_start`): not a failure of the job.
"""

from __future__ import annotations

from marbled.batch.ranks import read_rank_failure
from marbled.core.failures import TAIL_LINES, memory_cause, rank_error, rank_lines
from marbled.core.model import JobState
from marbled.core.outcome import RunEnd
from marbled.daemon.workfiles import JobFiles

# where a failed per-GPU run's failing rank's last lines are looked for: its log's end
RANK_LOG_BYTES, RANK_LOG_LINES = 64 * 1024, 1000


def failure_reason(files: JobFiles, job_id: int, run_id: int, per_gpu: bool, why: str,
                   extra: dict) -> str:
    """`why` a failed run ended, with what its files add: the rank that failed, its error,
    a cause its stderr names; their details go into `extra` (the event's): rank,
    stderr_tail, error, cause."""
    failure = read_rank_failure(files.dir(job_id), run_id)
    if failure:  # one rank of a per-GPU run failed: the others were stopped
        why = f"rank {failure['rank']} of {failure['world']} {why}"
        extra["rank"] = failure["rank"]
    extra["stderr_tail"] = whole = files.stderr_tail(job_id, run_id)
    cause, error = memory_cause(whole), None
    if per_gpu:  # the failing rank's own words, not the launcher's summary
        why, error = _failing_rank(files, job_id, run_id, failure, why, extra)
        cause = cause or memory_cause(extra["stderr_tail"])
    if cause:
        why, extra["cause"] = f"{why}: {cause}", cause
    if error:
        why = f"{why}: {error}"
    return why


def _failing_rank(files: JobFiles, job_id: int, run_id: int, failure: dict | None, why: str,
                  extra: dict) -> tuple[str, str | None]:
    """A failed per-GPU run's reason naming its failing rank (the local launcher's record,
    or the task srun names), and that rank's error line (the exception of its traceback,
    else its last line): its own words, not the launcher's summary ("marbled: rank 0
    exited with 1; stopping the other 3 rank(s)"). The event's stderr_tail becomes that
    rank's last lines, found among the other ranks' in the log's last RANK_LOG_BYTES."""
    end = files.read_log(job_id, run_id, "stderr", 0, RANK_LOG_BYTES,
                         lines=RANK_LOG_LINES)["text"]
    rank, error = rank_error(end, failure["rank"] if failure else None)
    if rank is None or error is None:
        return why, None
    if not failure:  # srun said which task failed
        why, extra["rank"] = f"rank {rank} {why}", rank
    extra["stderr_tail"] = "\n".join(rank_lines(end, rank)[-TAIL_LINES:])
    extra["error"] = error
    return why, error


REFUSED_TRIES = 5  # refusals of a job's step in a row before the refusal fails the job
REFUSED_FIRST_S = 0.5  # the first wait before its next run; doubled at each refusal


def refused_start(said: dict | None, refusals: int, start_step: int | None,
                  now: float) -> tuple[RunEnd, float, dict] | None:
    """The end of a run whose step the batch system refused to create (`said["never_ran"]`,
    its `refusals`-th in a row): its command never ran, so it is run again from where it
    was to start, REFUSED_FIRST_S later and twice as long at each refusal, and not counted
    as a failure of the job; None past REFUSED_TRIES (the refusal then fails the job, as a
    step that can never be created: more GPUs than a node has) or for any other end."""
    if not said or not said.get("never_ran") or refusals > REFUSED_TRIES:
        return None
    delay = REFUSED_FIRST_S * 2 ** (refusals - 1)
    why = (f"{said['detail']}; its command never ran: again in {delay:g} s (refusal "
           f"{refusals} of at most {REFUSED_TRIES} in a row)")
    return RunEnd(JobState.SUSPENDED, why, start_step), now + delay, {"ended_by": said,
                                                                      "retry_in": delay}
