"""Malleable Equipartition: running jobs are reshaped at events, within the 300 s guard."""

from __future__ import annotations

from marbled.core.model import Job, JobState, Node, Role, Start, State, Suspend
from marbled.core.policy import get_policy
from marbled.core.policy.malleable import GUARD_S

POLICY = get_policy("malleable")


def settle(state: State, now: float = 0.0, ends_in: float = 1000.0) -> list[list]:
    """Decide and apply until the policy is content; suspensions complete at once.
    Every started run is expected to end `ends_in` from now. The decisions, in order."""
    rounds = []
    for _ in range(20):
        actions = POLICY.decide(state, now)
        if not actions:
            return rounds
        rounds.append(actions)
        for action in actions:
            job = state.apply(action, now)
            if isinstance(action, Start):
                state.expect(job.id, now + ends_in)
        for job in list(state.jobs.values()):
            if job.state is JobState.SUSPENDING:
                state.suspended(job.id)
    raise AssertionError(f"no rest after 20 decisions: {rounds}")


def counts(state: State) -> dict[int, int]:
    return {j.id: len(j.gpus) for j in state.jobs.values() if j.state is JobState.RUNNING}


def test_an_arrival_shrinks_a_running_job_to_make_room_by_dhondt():
    state = State.single_node(6)
    state.submit(Job(1, 4, True))
    assert settle(state) and counts(state) == {1: 4}
    state.submit(Job(2, 4, True))
    first, second = settle(state, now=1.0)  # a run is not reshaped the instant it starts
    # Reshape first (job 1 from 4 to 3), then start both on their D'Hondt shares.
    assert first == [Suspend(1, None, "equipartition")]
    assert [(a.job, len(a.gpus), a.role) for a in second] == [
        (1, 3, Role.SECONDARY), (2, 3, Role.SECONDARY)]
    assert counts(state) == {1: 3, 2: 3} and state.jobs[1].suspensions == 1


def test_a_job_with_at_most_the_guard_left_is_not_preempted():
    state = State.single_node(6)
    state.submit(Job(1, 4, True))
    settle(state, ends_in=GUARD_S)  # ends exactly at the guard: pinned
    state.submit(Job(2, 4, True))
    assert settle(state) == [[Start(2, "node0", (4, 5), Role.SECONDARY)]]
    assert counts(state) == {1: 4, 2: 2} and state.jobs[1].suspensions == 0


def test_a_run_without_an_estimate_is_never_preempted():
    state = State.single_node(6)
    state.submit(Job(1, 4, True))
    for a in POLICY.decide(state):
        state.apply(a)  # no expect(): the driver could not estimate its end
    state.submit(Job(2, 4, True))
    assert [type(a) for a in POLICY.decide(state)] == [Start]


def test_when_a_job_ends_the_others_grow_back_to_their_optimum():
    state = State.single_node(6)
    for i in (1, 2):
        state.submit(Job(i, 4, True))
    settle(state)
    assert counts(state) == {1: 3, 2: 3}
    state.finished(1, JobState.DONE)
    first, second = settle(state, now=1.0)
    assert first == [Suspend(2, None, "equipartition")]
    assert second == [Start(2, "node0", (0, 1, 2, 3), Role.PRIMARY)]


def test_congestion_gives_every_job_one_gpu_oldest_first_and_suspends_the_rest():
    state = State.single_node(4)
    state.submit(Job(1, 4, True))
    settle(state)
    for i in range(2, 7):
        state.submit(Job(i, 2, True))
    settle(state, now=1.0)
    # 6 jobs, 4 GPUs: p_min 1 each for the four oldest; jobs 5 and 6 wait.
    assert counts(state) == {1: 1, 2: 1, 3: 1, 4: 1}
    assert state.jobs[5].state is JobState.QUEUED


def test_rigid_jobs_are_never_reshaped_and_keep_their_count():
    state = State.single_node(6)
    state.submit(Job(1, 4, False))
    settle(state)
    state.submit(Job(2, 4, True))
    assert settle(state) == [[Start(2, "node0", (4, 5), Role.SECONDARY)]]
    assert counts(state) == {1: 4, 2: 2}


def test_a_job_stays_on_its_node_and_gpus_when_its_share_does_not_change():
    state = State(nodes={n: Node(n, (0, 1, 2, 3)) for n in "ab"})
    state.submit(Job(1, 4, True))
    settle(state)
    state.submit(Job(2, 4, True))
    assert settle(state) == [[Start(2, "b", (0, 1, 2, 3), Role.PRIMARY)]]
    assert state.jobs[1].placement.node == "a" and state.jobs[1].suspensions == 0
