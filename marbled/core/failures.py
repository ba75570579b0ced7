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
