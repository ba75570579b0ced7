"""Jobs the nodes can never hold (`State.unfit`: a larger allocation queued them, and the
state directory went on to a smaller one): every policy passes over them, never starts one,
and runs every other job to its end, whatever the queue around them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marbled.core.model import Job, JobState, Node, Start, State, misfit
from marbled.core.policy import POLICIES, get_policy
from tests.core.test_policy_invariants import Scenario, drive, scenarios


@st.composite
def with_unfit(draw, multi_node: bool = False) -> tuple[Scenario, set[int]]:
    """A random scenario with jobs that ask for more than its nodes have put in at random
    places of the FIFO (a fixed count above the largest node, more nodes than there are),
    some of them with jobs that depend on them; and the ids that can never run."""
    scenario = draw(scenarios(multi_node=multi_node))
    sizes, jobs = scenario.sizes, list(scenario.jobs)
    unfit: set[int] = set()
    next_id = len(jobs) + 1
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.integers(0, len(jobs)))
        if draw(st.booleans()):
            job = Job(next_id, max(sizes) + draw(st.integers(1, 4)), False)
        else:
            job = Job(next_id, 1, draw(st.booleans()), nodes=len(sizes) + 1)
        jobs.insert(where, job)
        unfit.add(next_id)
        if draw(st.booleans()):  # a job that waits for it cannot run either
            next_id += 1
            jobs.append(Job(next_id, 1, True, (job.id,)))
            unfit.add(next_id)
        next_id += 1
    # the FIFO is by id: renumber in the drawn order, dependencies with them
    order = {job.id: i for i, job in enumerate(jobs, start=1)}
    jobs = [Job(order[j.id], j.demand, j.malleable, tuple(sorted(order[d] for d in j.after)),
                j.nodes, max_share=j.max_share, curve=j.curve, steps_left=j.steps_left,
                nodes_min=j.nodes_min) for j in jobs]
    return Scenario(sizes, tuple(jobs)), {order[i] for i in unfit}


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(max_examples=40, deadline=None)
@given(drawn=with_unfit(), data=st.data())
def test_every_policy_runs_the_others_past_jobs_that_cannot_run_here(policy, drawn, data):
    scenario, unfit = drawn
    assert set(scenario.state().unfit()) == unfit
    state = drive(policy, scenario, data, stay=frozenset(unfit))
    assert {j.id for j in state.active()} == unfit  # still queued, for a larger allocation
    assert all(state.jobs[i].state is JobState.QUEUED for i in unfit)


@pytest.mark.parametrize("policy", sorted(p for p, c in POLICIES.items() if c.multi_node))
@settings(max_examples=30, deadline=None)
@given(drawn=with_unfit(multi_node=True), data=st.data())
def test_with_multi_node_jobs_and_ranges(policy, drawn, data):
    scenario, unfit = drawn
    assert set(scenario.state().unfit()) == unfit
    state = drive(policy, scenario, data, stay=frozenset(unfit))
    assert {j.id for j in state.active()} == unfit


def test_what_fits_and_what_is_said():
    two = [2]
    assert misfit(Job(1, 2, False), two) is None
    assert misfit(Job(1, 5, True), two) is None  # `auto` takes what a node has
    assert misfit(Job(1, 4, False), two) == (
        "it asks for 4 GPUs on one node, and this allocation has 1 node of 2 GPUs")
    assert misfit(Job(1, 1, True, nodes=2), [4]) == (
        "it asks for 1 GPU on each of 2 nodes, and this allocation has 1 node of 4 GPUs")
    # a range fits on its fewest nodes: 2 nodes of 4 GPUs or 4 of 2, so two nodes of 4 do
    assert misfit(Job(1, 2, False, nodes=4, nodes_min=2), [4, 4]) is None
    assert misfit(Job(1, 2, False, nodes=4, nodes_min=2), [4, 2, 2]) is not None
    assert misfit(Job(1, 4, False, nodes=2), [4, 2]).endswith("2 nodes of 2-4 GPUs")


def test_the_wait_is_said_and_a_cancel_of_the_job_ends_the_wait_behind_it():
    state = State(nodes={"n1": Node("n1", (0, 1))})
    state.submit(Job(1, 4, False))
    state.submit(Job(2, 1, True, (1,)))
    state.submit(Job(3, 1, False))
    assert list(state.unfit()) == [1, 2] and state.unfit_count == 2
    assert state.misfit_of(2) == "it waits for job 1, which this allocation cannot hold"
    explained = get_policy("marble").explain(state.jobs[1], state, 0.0)
    assert explained.startswith("cannot run in this allocation: it asks for 4 GPUs")
    assert [a.job for a in get_policy("rigid").decide(state) if isinstance(a, Start)] == [3]
    state.finished(1, JobState.CANCELLED)  # the user gives up on it: its dependent is broken
    assert state.unfit() == {} and state.broken() == [2]


def test_the_planner_plans_the_jobs_the_nodes_can_hold():
    """whatif's simulations leave out a job the nodes can never hold: with it, every candidate
    failed to place the queue, and no plan was ever made while it waited."""
    from marbled.core.policy.whatif import _forward, predict
    from marbled.core.profiles import ThroughputCurve

    curve = ThroughputCurve("m", (10.0, 18.0, 25.0, 30.0), startup_s=0.0, suspend_s=1.0)
    state = State(nodes={"n1": Node("n1", (0, 1))})
    state.submit(Job(1, 4, False, curve=curve, steps_left=1000.0))  # a larger one queued it
    state.submit(Job(2, 2, True, curve=curve, steps_left=1000.0))
    state.submit(Job(3, 1, False, curve=curve, steps_left=500.0))
    setup = _forward(state, 0.0, 10)
    assert setup.ids == [2, 3]
    assert predict(setup).predicted  # the candidates could place them
