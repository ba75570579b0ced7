"""Why a run failed, read from its exit and the tail of its stderr (pure)."""

from __future__ import annotations

import re

# What frameworks and batch systems print when memory runs out.
GPU_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|OOM when allocating|RESOURCE_EXHAUSTED"
    r"|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|CUDA_ERROR_OUT_OF_MEMORY",
)
HOST_OOM = re.compile(r"oom-kill event|Out of memory: Killed process|MemoryError|oom_kill")

TAIL_LINES = 20
TAIL_BYTES = 8192


def tail(data: bytes, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of a log's end, as text."""
    text = data.decode(errors="replace").rstrip("\n")
    return "\n".join(text.splitlines()[-lines:])


def memory_cause(stderr_tail: str) -> str | None:
    """'out of GPU memory', 'out of host memory' or None, from what the run printed."""
    if GPU_OOM.search(stderr_tail):
        return "out of GPU memory"
    if HOST_OOM.search(stderr_tail):
        return "out of host memory"
    return None


# ------------------------------------------------------------------ a failing rank's own words

# A line of a per-GPU run's log: the local launcher's `[rank N] ` (marbled.batch.ranks) or
# srun --label's `N: ` (space-padded to the widest rank's), then what rank N printed.
RANK_LINE = re.compile(r"^(?:\[rank (\d+)\] ?| *(\d+): )(.*)$")
# What launchers print of their own, not a rank's words.
LAUNCHER_LINE = re.compile(r"^(?:marbled|srun|slurmstepd|torchrun|jsrun): ")
# The rank that ended the run, as the launcher tells it: marbled's local launcher
# ("marbled: rank 1 exited with 1; ...") or srun ("srun: error: n2: task 1: Exited with exit
# code 1", and "tasks 0,2-3: Killed" for the ranks it stopped after it).
MARBLED_FAILED = re.compile(r"^marbled: rank (\d+) (?:exited with|was killed by)")
SRUN_FAILED = re.compile(r"^srun: error: [^:]+: tasks? (\d+)[^:]*: (.*)$")
TRACEBACK = "Traceback (most recent call last):"
ERROR_CHARS = 200  # of the line quoted


def rank_lines(text: str, rank: int) -> list[str]:
    """The lines rank `rank` printed, in a per-GPU run's log (either launcher's format),
    without their label."""
    kept = []
    for line in text.splitlines():
        m = RANK_LINE.match(line)
        if m and int(m.group(1) or m.group(2)) == rank:
            kept.append(m.group(3))
    return kept


def failed_rank(text: str) -> int | None:
    """The rank that ended a per-GPU run, as its launcher said in the run's stderr (marbled's
    local launcher, or srun: the first task that exited non-zero, else the first it names);
    None if neither did."""
    named = None
    for line in text.splitlines():
        if m := MARBLED_FAILED.match(line):
            return int(m.group(1))
        if m := SRUN_FAILED.match(line):
            if m.group(2).startswith("Exited with exit code"):
                return int(m.group(1))
            named = int(m.group(1)) if named is None else named
    return named


def error_line(lines: list[str]) -> str | None:
    """The line of `lines` (one process's stderr, the end of it) that says why it failed: the
    exception line of its last Python traceback when it has one, else its last line that is
    neither blank nor a launcher's own ("marbled: ...", "srun: ..."); None if none is."""
    own = [line.rstrip() for line in lines if line.strip() and not LAUNCHER_LINE.match(line)]
    starts = [i for i, line in enumerate(own) if line.strip() == TRACEBACK]
    if starts:
        # frames are indented; the exception is the first line after them that is not
        for line in own[starts[-1] + 1:]:
            if not line[:1].isspace():
                return line[:ERROR_CHARS]
    return own[-1].strip()[:ERROR_CHARS] if own else None


def rank_error(text: str, rank: int | None = None) -> tuple[int | None, str | None]:
    """Which rank ended a per-GPU run and the line that says why, from the run's stderr (its
    end; either launcher's format): `rank` if the caller knows it, else the one its launcher
    named; (None, the error of the unlabelled lines) when none is named."""
    if rank is None:
        rank = failed_rank(text)
    if rank is None:
        return None, error_line(text.splitlines())
    return rank, error_line(rank_lines(text, rank))
