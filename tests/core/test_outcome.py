"""How a run ended, for every combination the broker meets."""

from __future__ import annotations

import pytest

from marbled.core.model import JobState
from marbled.core.outcome import describe_exit, run_outcome

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
    # asked to suspend
    ({"suspending": True, "ack": ACK}, JobState.SUSPENDED, "promote", 120),
    ({"suspending": True, "ack": {"step": 1000}}, JobState.DONE, "done", 1000),
    ({"suspending": True, "code": 0}, JobState.DONE, "done before it saw the suspension",
     1000),
    ({"suspending": True, "code": -15, "escalated": True, "progress_step": 90},
     JobState.SUSPENDED, "promote: stopped without a checkpoint (last reported step 90)", None),
    ({"suspending": True, "code": 2}, JobState.FAILED, "exited with 2 while suspending", None),
    # adopted after a broker restart: no exit code
    ({"code": None, "progress_step": 1000}, JobState.DONE, "done", 1000),
    ({"code": None, "progress_step": 400}, JobState.SUSPENDED,
     "exit not observed; resumes from its checkpoint (last reported step 400)", None),
    ({"code": None, "ack": ACK, "reason": "broker restart"}, JobState.SUSPENDED,
     "broker restart", 120),
    # ... asked to suspend, it finished first: done, not a suspension with no end step
    ({"code": None, "suspending": True, "progress_step": 1000}, JobState.DONE, "done", 1000),
    # ... it never reported, so never restored: it ends where it started
    ({"code": None, "start_step": 300}, JobState.SUSPENDED,
     "exit not observed; resumes from its checkpoint (no step reported: resumes from step "
     "300)", 300),
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
     "recovered after a broker restart: ended before its first report; resumes from step "
     "300", 300),
    ({"code": None, "progress_step": 400, "start_step": 300, "recovered": True},
     JobState.SUSPENDED, "recovered after a broker restart: ended without acknowledging a "
     "checkpoint (last reported step 400); resumes from its last checkpoint", None),
])
def test_run_outcome(kw, outcome, why, step):
    e = end(**kw)
    assert (e.outcome, e.why, e.end_step) == (outcome, why, step)


def test_unknown_signal_numbers_are_named_by_number():
    assert describe_exit(-200) == "signal 200" and describe_exit(1) == "code 1"
