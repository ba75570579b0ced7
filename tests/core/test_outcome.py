"""How a run ended, for every combination the broker meets."""

from __future__ import annotations

import pytest

from marbled.core.model import JobState
from marbled.core.outcome import describe_exit, run_outcome

ACK = {"run_id": 4, "step": 120}


def end(code=0, cancelled=False, suspending=False, escalated=False, reason="promote", ack=None,
        progress_step=None, target_steps=1000):
    return run_outcome(code=code, cancelled=cancelled, suspending=suspending,
                       escalated=escalated, reason=reason, ack=ack,
                       progress_step=progress_step, target_steps=target_steps)


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
])
def test_run_outcome(kw, outcome, why, step):
    e = end(**kw)
    assert (e.outcome, e.why, e.end_step) == (outcome, why, step)


def test_unknown_signal_numbers_are_named_by_number():
    assert describe_exit(-200) == "signal 200" and describe_exit(1) == "code 1"
