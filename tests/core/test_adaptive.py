"""The adaptive policy's rules: size by load, reshape only when it pays, grow into idle GPUs,
FIFO starts and no starvation."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marbled.core.model import Job, Start, State, Suspend
from marbled.core.policy import get_policy
from marbled.core.policy.adaptive import (
    CANDIDATES,
    FUTURES,
    Item,
    _bounded,
    _Fluid,
    allocate,
    allocate_each,
    play_forward,
)
from marbled.core.profiles import ThroughputCurve
from marbled.resources import load_profile
from marbled.sim.engine import Simulator
from marbled.sim.workloads import Arrival, JobSpec, poisson

pytestmark = pytest.mark.core

POLICY = get_policy("adaptive")
BOOK = load_profile("summit-v100")
# ResNet-50 on Summit: fastest on 3 GPUs, 1.8x on 2, 1.95x on 3
RESNET = replace(BOOK.lookup("resnet-50"), startup_s=30.0, suspend_s=30.0)
FASTEST = RESNET.optimal_gpus(6)


def job(i: int, steps: float = 20_000.0, curve: ThroughputCurve = RESNET) -> Job:
    return Job(i, FASTEST, True, curve=curve, steps_left=steps)


def running_alone(left_s: float, gpus: int = 1) -> State:
    """One ResNet-50 job on `gpus` GPUs of an otherwise idle 6-GPU node, settled (it has run
    1000 s), ending `left_s` seconds after t = 1000."""
    state = State.single_node(6)
    state.submit(job(1))
    [start] = [a for a in POLICY.decide(state, 0.0) if isinstance(a, Start)]
    state.apply(replace(start, gpus=tuple(range(gpus))), 0.0)
    state.expect(1, 1000.0 + left_s)
    return state


def test_sizing_goes_from_the_fastest_count_alone_to_one_gpu_each_in_a_long_queue():
    assert FASTEST == 3
    alone = State.single_node(6)
    alone.submit(job(1))
    assert [len(a.gpus) for a in POLICY.decide(alone, 0.0)] == [FASTEST]
    queue = State.single_node(6)
    for i in range(1, 7):
        queue.submit(job(i))
    starts = POLICY.decide(queue, 0.0)
    # six jobs, six GPUs: one each, the most steps per GPU-second on this sublinear curve
    assert [(a.job, len(a.gpus)) for a in starts] == [(i, 1) for i in range(1, 7)]


def test_no_reshape_when_the_work_left_cannot_repay_the_suspend_and_resume():
    # on 1 GPU with 200 s left: 3 GPUs would take 200 / 1.95 = 103 s + 60 s of costs
    short = running_alone(200.0)
    assert POLICY.decide(short, 1000.0) == []
    # with 5000 s left the same move saves about 2400 s: it grows
    long = running_alone(5000.0)
    [move] = POLICY.decide(long, 1000.0)
    assert isinstance(move, Suspend) and len(move.resume_on.gpus) == FASTEST


def test_a_running_job_grows_into_idle_gpus_up_to_its_fastest_count_keeping_its_own():
    state = running_alone(5000.0, gpus=2)
    [move] = POLICY.decide(state, 1000.0)
    assert isinstance(move, Suspend) and "2 -> 3 GPUs" in move.reason
    assert move.resume_on.node == "node0" and set(move.resume_on.gpus) >= {0, 1}
    # never beyond its fastest count, though three more GPUs are idle
    at_best = running_alone(5000.0, gpus=FASTEST)
    assert POLICY.decide(at_best, 1000.0) == []


def test_a_newcomer_takes_gpus_back_only_when_its_gain_exceeds_the_reshape_cost():
    # A long ResNet-50 job holds the whole 3-GPU node (20,000 s left); a one-GPU job arrives.
    # Shrinking the long job to 2 GPUs costs it 8% slower steps (1700 s) plus a suspend and
    # a resume, and saves the newcomer a 20,000 s wait: worth it unless those cost hours.
    for cost, shrinks in ((30.0, True), (5000.0, False)):
        curve = replace(RESNET, startup_s=cost, suspend_s=cost)
        state = State.single_node(3)
        state.submit(job(1, curve=curve))
        state.apply(Start(1, "node0", (0, 1, 2), POLICY.decide(state, 0.0)[0].role), 0.0)
        now = 12_000.0  # settled even at the dear cost
        state.expect(1, now + 20_000.0)
        small = ThroughputCurve("small", (2.0,), startup_s=cost, suspend_s=cost)
        state.submit(Job(2, 1, True, curve=small, steps_left=1000.0))
        actions = POLICY.decide(state, now)
        assert any(isinstance(a, Suspend) for a in actions) == shrinks, actions
        if shrinks:
            assert "3 -> 2 GPUs" in actions[0].reason


MODELS = ("resnet-50", "inception-v3", "vgg-16", "resnet-101", "alexnet")


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 3000), st.sampled_from(MODELS), st.integers(100, 8000)),
                min_size=1, max_size=10),
       st.integers(1, 2), st.sampled_from([0.0, 5.0, 30.0]))
def test_every_job_ends_and_jobs_start_in_fifo_order(jobs, nodes, cost):
    arrivals = sorted((Arrival(t, JobSpec(emulate=True, model=m, steps=s)) for t, m, s in jobs),
                      key=lambda a: a.at)
    result = Simulator(BOOK, get_policy("adaptive"), 6, nodes, cost, cost).run(arrivals)
    assert len(result.jobs) == len(arrivals)  # no job waits forever: every one ends
    firsts = [result.jobs[i].first_start for i in sorted(result.jobs)]
    # every job here can run on one GPU, so none may start before one that came earlier
    assert firsts == sorted(firsts)
    assert result.makespan >= result.lower_bound - 1e-6


# the shrink to one GPU (two newcomers start 20,000 s sooner) pays up to 5,250 s of cost
@pytest.mark.parametrize("cost, shrinks", [(30.0, True), (6000.0, False)])
def test_behind_a_long_queue_a_shrink_for_newcomers_is_planned_only_where_it_may_pay(cost,
                                                                                   shrinks):
    # The newcomer case above with twenty newcomers: more jobs than the look-ahead plays
    # forward, so only the nodes where some move may pay are planned; that must not lose
    # the shrink.
    curve = replace(RESNET, startup_s=cost, suspend_s=cost)
    state = State.single_node(3)
    state.submit(job(1, curve=curve))
    state.apply(Start(1, "node0", (0, 1, 2), POLICY.decide(state, 0.0)[0].role), 0.0)
    now = 12_000.0
    state.expect(1, now + 20_000.0)
    small = ThroughputCurve("small", (2.0,), startup_s=cost, suspend_s=cost)
    for i in range(2, 22):
        state.submit(Job(i, 1, True, curve=small, steps_left=1000.0))
    actions = POLICY.decide(state, now)
    assert any(isinstance(a, Suspend) for a in actions) == shrinks, actions
    assert shrinks or actions == []  # nothing starts: every GPU is taken


def test_the_last_end_weighs_only_for_jobs_submitted_together():
    """While jobs keep arriving, the look-ahead ranks its candidates by completion times
    alone (the last end of the jobs it knows is not the makespan): `makespan_weight` changes
    nothing there. The same jobs submitted together still weigh it."""
    arrivals = poisson(10, 6.0, {"resnet-50": 1, "vgg-16": 1, "alexnet": 1, "inception-v3": 1},
                       (5_000, 100_000), seed=0)
    batch = [Arrival(0.0, a.spec) for a in arrivals]

    def run(jobs: list[Arrival], weight: float) -> tuple[float, float]:
        r = Simulator(BOOK, get_policy("adaptive", makespan_weight=weight), 6, 2, 5.0, 5.0
                      ).run(jobs)
        return r.makespan, r.average_jct

    assert run(arrivals, 0.0) == run(arrivals, 4.0)
    assert run(batch, 4.0)[0] < run(batch, 0.0)[0]


@st.composite
def fluid_states(draw) -> tuple[list, dict[str, int]]:
    """Items as adaptive's look-ahead sees them (running ones on their node, some fixed,
    waiting ones, now and then one over two nodes) and each node's room."""
    room = {f"node{n}": draw(st.integers(2, 8)) for n in range(draw(st.integers(1, 3)))}
    left = dict(room)
    items = []
    for i in range(draw(st.integers(1, 9))):
        high = draw(st.integers(1, 6))
        low = draw(st.integers(1, high))
        # a count between its fewest and most that it cannot run on (None) now and then
        speeds = tuple(draw(st.floats(0.5, 20.0)) if g in (low, high) or draw(
            st.integers(0, 4)) else None for g in range(1, high + 1))
        item = Item(i, speeds, draw(st.one_of(st.just(0.0), st.floats(1.0, 5e4))), low, high,
                    cost=draw(st.sampled_from([0.0, 10.0, 300.0])), launch=10.0)
        node = draw(st.sampled_from(sorted(room)))
        count = draw(st.integers(0, min(high, left[node])))
        if count >= low and item.can(count):  # running
            left[node] -= count
            item = replace(item, home=node, count=count, fixed=draw(st.booleans()))
        elif len(room) > 1 and draw(st.integers(0, 4)) == 0:  # waiting for two nodes
            item = replace(item, low=high, nodes=2)
        items.append(item)
    return items, room


