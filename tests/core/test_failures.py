"""Reading why a run failed from the end of its stderr."""

from __future__ import annotations

import pytest

from marbled.core.failures import (
    error_line,
    failed_rank,
    memory_cause,
    rank_error,
    rank_lines,
    tail,
)


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


# ------------------------------------------------------------------ a failing rank's own words

# The end of a per-GPU run's stderr under the local launcher: a non-DDP script on 4 GPUs,
# rank 1 raised, rank 0 was waiting, the launcher stopped the others.
LOCAL = """\
[rank 0] loading data
[rank 2] loading data
[rank 1] Traceback (most recent call last):
[rank 3] loading data
[rank 1]   File "/home/u/train.py", line 12, in <module>
[rank 1]     main()
[rank 1]   File "/home/u/train.py", line 9, in main
[rank 1]     raise RuntimeError("WORLD_SIZE=4, but torch.distributed is not initialised")
[rank 1] RuntimeError: WORLD_SIZE=4, but torch.distributed is not initialised
[rank 0] waiting for the others
marbled: rank 1 exited with 1; stopping the other 3 rank(s)
"""

# The same under Slurm: an srun step with --label (recorded text), srun's own lines last.
SRUN = """\
0: loading data
2: loading data
1: Traceback (most recent call last):
3: loading data
1:   File "/home/u/train.py", line 12, in <module>
1:     main()
1:   File "/home/u/train.py", line 9, in main
1:     raise RuntimeError("WORLD_SIZE=4, but torch.distributed is not initialised")
1: RuntimeError: WORLD_SIZE=4, but torch.distributed is not initialised
0: waiting for the others
srun: error: gpu-n2: task 1: Exited with exit code 1
srun: launch/slurm: _step_signal: Terminating StepId=4242.3
slurmstepd: error: *** STEP 4242.3 ON gpu-n1 CANCELLED AT 2026-11-28T14:02:11 ***
srun: error: gpu-n1: tasks 0,2-3: Killed
"""

ERROR = "RuntimeError: WORLD_SIZE=4, but torch.distributed is not initialised"


@pytest.mark.parametrize("text", [LOCAL, SRUN], ids=["local", "srun"])
def test_the_failing_rank_and_its_exception_not_the_launchers_summary(text):
    assert failed_rank(text) == 1
    assert rank_error(text) == (1, ERROR)
    assert rank_error(text, rank=1) == (1, ERROR)  # the local launcher's record says so
    assert rank_lines(text, 0) == ["loading data", "waiting for the others"]


def test_srun_labels_padded_to_the_widest_rank():
    text = " 9: ValueError: bad shard\n10: ok\nsrun: error: n3: task 9: Exited with exit code 2\n"
    assert rank_error(text) == (9, "ValueError: bad shard")


def test_srun_naming_only_killed_tasks_names_the_first():
    assert failed_rank("srun: error: n1: tasks 2-3: Killed\n") == 2
    assert failed_rank("plain output\n") is None


@pytest.mark.parametrize("lines, error", [
    (["step 1", "step 2", "marbled: rank 0 exited with 1; stopping the other 3 rank(s)", ""],
     "step 2"),  # no traceback: the last line that is the script's own
    (["Traceback (most recent call last):", '  File "t.py", line 1, in <module>',
      "    1 / 0", "    ~~^~~", "ZeroDivisionError: division by zero", "cleanup done"],
     "ZeroDivisionError: division by zero"),  # the exception line, not what followed it
    (["Traceback (most recent call last):", '  File "a.py", line 3', "KeyError: 'x'", "",
      "During handling of the above exception, another exception occurred:", "",
      "Traceback (most recent call last):", '  File "a.py", line 5', "ValueError: bad"],
     "ValueError: bad"),  # a chained traceback: the last exception
    (["marbled: rank 0 exited with 1; stopping the other 3 rank(s)"], None),
    ([], None),
])
def test_error_line(lines, error):
    assert error_line(lines) == error


def test_a_rank_that_printed_nothing_has_no_error():
    assert rank_error(LOCAL, rank=3) == (3, "loading data")
    assert rank_error("marbled: rank 2 exited with 1; stopping the other 1 rank(s)\n") == \
        (2, None)
