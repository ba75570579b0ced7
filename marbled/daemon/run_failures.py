"""Why a failed run failed, in its own words: what the broker adds to the reason of a run
that ended with `failed` from the run's files (`Runs.outcome`, `runs.py`).

A per-GPU run's failing rank (the local launcher's record, or the task srun names) and
that rank's error line, not the launcher's summary; a cause the stderr names (out of
memory); the event's `stderr_tail`.
"""

from __future__ import annotations

from marbled.batch.ranks import read_rank_failure
from marbled.core.failures import TAIL_LINES, memory_cause, rank_error, rank_lines
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