@settings(max_examples=300, deadline=None)
@given(fluid_states())
def test_the_look_ahead_shares_a_step_only_where_every_rule_plans_it_alike(state):
    """The look-ahead plays 7 first rules x 4 future rules; where their plans agree it
    takes the step once (`allocate_each`, `_Fluid.play_each`). That must give exactly what
    each rule played on its own gives: the same plans, the same completion times."""
    items, room = state
    free = {n: k - sum(i.count for i in items if i.fixed and i.home == n)
            for n, k in room.items()}
    assert allocate_each(items, free, CANDIDATES) == [allocate(items, free, *c)
                                                      for c in CANDIDATES]
    pairs = [(c, f) for c in CANDIDATES for f in FUTURES]
    played = _Fluid(items, room).play_each(pairs)
    assert played == {(c, f): play_forward(items, room, f, first=c) for c, f in pairs}
    # a static plan's plays: its counts as bounds now, others after the first step
    counts = {i.id: i.largest((i.low + i.high) // 2) for i in items}
    bounds = {"exact": {i: (k, k) for i, k in counts.items()},
              "grown": {i.id: (counts[i.id], i.high) for i in items},
              "lent": {i.id: (i.low, counts[i.id]) for i in items}}
    plays = [(c, f, then) for c in CANDIDATES[:3] for f in FUTURES[:2]
             for then in (None, "exact", "grown")]
    for now in ("exact", "lent"):
        start = _bounded(items, bounds[now])
        assert _Fluid(start, room).play_each(plays, bounds) == {
            (c, f, then): play_forward(start, room, f, first=c, then=bounds.get(then))
            for c, f, then in plays}
