"""Reading why a run failed from the end of its stderr."""

from __future__ import annotations

import pytest

from marbled.core.failures import memory_cause, tail


@pytest.mark.parametrize("text, cause", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20 MiB", "out of GPU memory"),
    ("tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating "
     "tensor with shape[256,1024]", "out of GPU memory"),
    ("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=12.3", "out of host memory"),
    ("MemoryError", "out of host memory"),
    ("ValueError: shapes (3,) and (4,) not aligned", None),
    ("", None),
])
def test_memory_cause(text, cause):
    assert memory_cause(f"Traceback (most recent call last):\n{text}") == cause


def test_tail_keeps_the_last_lines_of_possibly_cut_bytes():
    data = b"".join(f"line {i}\n".encode() for i in range(100)) + b"\xff\xfe"
    lines = tail(data, lines=3).splitlines()
    assert lines[:2] == ["line 98", "line 99"] and len(lines) == 3
