"""Node ranges (`nodes: "MIN-MAX"`, as Slurm's --nodes): the job's GPUs in all are fixed at
its count x MAX nodes, and each run takes the fewest nodes of the range that divide them
evenly and have them free."""

from __future__ import annotations

import pytest

from marbled.core.model import Job, JobState, Role, Start, State
from marbled.core.policy import POLICIES, get_policy
from marbled.core.policy.spread import take_spread
from marbled.core.shapes import shapes
from marbled.core.spec import JobSpec, SpecError, size_job
from marbled.resources import load_profile
from tests.core.test_multinode import _run
from tests.core.test_multinode import _state as two_nodes

MULTI_NODE = sorted(p for p, c in POLICIES.items() if c.multi_node)


def _state() -> State:
    return two_nodes(gpus=4)


def test_shapes_keep_the_gpus_in_all_fewest_nodes_first():
    assert shapes(2, 2, 1) == [(1, 4), (2, 2)]
    assert shapes(3, 4, 2) == [(2, 6), (3, 4), (4, 3)]
    assert shapes(1, 3, 2) == [(3, 1)]  # 3 GPUs do not divide over 2 nodes
    assert shapes(2, 2, 1, node_size=3) == [(2, 2)]  # 4 on one node: more than it has
    assert shapes(2, 3) == [(3, 2)]  # a fixed count: one shape


def test_take_spread_takes_the_fewest_nodes_that_have_the_gpus_and_leaves_free_alone_else():
    job = Job(1, 2, False, nodes=2, nodes_min=1)
    free = {"n1": [0, 1, 2, 3], "n2": [0, 1, 2, 3]}
    assert take_spread(free, job) == [("n1", (0, 1, 2, 3))]
    assert free == {"n2": [0, 1, 2, 3]}
    free = {"n1": [2, 3], "n2": [0, 1, 2]}  # no node has 4: 2 + 2
    assert take_spread(free, job) == [("n1", (2, 3)), ("n2", (0, 1))]
    free = {"n1": [3], "n2": [0, 1, 2]}
    assert take_spread(free, job) is None and free == {"n1": [3], "n2": [0, 1, 2]}


@pytest.mark.parametrize("policy", MULTI_NODE)
def test_a_range_job_runs_on_one_node_when_one_has_all_its_gpus(policy):
    state = _state()
    state.submit(Job(1, 2, False, nodes=2, nodes_min=1))
    (start,) = _run(state, policy)
    assert start == Start(1, "n1", (0, 1, 2, 3), Role.PRIMARY)
    assert state.free("n2") == [0, 1, 2, 3]
    assert state.above_demand() == []  # 4 GPUs on one node is its count, not above it
    assert "runs as primary on 4 GPUs of each of n1" in get_policy(policy).explain(
        state.jobs[1], state, 0.0)


@pytest.mark.parametrize("policy", MULTI_NODE)
def test_a_range_job_spreads_when_no_node_has_them_all_and_resumes_on_one_later(policy):
    state = _state()
    state.submit(Job(1, 2, False, nodes=2))  # half of each node
    _run(state, policy)
    state.submit(Job(2, 2, True, nodes=2, nodes_min=1))
    (start,) = _run(state, policy)
    assert (start.node, start.gpus, start.others) == ("n1", (2, 3), (("n2", (2, 3)),))
    assert start.role is Role.PRIMARY
    state.suspended(2)  # `marble suspend`: it waits again, at its place in the FIFO
    state.finished(1, JobState.DONE)
    (again,) = _run(state, policy)
    assert (again.node, again.gpus, again.others) == ("n1", (0, 1, 2, 3), ())


@pytest.mark.parametrize("policy", MULTI_NODE)
def test_a_fixed_two_node_job_still_needs_two_nodes(policy):
    state = _state()
    state.submit(Job(1, 2, False, nodes=2))
    (start,) = _run(state, policy)
    assert (len(start.gpus), len(start.others)) == (2, 1)


def test_a_range_job_waits_with_its_reason_in_the_shapes_it_can_take():
    state = _state()
    state.submit(Job(1, 3, False))
    state.submit(Job(2, 3, False))
    _run(state, "marble")
    state.submit(Job(3, 2, False, nodes=2, nodes_min=1))
    assert _run(state, "marble") == []
    why = get_policy("marble").explain(state.jobs[3], state, 0.0)
    assert "needs 4 GPUs on one node or 2 GPUs on each of 2 nodes" in why


@pytest.fixture(scope="module")
def book():
    return load_profile("summit-v100")


@pytest.mark.parametrize("nodes, low, high, text", [
    ("1-2", 1, 2, "1-2"), ("2-2", None, 2, 2), (3, None, 3, 3), ("1-1", None, 1, 1)])
def test_nodes_takes_a_count_or_a_range_and_gives_back_the_same(nodes, low, high, text):
    spec = JobSpec.from_mapping({"command": "python t.py", "gpus": 2, "nodes": nodes})
    assert (spec.nodes_min, spec.nodes, spec.to_mapping()["nodes"]) == (low, high, text)
    assert JobSpec.from_mapping(spec.to_mapping()) == spec


@pytest.mark.parametrize("nodes, message", [
    ("2-1", "the range 2-1 runs backwards; write the fewest nodes first: 1-2"),
    ("0-2", "or a range 'MIN-MAX' such as '1-2'"),
    ("1-20000", "from 1 to 10000"),
    ("2", "or a range 'MIN-MAX'"),  # a single count is a number
    ("1 - 2", "or a range 'MIN-MAX'"),
    ("1-2\n", "or a range 'MIN-MAX'"),
    ([1, 2], "or a range 'MIN-MAX'"),
])
def test_a_bad_range_says_what_to_write(nodes, message):
    with pytest.raises(SpecError) as err:
        JobSpec.from_mapping({"command": "python t.py", "nodes": nodes})
    assert err.value.field == "nodes" and message in err.value.message


def test_a_range_is_sized_against_the_allocation(book):
    spec = JobSpec.from_mapping({"emulate": True, "model": "resnet-50", "steps": 9,
                                 "nodes": "1-2"})
    assert size_job(spec, book, 6, node_count=2).demand == 3
    with pytest.raises(SpecError, match="reaches past the 2 nodes there are; give 1-2"):
        size_job(JobSpec.from_mapping({"command": "x", "gpus": 1, "nodes": "1-3"}), book, 4, 2)
    with pytest.raises(SpecError, match="asks for 3-4 nodes but there are 2"):
        size_job(JobSpec.from_mapping({"command": "x", "gpus": 1, "nodes": "3-4"}), book, 4, 2)


def test_a_single_node_policy_refuses_a_range_that_could_need_two_nodes():
    state = _state()
    job = Job(1, 1, False, nodes=2, nodes_min=1)
    field, why = get_policy("elastic").feasible(job, state)
    assert field == "nodes" and "runs single-node jobs only" in why
