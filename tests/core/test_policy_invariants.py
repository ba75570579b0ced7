"""Property tests: every policy keeps their invariants on random queues and random events.

A driver loop stands in for the daemon: it asks the policy for actions, applies
them to the `State`, then lets a random event happen (a holder of GPUs ends,
usually DONE and sometimes FAILED, or a suspending job finishes checkpointing),
until every job has ended.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marbled.core.model import (
    Cancel,
    Job,
    JobState,
    Node,
    Role,
    Start,
    State,
    Suspend,
)
from marbled.core.policy import POLICIES, get_policy
from marbled.core.policy.base import dependency_status
from marbled.core.policy.malleable import GUARD_S
from marbled.core.profiles import ThroughputCurve
from marbled.core.shapes import shapes

MAX_ITERATIONS = 500


@dataclass(frozen=True)
class Scenario:
    sizes: tuple[int, ...]
    jobs: tuple[Job, ...]

    def state(self) -> State:
        nodes = {f"n{i}": Node(f"n{i}", tuple(range(s))) for i, s in enumerate(self.sizes)}
        state = State(nodes=nodes)
        for job in self.jobs:
            state.submit(job)
        return state


@st.composite
def scenarios(draw, multi_node: bool = False) -> Scenario:
    """Random nodes and jobs; `multi_node`: on 2-3 nodes, some jobs ask for several nodes,
    a fixed count or a range (their demand fits every node, so the most nodes always fit)."""
    sizes = tuple(draw(st.lists(st.integers(1, 8), min_size=2 if multi_node else 1,
                                max_size=3)))
    count = draw(st.integers(1, 25))
    jobs = []
    for i in range(1, count + 1):
        if multi_node and draw(st.integers(0, 2)) == 0:
            nodes = draw(st.integers(2, len(sizes)))
            low = draw(st.one_of(st.none(), st.integers(1, nodes - 1)))
            jobs.append(Job(i, draw(st.integers(1, min(sizes))), draw(st.booleans()),
                            nodes=nodes, nodes_min=low))
            continue
        demand = draw(st.integers(1, max(sizes)))
        malleable = draw(st.booleans())
        max_share = draw(st.sampled_from([1, 1, 2, 4])) if malleable else 1
        after: tuple[int, ...] = ()
        if i > 1 and draw(st.integers(0, 3)) == 0:
            deps = draw(st.sets(st.integers(1, i - 1), min_size=1, max_size=3))
            after = tuple(sorted(deps))
        curve = None
        if malleable and draw(st.booleans()):  # a curve that peaks at the demand
            power = draw(st.floats(0.3, 1.0))
            speeds = [g ** power if g <= demand else demand ** power * 0.97 ** (g - demand)
                      for g in range(1, max(sizes) + 1)]
            fewest = draw(st.integers(1, demand))  # e.g. its batch needs that many GPUs
            speeds = [None if g < fewest else v for g, v in enumerate(speeds, start=1)]
            curve = ThroughputCurve("m", tuple(speeds), startup_s=draw(st.sampled_from([0, 5])),
                                    suspend_s=1.0)
        jobs.append(Job(i, demand, malleable, after, max_share=max_share, curve=curve,
                        steps_left=draw(st.sampled_from([None, 100.0, 5000.0]))))
    return Scenario(sizes, tuple(jobs))


# ---------------------------------------------------------------- invariants


def check_state(state: State) -> None:
    """What must hold after every transition."""
    assert state.movable == sum(not j.state.finished and (j.malleable or j.nodes_min is not None)
                                for j in state.jobs.values())
    holders: dict[tuple[str, int], int] = {}
    reserved: dict[tuple[str, int], int] = {}
    shared: dict[tuple[str, int], float] = {}  # GPU -> the part of it its sharers hold
    for job in state.jobs.values():
        if job.placement is not None:
            p = job.placement
            assert job.state.holds_gpus, f"job {job.id} is {job.state} but holds {p}"
            assert p.node in state.nodes
            node = state.nodes[p.node]
            assert len(p.gpus) == len(set(p.gpus)), f"job {job.id} holds a GPU twice: {p}"
            assert 1 <= len(p.gpus) <= node.size
            assert set(p.gpus) <= set(node.gpus), f"job {job.id}: {p} not GPUs of {node}"
            if p.share > 1:
                assert len(p.gpus) == 1 and p.share <= job.max_share, f"job {job.id}: {p}"
                key = (p.node, p.gpus[0])
                shared[key] = shared.get(key, 0.0) + 1 / p.share
                assert shared[key] <= 1 + 1e-9, f"GPU {key} shared beyond its whole"
                assert key not in holders, f"GPU {key} held by {holders[key]} and shared"
                continue
            for name, gpus in p.parts():  # every node of a multi-node run
                assert 1 <= len(gpus) == len(set(gpus)) <= state.nodes[name].size
                assert set(gpus) <= set(state.nodes[name].gpus), f"job {job.id}: {p}"
                for g in gpus:
                    key = (name, g)
                    assert key not in holders, f"GPU {key} held by {holders[key]} and {job.id}"
                    assert key not in shared, f"GPU {key} shared and held by {job.id}"
                    holders[key] = job.id
        else:
            assert not job.state.holds_gpus, f"job {job.id} is {job.state} without GPUs"
        if job.resume_on is not None:
            r = job.resume_on
            assert job.state in (JobState.SUSPENDING, JobState.SUSPENDED)
            assert set(r.gpus) <= set(state.nodes[r.node].gpus)
            assert len(r.gpus) == len(set(r.gpus)) and 1 <= len(r.gpus) <= job.demand
            for g in r.gpus:
                key = (r.node, g)
                assert key not in reserved, f"GPU {key} reserved for {reserved[key]} and {job.id}"
                reserved[key] = job.id
        if job.state.finished:
            assert job.placement is None and job.resume_on is None
        if not job.malleable:
            assert job.role is not Role.SECONDARY, f"rigid job {job.id} is a secondary"
            assert job.state not in (JobState.SUSPENDING, JobState.SUSPENDED)
            assert job.suspensions == 0
    for key, owner in reserved.items():
        holder = holders.get(key, owner)
        assert holder == owner, f"GPU {key} held by job {holder} but reserved for job {owner}"


def check_decision(policy: str, state: State, actions: list) -> None:
    """What must hold of one decision, against the state it was taken on."""
    jobs = state.jobs
    ids = [a.job for a in actions]
    assert len(ids) == len(set(ids)), f"two actions for one job: {actions}"

    # (a job the nodes can never hold is not: the FIFO passes over it, tests/core/test_unfit.py)
    eligible = [j.id for j in jobs.values() if j.waiting and dependency_status(j, state) == "ready"
                and state.misfit_of(j.id) is None]
    fresh = [a.job for a in actions if isinstance(a, Start) and jobs[a.job].waiting]
    # FIFO with head-of-line blocking: the jobs started from the queue are the
    # first eligible ones, in order; none starts while an earlier one waits.
    # (Time slicing orders the queue by when a job last ran, not by submission; the learned
    # policy may start a later job, but never past one that later jobs have passed its
    # bound of times.)
    if policy == "learned":
        bound = get_policy(policy).max_overtaken
        for started in fresh:
            passed = [i for i in eligible if i < started and state.overtaken(i) >= bound]
            assert not passed, f"job {started} starts before {passed}, overtaken {bound:g} times"
    elif policy != "timeslice":
        assert fresh == eligible[: len(fresh)], f"eligible {eligible}, started {fresh}"

    for action in actions:
        job = jobs[action.job]
        count = len(action.gpus if isinstance(action, Start) else
                    action.resume_on.gpus if isinstance(action, Suspend) and action.resume_on
                    else job.gpus) or job.demand
        assert job.curve is None or job.curve.possible(count), (
            f"job {job.id} put on {count} GPUs, a count its curve rules out: {action}")
        if job.nodes > 1:
            check_spread(policy, state, job, action)
            continue
        match action:
            case Start(node=node_name, gpus=gpus, role=role):
                node = state.nodes[node_name]
                assert set(gpus) <= set(node.gpus)
                assert len(gpus) == len(set(gpus)) >= 1
                if job.waiting:
                    for dep in job.after:
                        assert jobs[dep].state is JobState.DONE, (
                            f"job {job.id} starts before its dependency {dep} is done"
                        )
                else:
                    assert job.state is JobState.SUSPENDED and job.resume_on is not None
                    assert (node_name, tuple(gpus)) == (job.resume_on.node, job.resume_on.gpus)
                    assert (role is Role.PRIMARY) == (len(gpus) == job.demand)
                if policy not in ("moldable", "malleable"):
                    assert action.share == 1, f"{policy} shares a GPU"
                if policy == "marble":
                    if role is Role.PRIMARY:
                        assert len(gpus) == job.demand, f"primary {job.id} on {gpus}"
                    else:
                        assert role is Role.SECONDARY
                        assert job.malleable, f"rigid job {job.id} started as a secondary"
                        assert len(gpus) < job.demand
                elif policy == "timeslice":
                    assert role is Role.PRIMARY and len(gpus) == job.demand
                elif policy == "learned":  # its demand, or fewer (down to its fewest)
                    low = job.fewest if job.malleable else job.demand
                    assert low <= len(gpus) <= job.demand, f"learned: job {job.id} on {gpus}"
                    assert action.share == 1
                    assert (role is Role.PRIMARY) == (len(gpus) == job.demand)
                elif policy == "elastic":
                    if job.waiting:  # starts small: one GPU (or the fewest its curve allows),
                        assert len(gpus) == job.fewest  # or a rigid job's count
                    assert (role is Role.PRIMARY) == (len(gpus) == job.demand)
                elif policy == "adaptive":  # 1 GPU up to its demand, if it has a curve
                    low = job.fewest if job.malleable and job.curve is not None else job.demand
                    assert low <= len(gpus) <= job.demand, f"adaptive: job {job.id} on {gpus}"
                    assert action.share == 1
                    assert (role is Role.PRIMARY) == (len(gpus) == job.demand)
                elif policy == "phased":  # any count its curve allows (checked above)
                    assert action.share == 1
                    assert (role is Role.PRIMARY) == (len(gpus) == job.demand)
                elif policy in ("moldable", "malleable"):
                    low = job.fewest
                    assert low <= len(gpus) <= job.demand, f"moldable: job {job.id} on {gpus}"
                    assert action.share <= job.max_share, f"job {job.id} on 1/{action.share}"
                    assert (role is Role.PRIMARY) == (
                        len(gpus) == job.demand and action.share == 1)
                else:
                    assert role is Role.PRIMARY
                    want = node.size if job.malleable else job.demand
                    assert len(gpus) == want, f"rigid policy: job {job.id} on {gpus}"
            case Suspend(resume_on=target) if policy == "timeslice":
                assert target is None and job.malleable and job.state is JobState.RUNNING
            case Suspend(resume_on=target) if policy == "elastic":
                assert job.malleable and job.state is JobState.RUNNING
                assert target is not None and target.node == job.placement.node
                mine, new = set(job.gpus), set(target.gpus)
                assert new < mine or mine < new, f"elastic: {job.gpus} -> {target.gpus}"
                assert len(target.gpus) <= job.demand
            case Suspend(resume_on=target) if policy == "adaptive":
                assert job.malleable and job.state is JobState.RUNNING
                assert job.curve is not None and job.expected_end is not None
                assert target is None or 1 <= len(target.gpus) <= job.demand
                assert target is None or (target.node, len(target.gpus)) != (
                    job.placement.node, len(job.gpus)), "a reshape that keeps the count"
                assert not any(isinstance(a, Start) for a in actions), "reshape, then start"
            case Suspend(resume_on=target) if policy == "malleable":
                assert target is None and job.malleable and job.state is JobState.RUNNING
                assert job.expected_end is not None and job.expected_end > GUARD_S, (
                    f"job {job.id} reshaped within the guard ({job.expected_end})")
                assert not any(isinstance(a, Start) for a in actions), "reshape, then start"
            case Suspend(resume_on=target) if policy == "phased":
                assert target is None and job.malleable and job.state is JobState.RUNNING
                assert not any(isinstance(a, Start) for a in actions), "reshape, then start"
            case Suspend(resume_on=target) if policy == "learned":  # one move a decision
                own = [a for a in actions if not isinstance(a, Cancel)
                       and not (isinstance(a, Start) and not jobs[a.job].waiting)]
                assert own == [action], f"learned: more than one move: {actions}"
                assert job.malleable and job.curve is not None
                assert job.state is JobState.RUNNING and len(job.placement.parts()) == 1
                assert target is None or job.fewest <= len(target.gpus) <= job.demand
                assert target is None or len(target.gpus) != len(job.gpus)
                if target is not None and target.node == job.placement.node:
                    mine, new = set(job.gpus), set(target.gpus)
                    assert new < mine or mine < new, f"learned: {job.gpus} -> {target.gpus}"
            case Suspend(resume_on=target):
                assert policy == "marble", f"the {policy} policy never suspends"
                assert job.malleable, f"rigid job {job.id} suspended"
                assert job.state is JobState.RUNNING and job.role is Role.SECONDARY
                assert target is not None and len(job.gpus) < len(target.gpus) <= job.demand
                if target.node == job.placement.node:
                    assert set(job.gpus) < set(target.gpus)
                if len(state.nodes) == 1:  # the paper's promotion: on its node, to optimal
                    assert target.node == job.placement.node
                    assert len(target.gpus) == job.demand
            case Cancel():
                assert job.waiting
                assert dependency_status(job, state) == "broken"
            case _:
                raise AssertionError(f"unknown action {action!r}")

    # No deadlock: with every GPU free, an eligible job must be started.
    idle = all(j.placement is None and j.resume_on is None for j in jobs.values())
    if idle and eligible:
        assert fresh, f"nothing runs, job {eligible[0]} is eligible, yet no start: {actions}"


def check_spread(policy: str, state: State, job: Job, action) -> None:
    """A multi-node job starts only fresh, as a primary, on free GPUs of distinct nodes, the
    same count on each: one of its shapes (its demand x nodes GPUs in all, on a node count
    of its range), or under rigid a fixed-count auto job on each node's GPUs."""
    assert isinstance(action, Start) and job.waiting, f"multi-node job {job.id}: {action}"
    assert action.role is Role.PRIMARY and action.share == 1
    parts = ((action.node, action.gpus), *action.others)
    assert len({n for n, _ in parts}) == len(parts), f"a node twice: {parts}"
    for name, gpus in parts:
        assert set(gpus) <= set(state.free(name)), f"job {job.id} on taken GPUs: {parts}"
    if policy == "rigid" and job.malleable and job.nodes_min is None:
        assert len(parts) == job.nodes
        assert all(len(g) == state.nodes[n].size for n, g in parts), f"rigid: {parts}"
        return
    assert len({len(g) for _, g in parts}) == 1, f"uneven counts: {parts}"
    assert (len(parts), len(action.gpus)) in shapes(job.demand, job.nodes, job.nodes_min), (
        f"job {job.id} ({job.demand} x {job.nodes_min}-{job.nodes} nodes) on {parts}")


