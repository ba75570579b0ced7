"""ONES-style elastic sizing: start on one GPU, halve the largest for a newcomer, double
stable jobs into free GPUs, smallest remaining GPU-time first."""

from __future__ import annotations

from marbled.core.model import Job, JobState, Placement, Role, Start, State, Suspend
from marbled.core.policy import get_policy

POLICY = get_policy("elastic")  # stable after 300 s


def apply(state: State, actions: list, now: float, ends: dict[int, float] | None = None) -> None:
    for action in actions:
        job = state.apply(action, now)
        if isinstance(action, Start):
            state.expect(job.id, (ends or {}).get(job.id, now + 5000.0))
        elif action.resume_on is not None:
            state.suspended(job.id)  # checkpointed at once


def test_new_jobs_start_on_one_gpu_in_fifo_order_rigid_on_their_count():
    state = State.single_node(6)
    for job in (Job(1, 4, True), Job(2, 3, False), Job(3, 1, True)):
        state.submit(job)
    assert POLICY.decide(state) == [Start(1, "node0", (0,), Role.SECONDARY),
                                    Start(2, "node0", (1, 2, 3), Role.PRIMARY),
                                    Start(3, "node0", (4,), Role.PRIMARY)]


def test_stable_jobs_double_into_free_gpus_smallest_remaining_gpu_time_first():
    state = State.single_node(6)
    for i in (1, 2):
        state.submit(Job(i, 4, True))
    apply(state, POLICY.decide(state, 0.0), 0.0, ends={1: 9000.0, 2: 3000.0})
    assert POLICY.decide(state, 100.0) == []  # not stable yet
    assert POLICY.next_decision(state, 100.0) == 300.0
    grow = POLICY.decide(state, 300.0)
    # Job 2 has less GPU-time left (1 x 2700 s against 1 x 8700 s): it grows first.
    assert grow == [Suspend(2, Placement("node0", (1, 2)), "elastic: grow"),
                    Suspend(1, Placement("node0", (0, 3)), "elastic: grow")]
    apply(state, grow, 300.0)
    assert POLICY.decide(state, 300.0) == [Start(1, "node0", (0, 3), Role.SECONDARY),
                                           Start(2, "node0", (1, 2), Role.SECONDARY)]


def test_a_newcomer_with_no_free_gpu_halves_the_largest_job():
    state = State.single_node(4)
    state.submit(Job(1, 4, True))
    apply(state, POLICY.decide(state, 0.0), 0.0)
    for now in (300.0, 600.0):  # 1 -> 2 -> 4 GPUs
        apply(state, POLICY.decide(state, now), now)
        apply(state, POLICY.decide(state, now), now)
    assert state.jobs[1].gpus == (0, 1, 2, 3) and state.jobs[1].role is Role.PRIMARY
    state.submit(Job(2, 2, True))
    shrink = POLICY.decide(state, 700.0)
    assert shrink == [Suspend(1, Placement("node0", (0, 1)), "elastic: make room")]
    apply(state, shrink, 700.0)
    assert POLICY.decide(state, 700.0) == [Start(1, "node0", (0, 1), Role.SECONDARY)]
    apply(state, POLICY.decide(state, 700.0), 700.0)
    assert POLICY.decide(state, 700.0) == [Start(2, "node0", (2,), Role.SECONDARY)]


def test_nothing_to_halve_means_the_newcomer_waits():
    state = State.single_node(2)
    for i in (1, 2, 3):
        state.submit(Job(i, 2, True))
    apply(state, POLICY.decide(state, 0.0), 0.0)
    assert state.jobs[3].state is JobState.QUEUED
    assert POLICY.decide(state, 10.0) == []


def test_a_job_near_its_end_does_not_grow_and_no_start_while_one_resizes():
    state = State.single_node(4)
    for i in (1, 2):
        state.submit(Job(i, 2, True))
    apply(state, POLICY.decide(state, 0.0), 0.0, ends={1: 500.0, 2: 9000.0})
    # At 300 s job 1 has 200 s left (< 300 s): only job 2 doubles.
    grow = POLICY.decide(state, 300.0)
    assert grow == [Suspend(2, Placement("node0", (1, 2)), "elastic: grow")]
    state.apply(grow[0], 300.0)  # job 2 is still checkpointing (SUSPENDING)
    state.submit(Job(3, 1, True))
    assert POLICY.decide(state, 301.0) == []  # GPU 3 is free, but a resize is under way
    state.suspended(2)
    assert POLICY.decide(state, 302.0)[0] == Start(2, "node0", (1, 2), Role.PRIMARY)
