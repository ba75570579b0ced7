"""How a run ended, for every combination the broker meets."""

from __future__ import annotations

import pytest

from marbled.core.model import JobState
from marbled.core.outcome import describe_exit, ended_with_allocation, run_outcome

ACK = {"run_id": 4, "step": 120}


def end(code=0, cancelled=False, suspending=False, escalated=False, reason="promote", ack=None,
        progress_step=None, target_steps=1000, start_step=None, recovered=False):
    return run_outcome(code=code, cancelled=cancelled, suspending=suspending,
                       escalated=escalated, reason=reason, ack=ack,
                       progress_step=progress_step, target_steps=target_steps,
                       start_step=start_step, recovered=recovered)


@pytest.mark.parametrize("kw, outcome, why, step", [
    ({"code": 0}, JobState.DONE, "done", 1000),
    ({"code": 0, "progress_step": 1000}, JobState.DONE, "done", 1000),
    ({"code": 3}, JobState.FAILED, "exited with code 3", None),
    ({"code": -11}, JobState.FAILED, "exited with signal SIGSEGV", None),
    ({"code": -9, "cancelled": True}, JobState.CANCELLED, "cancelled by the user", None),
    # it completed as the cancel came: done (the jobs after it may run) ...
    ({"code": 0, "cancelled": True, "target_steps": None}, JobState.DONE,
     "done as it was cancelled (exit 0)", None),
    # ... unless it exited 0 with steps left by its own reports
    ({"code": 0, "cancelled": True, "progress_step": 400}, JobState.CANCELLED,
     "cancelled by the user", 400),
    # ... or it acknowledged a checkpoint (a stop it made, whatever its reports)
    ({"code": 0, "cancelled": True, "ack": ACK}, JobState.CANCELLED, "cancelled by the user",
     120),
    ({"code": 0, "cancelled": True, "ack": ACK, "target_steps": None}, JobState.CANCELLED,
     "cancelled by the user", 120),
    # asked to suspend
    ({"suspending": True, "ack": ACK}, JobState.SUSPENDED, "promote", 120),
    ({"suspending": True, "ack": {"step": 1000}}, JobState.DONE, "done", 1000),
    ({"suspending": True, "code": 0}, JobState.DONE, "done before it saw the suspension",
     1000),
    ({"suspending": True, "code": -15, "escalated": True, "progress_step": 90},
     JobState.SUSPENDED, "promote: stopped without a checkpoint (last reported step 90)", None),
    ({"suspending": True, "code": 2}, JobState.FAILED, "exited with 2 while suspending", None),
    # stopped by force (a shutdown's SIGTERM), it exited 0: it completed (its exit raced the
    # stop), and is not run again ...
    ({"suspending": True, "code": 0, "escalated": True, "target_steps": None,
      "reason": "shutdown"}, JobState.DONE, "done as it was stopped (exit 0)", None),
    ({"suspending": True, "code": 0, "escalated": True, "progress_step": 1000},
     JobState.DONE, "done as it was stopped (exit 0)", 1000),
    # ... unless its own reports say it has steps left: a graceful stop, resumed
    ({"suspending": True, "code": 0, "escalated": True, "progress_step": 400},
     JobState.SUSPENDED, "promote: stopped without a checkpoint (last reported step 400)", None),
    # adopted after a broker restart: no exit code
    ({"code": None, "progress_step": 1000}, JobState.DONE, "done", 1000),
    ({"code": None, "progress_step": 400}, JobState.SUSPENDED,
     "outcome unknown: run again from its last checkpoint (last reported step 400)", None),
    ({"code": None, "ack": ACK, "reason": "broker restart"}, JobState.SUSPENDED,
     "broker restart", 120),
    # ... asked to suspend, it finished first: done, not a suspension with no end step
    ({"code": None, "suspending": True, "progress_step": 1000}, JobState.DONE, "done", 1000),
    # ... it never reported, so never restored: it ends where it started
    ({"code": None, "start_step": 300}, JobState.SUSPENDED,
     "outcome unknown: run again from step 300 (no step reported)", 300),
    # a forced stop of a run that never reported
    ({"suspending": True, "code": -9, "escalated": True, "start_step": 0}, JobState.SUSPENDED,
     "promote: stopped without a checkpoint (no step reported: resumes from step 0)", 0),
    # ended while no broker watched: its files say how, and the why says it was recovered
    ({"code": None, "progress_step": 1000, "recovered": True, "start_step": 700},
     JobState.DONE, "recovered after a broker restart: done (its last report: step 1000)",
     1000),
    ({"code": None, "suspending": True, "progress_step": 1000, "recovered": True},
     JobState.DONE, "recovered after a broker restart: done (its last report: step 1000)",
     1000),
    ({"code": None, "ack": ACK, "recovered": True}, JobState.SUSPENDED,
     "recovered after a broker restart: suspended at its checkpoint of step 120", 120),
    ({"code": None, "ack": {"run_id": 4, "step": 1000}, "recovered": True}, JobState.DONE,
     "recovered after a broker restart: done (its last report: step 1000)", 1000),
    ({"code": None, "start_step": 300, "recovered": True}, JobState.SUSPENDED,
     "recovered after a broker restart: outcome unknown: run again from step 300 (no step "
     "reported)", 300),
    ({"code": None, "progress_step": 400, "start_step": 300, "recovered": True},
     JobState.SUSPENDED, "recovered after a broker restart: outcome unknown: run again from "
     "its last checkpoint (last reported step 400)", None),
    # ... with the exit its supervisor recorded (I2): the true code, never run again
    ({"code": 0, "progress_step": 400, "recovered": True}, JobState.DONE,
     "recovered after a broker restart: done (exited with code 0)", 400),
    ({"code": 3, "progress_step": 400, "recovered": True}, JobState.FAILED,
     "recovered after a broker restart: exited with code 3", 400),
    ({"code": None, "suspending": True, "start_step": 0, "recovered": True},
     JobState.SUSPENDED, "recovered after a broker restart: outcome unknown: run again", 0),
    ({"code": -15, "suspending": True, "escalated": True, "start_step": 0, "recovered": True},
     JobState.SUSPENDED, "recovered after a broker restart: promote: stopped without a "
     "checkpoint (no step reported: resumes from step 0)", 0),
])
def test_run_outcome(kw, outcome, why, step):
    e = end(**kw)
    assert (e.outcome, e.why, e.end_step) == (outcome, why, step)