# ---------------------------------------------------------------- the driver


def _followed(policy, name: str) -> str:
    """The policy whose rules a decision keeps: a planner's (whatif), the one it follows."""
    driver = getattr(policy, "driver", None)
    if driver is None:
        return name
    followed = policy._policies[driver]  # a phased plan, or malleable off its plan
    return getattr(followed, "following", driver.split("(")[0])


def drive(policy_name: str, scenario: Scenario, data, stay: frozenset[int] = frozenset()
          ) -> State:
    """Decide, apply and let random events happen until every job has ended, but `stay`:
    jobs the nodes can never hold (tests/core/test_unfit.py), which must never start."""
    policy = get_policy(policy_name)
    state = scenario.state()
    check_state(state)
    for _ in range(MAX_ITERATIONS):
        snapshot = State(nodes=state.nodes, jobs=dict(state.jobs))
        actions = policy.decide(state)
        assert state.jobs == snapshot.jobs, "decide() changed the state"
        check_decision(_followed(policy, policy_name), snapshot, actions)
        assert not [a for a in actions if isinstance(a, Start) and a.job in stay], actions
        for action in actions:
            job = state.apply(action)
            if isinstance(action, Start):  # ends far off (reshapable) or soon or unknown
                state.expect(job.id, data.draw(st.sampled_from([1000.0, 1000.0, 100.0, None]),
                                               label="expected end"))
            check_state(state)
        started = {a.job for a in actions if isinstance(a, Start)}
        # With no event in between, nobody just started is moved again -- unless a job
        # just started is one the malleable guard pins (too close to its end, or no
        # estimate): the plan then lost a job it had counted on, which is an event of sorts.
        pinned = policy_name == "malleable" and any(
            state.jobs[i].malleable and (state.jobs[i].expected_end or 0.0) <= GUARD_S
            for i in started)
        if started and not pinned:
            again = policy.decide(state)
            assert not [a for a in again if isinstance(a, Suspend) and a.job in started], (
                f"jobs started and at once suspended: {again}")
        if {j.id for j in state.active()} <= stay:
            break
        events = [("end", j.id) for j in state.jobs.values() if j.state.holds_gpus]
        events += [
            ("suspended", j.id) for j in state.jobs.values() if j.state is JobState.SUSPENDING
        ]
        if not events:
            assert actions, f"deadlock: nothing runs and nothing is started: {state.jobs}"
            continue
        kind, job_id = data.draw(st.sampled_from(events), label="event")
        if kind == "end":
            fails = data.draw(st.integers(0, 9), label="outcome") == 9
            state.finished(job_id, JobState.FAILED if fails else JobState.DONE)
        else:
            state.suspended(job_id)
        check_state(state)
    assert {j.id for j in state.active()} <= stay, \
        f"not finished after {MAX_ITERATIONS} iterations: {state.jobs}"
    return state


