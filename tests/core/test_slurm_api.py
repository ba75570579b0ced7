"""The pure parts of marbled.batch.slurm_api: Slurm's words for a step's end, node states,
time limits and GRES requests, and the choice of reader without Slurm."""

from __future__ import annotations

import pytest

from marbled.batch.base import AllocationError
from marbled.batch.slurm_api import (
    _gpus_per_node,
    _minutes,
    choose_reader,
    step_end,
    unavailable,
)
from marbled.core.model import State

# as srun printed them on the test cluster (scancel of a step; a step over its time limit)
CANCELLED = """slurmstepd-n1: error: *** STEP 7.0 ON n1 CANCELLED AT 2026-11-25T23:04:27 ***
srun: Job step aborted: Waiting up to 7 seconds for job step to finish.
srun: error: n1: task 0: Killed
"""
TIMEOUT = "slurmstepd-n2: error: *** STEP 9.2 ON n2 CANCELLED AT 2026-11-25T23:04:27 " \
          "DUE TO TIME LIMIT ***\n"
OOM = ("slurmstepd-n1: error: Detected 1 oom-kill event(s) in StepId=12.3. Some of your "
       "processes may have been killed by the cgroup out-of-memory handler.\n")


def test_step_end_gives_slurms_state_for_that_step_only():
    assert step_end(CANCELLED, "7.0") == {
        "state": "CANCELLED", "node": "n1", "at": "2026-11-25T23:04:27",
        "detail": "Slurm cancelled step 7.0 on n1 (scancel)"}
    assert step_end(CANCELLED, "7.1") is None  # an earlier run's step in the same log
    assert step_end(TIMEOUT, "9.2")["state"] == "TIMEOUT"
    assert step_end(TIMEOUT, "9.2")["detail"].endswith("due to time limit")
    assert step_end(OOM, "12.3")["state"] == "OUT_OF_MEMORY"
    assert step_end("Traceback ...\nValueError: x\n", "7.0") is None
    # slurmstepd's line lost (Slurm does not always pass it to srun before srun exits, seen
    # on the test cluster): srun's own line says Slurm ended the step, without the node
    lost = "\n".join(CANCELLED.splitlines()[1:])
    assert step_end(lost, "7.0") == {
        "state": "CANCELLED", "detail": "Slurm cancelled step 7.0 (srun: job step aborted)"}
    assert step_end("srun: error: n1: task 0: Exited with exit code 1\n", "7.0") is None


@pytest.mark.parametrize(("state", "out"), [
    ("IDLE", False), ("MIXED", False), ("mixed", False), ("MIXED+DRAIN", True),
    ("draining", True), ("DOWN*", True), ("IDLE+NOT_RESPONDING", True)])
def test_node_states_that_take_no_new_runs(state, out):
    assert unavailable(state) is out


def test_time_limits_in_minutes():
    assert [_minutes(t) for t in ("7:00", "1:07:00", "2-00:00:00", "0:30")] == \
        [7, 67, 2880, 1]


def test_gpus_per_node_from_the_jobs_gres_request():
    assert _gpus_per_node({"tres_per_node": "gres:gpu:6"}, 2) == 6
    assert _gpus_per_node({"tres_per_node": "gres:gpu:v100:4"}, 1) == 4
    assert _gpus_per_node({"tres_per_job": "gres:gpu:3"}, 1) == 3
    assert _gpus_per_node({}, 1) == 0
    with pytest.raises(AllocationError, match="--gpus-per-node"):
        _gpus_per_node({"job_id": 5, "tres_per_job": "gres:gpu:8"}, 2)


def test_cli_is_chosen_without_asking_pyslurm_and_a_bad_name_is_refused():
    reader, why = choose_reader("cli")
    assert reader.name == "cli" and "--slurm-api cli" in why
    with pytest.raises(AllocationError, match="choose one of auto, pyslurm, cli"):
        choose_reader("pyslum")


def test_a_node_out_of_service_has_no_free_gpu_until_it_is_back():
    state = State.single_node(4, "n2")
    state.set_unavailable("n2", "MIXED+DRAIN")
    assert state.free("n2") == []
    state.set_unavailable("n2", None)
    assert state.free("n2") == [0, 1, 2, 3]
