"""Policy.explain(): why a job is where it is, in one line, for every kind of wait."""

from __future__ import annotations

import pytest

from marbled.core.explain import reasons
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
    assert field == "nodes" and "use --policy adaptive, marble, rigid or whatif" in why
    assert get_policy("marble").feasible(two_nodes, state) is None


def test_policy_settings_are_checked_by_the_policy():
    with pytest.raises(ValueError, match="--time-slice must be greater than 0"):
        get_policy("timeslice", time_slice=0)
    with pytest.raises(ValueError, match="--preempt-guard must be at least 0"):
        get_policy("malleable", preempt_guard=-1)
    assert get_policy("elastic", grow_after=5, time_slice=9).grow_after == 5.0  # others ignored


# reasons() from a job's recorded events (core.explain; what `marble explain` prints)

def _retried(*extra: tuple[str, dict], restored: int | None = None) -> list[tuple[str, dict]]:
    """A run that reported step 20 and failed without a checkpoint, then its retry (whose
    start the broker recorded at the failed run's last step)."""
    resumed = {"gpus": [0, 1], "role": "primary", "step": 20}
    if restored is not None:
        resumed["restored"] = restored
    return [("started", {"gpus": [0, 1], "role": "primary", "step": 0}),
            ("failed", {"step": 20, "detail": "exited with code 1; retry 1 of 1 in 30 s"}),
            ("resumed", resumed), *extra]


def _ended(state: State, job_id: int) -> Job:
    state.finished(job_id, JobState.DONE)
    return state.jobs[job_id]


def test_a_retry_without_a_checkpoint_is_not_said_to_resume_from_the_failed_step():
    state = _state(Job(1, 2, True))
    job, marble = _ended(state, 1), get_policy("marble")
    # before the retry's first report: where it restarts is not known yet
    lines = reasons(job, state, marble, 0.0, _retried())
    assert "its runs: 2 GPUs (primary) from step 0 -> 2 GPUs (primary) from its last " \
           "checkpoint" in lines
    # its report (the view adds it) says it restored step 0; the broker's fallback record
    # is no warning about an acknowledged checkpoint: none was acknowledged
    fallback = ("checkpoint-fallback", {"expected": 20, "restored": 0, "detail": "..."})
    lines = reasons(job, state, marble, 0.0, _retried(fallback, restored=0))
    assert "its runs: 2 GPUs (primary) from step 0 -> 2 GPUs (primary) from step 0" in lines
    assert not any("acknowledged:" in line for line in lines)
    assert "a run restarted from step 0: the run before it acknowledged no checkpoint (its " \
           "last known step: 20), so steps 1-20 ran again" in lines


def test_a_checkpoint_older_than_the_acknowledged_one_is_still_a_warning():
    state = _state(Job(1, 2, True))
    events = [("started", {"gpus": [0], "role": "secondary", "step": 0}),
              ("suspend-requested", {"reason": "promote"}),
              ("acknowledged", {"step": 50}), ("suspended", {"step": 50}),
              ("resumed", {"gpus": [0, 1], "role": "primary", "step": 50, "restored": 40}),
              ("checkpoint-fallback", {"expected": 50, "restored": 40})]
    lines = reasons(_ended(state, 1), state, get_policy("marble"), 0.0, events)
    assert "its runs: 1 GPU (secondary) from step 0 -> 2 GPUs (primary) from step 40" in lines
    assert "suspended 1 time(s): promote" in lines
    assert any(line.startswith("a run restored an older checkpoint than the one "
                               "acknowledged") for line in lines)


