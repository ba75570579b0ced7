"""Jobs that ask for several nodes: placed as one gang, `demand` GPUs on each node."""

from __future__ import annotations

import pytest

from marbled.core.model import Job, JobState, Node, Role, Start, State
from marbled.core.policy import get_policy
from marbled.core.profiles import ProfileBook
from marbled.core.spec import JobSpec, SpecError, size_job
from marbled.resources import load_profile


def _state(nodes: int = 2, gpus: int = 6) -> State:
    return State(nodes={f"n{i}": Node(f"n{i}", tuple(range(gpus))) for i in range(1, nodes + 1)})


def _run(state: State, policy: str) -> list:
    actions = get_policy(policy).decide(state)
    for a in actions:
        state.apply(a)
    return actions


@pytest.fixture(scope="module")
def book() -> ProfileBook:
    return load_profile("summit-v100")


def test_marble_starts_a_two_node_job_as_primary_on_both_nodes():
    state = _state()
    state.submit(Job(1, 3, True, nodes=2))
    (start,) = _run(state, "marble")
    assert start == Start(1, "n1", (0, 1, 2), Role.PRIMARY, (("n2", (0, 1, 2)),))
    assert state.free("n1") == state.free("n2") == [3, 4, 5]


def test_a_two_node_job_waits_for_two_nodes_never_runs_as_secondary_and_blocks_the_fifo():
    state = _state()
    state.submit(Job(1, 4, True))  # n1: 4 busy, 2 free
    _run(state, "marble")
    state.submit(Job(2, 3, True, nodes=2))  # needs 3 free on two nodes: n1 has only 2
    state.submit(Job(3, 2, True))  # would fit, but the FIFO head waits
    assert _run(state, "marble") == []
    state.finished(1, JobState.DONE)
    (start,) = _run(state, "marble")[:1]
    assert start.job == 2 and start.role is Role.PRIMARY and len(start.others) == 1


def test_rigid_gives_a_two_node_auto_job_every_gpu_of_both_nodes():
    state = _state(gpus=4)
    state.submit(Job(1, 3, True, nodes=2))
    (start,) = _run(state, "rigid")
    assert (start.gpus, start.others) == ((0, 1, 2, 3), (("n2", (0, 1, 2, 3)),))
    state.finished(1, JobState.DONE)
    assert state.free("n1") == state.free("n2") == [0, 1, 2, 3]  # released on every node


def test_nodes_field_is_checked_and_sized_against_the_allocation(book):
    spec = JobSpec.from_mapping({"emulate": True, "model": "resnet-50", "steps": 10, "nodes": 2})
    assert spec.nodes == 2 and spec.to_mapping()["nodes"] == 2
    assert size_job(spec, book, 6, node_count=2).demand == 3
    with pytest.raises(SpecError, match="asks for 2 nodes but there are 1") as err:
        size_job(spec, book, 6, node_count=1)
    assert err.value.field == "nodes"
    for bad in (0, -1, True, "2", 1.5):
        with pytest.raises(SpecError) as err:
            JobSpec.from_mapping({"command": ["x"], "gpus": 1, "nodes": bad})
        assert err.value.field == "nodes"
