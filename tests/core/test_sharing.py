"""GPU sharing (1/n of a GPU), only for models whose profile says they tolerate it."""

from __future__ import annotations

import pytest

from marbled.core.model import Job, JobState, Node, Role, Start, State, TransitionError
from marbled.core.policy import get_policy
from marbled.core.profiles import ProfileBook, ProfileError
from marbled.core.spec import JobSpec, size_job
from marbled.resources import load_profile
from marbled.sim.engine import Simulator
from marbled.sim.workloads import Arrival

BOOK = load_profile("example-sharing")


def small(i: int, max_share: int = 4, demand: int = 2) -> Job:
    return Job(i, demand, True, max_share=max_share)


def decide(state: State, policy: str = "moldable", now: float = 0.0) -> list:
    return get_policy(policy).decide(state, now)


def placed(actions) -> dict[int, tuple]:
    return {a.job: (a.node, a.gpus, a.share) for a in actions if isinstance(a, Start)}


def test_the_profile_says_who_may_share_and_how_fast():
    lenet, resnet = BOOK.lookup("LeNet"), BOOK.lookup("resnet-50")
    assert (lenet.max_share, resnet.max_share) == (4, 1)
    assert lenet.throughput(1, 2) == 33.8 and lenet.throughput(1, 4) == 19.5
    assert lenet.throughput(1, 3) == 19.5  # no figure for thirds: the next larger share's
    spec = JobSpec.from_mapping({"model": "lenet", "steps": 10, "emulate": True})
    assert size_job(spec, BOOK, 6).max_share == 4
    rigid = JobSpec.from_mapping({"model": "lenet", "steps": 10, "gpus": 1, "emulate": True})
    assert size_job(rigid, BOOK, 6).max_share == 1  # an explicit count never shares


@pytest.mark.parametrize("shared, why", [
    ({5: 1.0}, "2..4"), ({2: 0}, "positive"), ({2: 60.0}, "at most the 1-GPU"),
    ([2, 4], "must map"),
])
def test_a_bad_sharing_figure_is_refused_with_its_field(shared, why):
    doc = {"system": "x", "gpus_per_node": 2, "models": {"m": {
        "steps_per_second": [50.0, 60.0], "shared_steps_per_second": shared}}}
    with pytest.raises(ProfileError) as err:
        ProfileBook.from_mapping(doc)
    assert err.value.where == "models.m.shared_steps_per_second" and why in str(err.value)


def test_state_counts_a_shared_gpu_taken_until_its_last_run_ends():
    state = State.single_node(2)
    for i in (1, 2):
        state.submit(small(i))
        state.apply(Start(i, "node0", (0,), Role.SECONDARY, share=2))
    assert state.free("node0") == [1]
    assert state.sharing() == {("node0", 0): {1: 2, 2: 2}}
    state.finished(1, JobState.DONE)
    assert state.free("node0") == [1] and state.sharing() == {("node0", 0): {2: 2}}
    state.finished(2, JobState.DONE)
    assert state.free("node0") == [0, 1] and state.sharing() == {}


def test_a_job_cannot_be_started_beyond_its_share_or_on_two_gpus():
    state = State.single_node(2)
    state.submit(small(1, max_share=2))
    with pytest.raises(TransitionError):
        state.apply(Start(1, "node0", (0,), Role.SECONDARY, share=4))
    with pytest.raises(TransitionError):
        state.apply(Start(1, "node0", (0, 1), Role.SECONDARY, share=2))


def test_congestion_spreads_jobs_that_may_share_over_the_gpus_fewest_runs_first():
    state = State.single_node(2)
    for i in range(1, 6):
        state.submit(small(i))
    # Five jobs, two GPUs, each job to the GPU with fewest runs: thirds and halves.
    assert placed(decide(state)) == {
        1: ("node0", (0,), 3), 2: ("node0", (1,), 2), 3: ("node0", (0,), 3),
        4: ("node0", (1,), 2), 5: ("node0", (0,), 3)}


def test_a_job_that_may_not_share_gets_whole_gpus_and_the_rest_share():
    state = State.single_node(3)
    state.submit(small(1))
    state.submit(Job(2, 1, True))  # malleable, but its profile has no sharing figure
    state.submit(small(3))
    state.submit(small(4))
    # 1 and 3 each alone on a GPU so far; 4 joins the first of them, 1 on GPU 0. Job 2's
    # whole GPU is a count until the end of the plan: it gets the one left.
    assert placed(decide(state)) == {
        1: ("node0", (0,), 2), 2: ("node0", (2,), 1), 3: ("node0", (1,), 1),
        4: ("node0", (0,), 2)}


def test_a_gpu_is_never_split_beyond_a_runs_max_share():
    state = State.single_node(1)
    state.submit(small(1, max_share=2))
    for i in (2, 3):
        state.submit(small(i))
    # Job 1 allows halves only: it and job 2 share GPU 0; job 3 would make thirds.
    actions = decide(state)
    assert placed(actions) == {1: ("node0", (0,), 2), 2: ("node0", (0,), 2)}


def test_new_runs_split_what_is_left_of_a_shared_gpu():
    state = State.single_node(1)
    state.submit(small(1))
    state.apply(Start(1, "node0", (0,), Role.SECONDARY, share=2))
    for i in (2, 3):
        state.submit(small(i))
    # Half the GPU is left: two more runs get a quarter each.
    assert placed(decide(state)) == {2: ("node0", (0,), 4), 3: ("node0", (0,), 4)}


def test_light_load_never_shares():
    state = State(nodes={"a": Node("a", (0, 1, 2, 3))})
    for i in (1, 2):
        state.submit(small(i))
    assert placed(decide(state)) == {1: ("a", (0, 1), 1), 2: ("a", (2, 3), 1)}


def test_malleable_gives_a_shared_job_the_whole_gpu_when_its_partner_ends():
    state = State.single_node(1)
    for i in (1, 2):
        state.submit(small(i, demand=1))
    for a in decide(state, "malleable"):
        state.apply(a)
        state.expect(a.job, 1000.0)
    assert {j.placement.share for j in state.jobs.values()} == {2}
    state.finished(1, JobState.DONE)
    (suspend,) = decide(state, "malleable", now=1.0)  # a run is not reshaped at its start instant
    state.apply(suspend)
    state.suspended(2)
    assert placed(decide(state, "malleable")) == {2: ("node0", (0,), 1)}


def test_the_simulator_runs_shared_jobs_at_their_shared_speed():
    lenet = JobSpec.from_mapping({"model": "lenet", "steps": 3380, "emulate": True})
    result = Simulator(BOOK, get_policy("moldable"), 1).run([Arrival(0.0, lenet)] * 2)
    # Demand 2 on a 1-GPU node: two jobs, one GPU: halves, 3380 / 33.8 = 100 s each.
    assert [(r.share, r.start) for r in result.runs] == [(2, 0.0)] * 2
    assert [r.end for r in result.runs] == pytest.approx([100.0, 100.0])
    assert result.utilization == pytest.approx(1.0)
    # The bound knows sharing too: the least GPU-time is a quarter GPU at 19.5 steps/s.
    assert result.lower_bound == pytest.approx(2 * 0.25 * 3380 / 19.5)
    assert result.lower_bound < result.makespan