def test_unknown_signal_numbers_are_named_by_number():
    assert describe_exit(-200) == "signal 200" and describe_exit(1) == "code 1"


# A plain command (no worker protocol: no steps, no reports), adopted after a broker restart.
PLAIN = {"target_steps": None, "start_step": 0, "reason": "broker restart"}


@pytest.mark.parametrize("kw, outcome, why", [
    # it ended while no broker watched: its supervisor's record says how
    ({"code": 0, "recovered": True}, JobState.DONE,
     "recovered after a broker restart: done (exited with code 0)"),
    ({"code": 1, "recovered": True}, JobState.FAILED,
     "recovered after a broker restart: exited with code 1"),
    ({"code": -9, "recovered": True}, JobState.FAILED,
     "recovered after a broker restart: exited with signal SIGKILL"),
    # alive when adopted, watched to its end
    ({"code": 0}, JobState.DONE, "done"),
    # no record and no process: the only case that runs again, and it says so
    ({"code": None, "recovered": True}, JobState.SUSPENDED,
     "recovered after a broker restart: outcome unknown: run again"),
])
def test_plain_command_adopted_after_a_restart(kw, outcome, why):
    e = end(**{**PLAIN, **kw})
    assert (e.outcome, e.why) == (outcome, why)
    assert "resumes" not in e.why  # a plain command starts again, it does not resume


CANCELLED_BY_SLURM = {"state": "CANCELLED", "detail": "Slurm cancelled step 7.2 on n1 (scancel)"}


@pytest.mark.parametrize("code, said, expected", [
    (0, None, False),  # it finished: done, whatever ended the allocation after
    (0, CANCELLED_BY_SLURM, False),
    (None, None, False),  # no record: the files decide anyway
    (3, None, False),  # its own failure
    (-11, None, False),  # a crash of its own
    (-15, None, True),  # SIGTERM: how an allocation's end stops a step
    (-9, None, True),
    (3, CANCELLED_BY_SLURM, True),  # Slurm's record says it ended the step
    (-9, {"state": "OUT_OF_MEMORY", "detail": "oom"}, False),  # the job's own memory
    (1, {"state": "TIMEOUT", "detail": "due to time limit"}, True),
])
def test_an_exit_the_allocations_end_caused_is_not_the_jobs_failure(code, said, expected):
    assert ended_with_allocation(code, said) is expected