def test_a_job_in_retry_back_off_is_told_once_when_it_starts():
    state = _state(Job(1, 2, True))
    state.apply(Start(1, "node0", (0, 1), Role.PRIMARY))
    job = state.suspended(1, not_before=33.0)
    marble = get_policy("marble")
    lines = reasons(job, state, marble, 20.0, _retried()[:2], expected_start=20.2)
    assert lines[0] == "it waits out its retry back-off (13 s left)"
    assert not any("should start" in line for line in lines), lines
    # GPUs busy beyond the back-off: the forecast's later start, said as such
    lines = reasons(job, state, marble, 20.0, _retried()[:2], expected_start=80.0)
    assert "it should start in about 60 s, after its back-off (simulated from now)" in lines
    # the back-off over: the forecast alone
    lines = reasons(job, state, marble, 40.0, _retried()[:2], expected_start=40.2)
    assert "it should start within a second (simulated from now)" in lines


def test_only_checkpointed_suspensions_are_counted_as_suspensions():
    state = _state(Job(1, 2, True))
    outran = [("started", {"gpus": [0], "role": "secondary", "step": 0}),
              ("suspend-requested", {"reason": "promote"}),
              ("done", {"step": 100, "detail": "done before it saw the suspension"})]
    lines = reasons(_ended(state, 1), state, get_policy("marble"), 0.0, outran)
    assert not any(line.startswith("suspended") for line in lines), lines
    assert "asked to suspend 1 time(s), but its run ended first: promote: done before it " \
           "saw the suspension" in lines
    forced = [("started", {"gpus": [0], "role": "secondary", "step": 0}),
              ("suspend-requested", {"reason": "shutdown"}),
              ("suspended", {"step": None, "detail": "shutdown: stopped without a checkpoint"}),
              ("resumed", {"gpus": [0], "role": "secondary", "step": 0})]
    lines = reasons(state.jobs[1], state, get_policy("marble"), 0.0, forced)
    assert not any(line.startswith("suspended") for line in lines), lines
    assert "stopped without a checkpoint 1 time(s) (asked to suspend, it acknowledged none): " \
           "shutdown" in lines
    assert "its runs: 1 GPU (secondary) from step 0 -> 1 GPU (secondary) from its last " \
           "checkpoint" in lines


def test_a_move_held_before_the_first_step_is_explained():
    """Lifecycle I6: a reshape of a run that has not trained its first step waits; the
    `reshape-held` event (once per run) is said as such."""
    state = _state(Job(1, 2, True))
    events = [("started", {"gpus": [0], "role": "secondary", "step": 0}),
              ("reshape-held", {"reason": "promote"}),
              ("suspend-requested", {"reason": "promote"}),
              ("acknowledged", {"step": 40}),
              ("suspended", {"step": 40, "detail": "promote"}),
              ("resumed", {"gpus": [0, 1], "role": "primary", "step": 40})]
    lines = reasons(state.jobs[1], state, get_policy("marble"), 0.0, events)
    assert "a move was held 1 time(s) until its run had trained its first step (moving it " \
           "sooner would throw its start-up away): promote" in lines
    assert not any("held" in line for line in reasons(
        state.jobs[1], state, get_policy("marble"), 0.0, [events[0], *events[2:]]))


@pytest.mark.parametrize("policy, rule", [("marble", "FIFO order among those the free GPUs "
                                                     "fit"),
                                          ("learned", "not in FIFO order")])
def test_an_overtaking_is_explained_by_the_rule_that_allowed_it(policy, rule):
    """Issue 31: a later job started first, and `explain` never said why."""
    state = _state(Job(1, 4, False), Job(2, 4, False), Job(3, 2, False), gpus=6)
    state.apply(Start(1, "node0", (0, 1, 2, 3), Role.PRIMARY))
    state.apply(Start(3, "node0", (4, 5), Role.PRIMARY))  # job 2 does not fit; 3 does
    lines = reasons(state.jobs[2], state, get_policy(policy), 0.0)
    (line,) = [x for x in lines if "later job" in x]
    assert line.startswith("1 later job(s) run while it waits (3): ") and rule in line
    assert not any("later job" in x for x in reasons(state.jobs[3], state,
                                                       get_policy(policy), 0.0))
