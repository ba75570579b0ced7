"""Policy.explain(): why a job is where it is, in one line, for every kind of wait."""

from __future__ import annotations

import pytest

from marbled.core.model import Job, JobState, Placement, Role, Start, State, Suspend
from marbled.core.policy import POLICIES, get_policy


def _state(*jobs: Job, gpus: int = 6) -> State:
    state = State.single_node(gpus)
    for job in jobs:
        state.submit(job)
    return state


# (the learned policy explains a wait by its network's scores: tests/core/test_learned.py)
@pytest.mark.parametrize("policy", sorted(set(POLICIES) - {"learned"}))
def test_waiting_behind_the_head_of_the_queue(policy):
    state = _state(Job(1, 6, False), Job(2, 6, False))
    explain = get_policy(policy).explain
    assert explain(state.jobs[1], state, 0.0).startswith("is next in the FIFO and needs 6 GPUs")
    assert explain(state.jobs[2], state, 0.0) == "waits in the FIFO behind 1 eligible job(s)"


def test_waiting_for_a_dependency_names_it_and_its_state():
    state = _state(Job(1, 2, True), Job(2, 2, True, after=(1,)))
    state.apply(Start(1, "node0", (0, 1), Role.PRIMARY))
    why = get_policy("marble").explain(state.jobs[2], state, 0.0)
    assert why == "waits for job 1 (running)"


def test_broken_dependency_and_retry_back_off():
    state = _state(Job(1, 2, True), Job(2, 2, True, after=(1,)), Job(3, 1, True, not_before=50.0))
    state.finished(1, JobState.FAILED)
    policy = get_policy("marble")
    assert policy.explain(state.jobs[2], state, 0.0).startswith("will be cancelled")
    assert policy.explain(state.jobs[3], state, 20.0) == "waits out its retry back-off (30 s left)"


def test_running_secondary_suspending_and_reserved_jobs():
    state = _state(Job(1, 4, True), Job(2, 4, True))
    state.apply(Start(1, "node0", (0, 1, 2, 3), Role.PRIMARY))
    state.apply(Start(2, "node0", (4, 5), Role.SECONDARY))
    policy = get_policy("marble")
    assert policy.explain(state.jobs[2], state, 0.0) == \
        "runs as secondary on 2 GPUs of node0 (its demand is 4)"
    state.finished(1, JobState.DONE)
    state.apply(Suspend(2, Placement("node0", (0, 1, 4, 5)), "promote"))
    assert policy.explain(state.jobs[2], state, 0.0) == \
        "is writing its checkpoint, to resume on 4 GPUs of node0"
    state.suspended(2)
    assert policy.explain(state.jobs[2], state, 0.0) == \
        "resumes on 4 GPUs of node0, reserved for it"


def test_never_a_multi_node_job_under_a_single_node_policy():
    state = State(nodes={"a": State.single_node(2).nodes["node0"]})
    two_nodes = Job(1, 2, True, nodes=2)
    field, why = get_policy("moldable").feasible(two_nodes, state)
    assert field == "nodes" and "use --policy adaptive, marble or rigid" in why
    assert get_policy("marble").feasible(two_nodes, state) is None


def test_policy_settings_are_checked_by_the_policy():
    with pytest.raises(ValueError, match="--time-slice must be greater than 0"):
        get_policy("timeslice", time_slice=0)
    with pytest.raises(ValueError, match="--preempt-guard must be at least 0"):
        get_policy("malleable", preempt_guard=-1)
    assert get_policy("elastic", grow_after=5, time_slice=9).grow_after == 5.0  # others ignored