def check_outcome(state: State) -> None:
    for job in state.jobs.values():
        deps_done = all(state.jobs[d].state is JobState.DONE for d in job.after)
        if not deps_done:
            assert job.state is JobState.CANCELLED, (
                f"job {job.id} is {job.state} though a dependency did not succeed"
            )
        else:
            assert job.state in (JobState.DONE, JobState.FAILED), (
                f"job {job.id} is {job.state} though its dependencies succeeded"
            )


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(max_examples=200, deadline=None)
@given(scenario=scenarios(), data=st.data())
def test_policy_invariants(policy, scenario, data):
    check_outcome(drive(policy, scenario, data))


@pytest.mark.parametrize("policy", sorted(p for p, c in POLICIES.items() if c.multi_node))
@settings(max_examples=150, deadline=None)
@given(scenario=scenarios(multi_node=True), data=st.data())
def test_policy_invariants_with_multi_node_jobs_and_node_ranges(policy, scenario, data):
    check_outcome(drive(policy, scenario, data))


# ---------------------------------------------------------------- targeted cases


def test_failed_dependency_cancels_the_chain():
    state = State.single_node(4)
    for job in (Job(1, 2, True), Job(2, 2, True, (1,)), Job(3, 1, False, (2,)), Job(4, 2, True)):
        state.submit(job)
    policy = get_policy("marble")
    for a in policy.decide(state):
        state.apply(a)
    assert state.jobs[1].state is JobState.RUNNING
    assert state.jobs[4].state is JobState.RUNNING  # 2 waits for 1, 4 is next eligible
    assert state.jobs[2].state is JobState.QUEUED
    state.finished(1, JobState.FAILED)
    actions = policy.decide(state)
    assert Cancel(2, "a job it depends on failed or was cancelled") in actions
    for a in actions:
        state.apply(a)
    for a in policy.decide(state):
        state.apply(a)
    assert state.jobs[2].state is JobState.CANCELLED
    assert state.jobs[3].state is JobState.CANCELLED


def test_unknown_dependency_is_broken():
    state = State.single_node(2)
    state.submit(Job(1, 1, True, (99,)))
    assert get_policy("rigid").decide(state) == [
        Cancel(1, "a job it depends on failed or was cancelled")
    ]


def test_rigid_head_of_line_blocks_the_queue():
    state = State.single_node(4)
    for job in (Job(1, 3, False), Job(2, 2, False), Job(3, 1, False)):
        state.submit(job)
    for policy in ("rigid", "marble"):
        s = State(nodes=state.nodes, jobs=dict(state.jobs))
        actions = get_policy(policy).decide(s)
        # job 2 does not fit next to job 1; job 3 would, but must not overtake job 2
        assert actions == [Start(1, "node0", (0, 1, 2), Role.PRIMARY)], policy
