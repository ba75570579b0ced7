"""The phased plan: a search over every schedule of a few jobs that changes counts at ends,
and the policy that follows it (issue 33: schedules the zoo does not make)."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marbled.core.model import Job, JobState, Role, Start, State
from marbled.core.policy.phased import Phased, PhaseJob, _schedules, search
from marbled.core.policy.whatif import PHASED, Prediction, WhatIfPolicy
from marbled.core.profiles import ProfileBook, ThroughputCurve
from marbled.core.spec import JobSpec
from marbled.resources import load_profile
from marbled.sim.engine import Simulator
from marbled.sim.generators import together
from marbled.sim.workloads import Arrival
from tests.core.test_policy_invariants import check_decision

MODELS = ("lenet", "alexnet", "resnet-50", "inception-v3", "resnet-101", "vgg-16")


def linear(name: str, gpus: int = 2, startup: float = 0.0, suspend: float = 0.0):
    """One step a second a GPU, up to `gpus`."""
    return ThroughputCurve(name, tuple(float(k) for k in range(1, gpus + 1)),
                           startup_s=startup, suspend_s=suspend)


def test_on_linear_curves_the_shorter_job_runs_first_on_every_gpu():
    # 100 and 300 steps on 2 GPUs: A alone on both (ends at 50), then B on both (ends at
    # 200): the mean completion 125 s, the least of any schedule, and the same last end
    a, b = PhaseJob(1, linear("a"), 100.0), PhaseJob(2, linear("b"), 300.0)
    table = search([a, b], 2, jct_weight=0.5)
    assert table == {frozenset({1, 2}): {1: 2}, frozenset({2}): {2: 2}}


def test_makespan_alone_shares_the_gpus_so_that_both_end_together():
    # concave: 1 step/s on 1 GPU, 1.5 on 2. Both on one GPU end at 100 and 300 s, then B
    # alone on 2 GPUs: 100 + 200 / 1.5 = 233 s, the least last end of any schedule
    curve = ThroughputCurve("c", (1.0, 1.5))
    a, b = PhaseJob(1, curve, 100.0), PhaseJob(2, curve, 300.0)
    table = search([a, b], 2, jct_weight=0.0)
    assert table[frozenset({1, 2})] == {1: 1, 2: 1}


def test_a_move_that_costs_more_than_it_gains_is_not_made():
    # A runs on 1 GPU with 10 s left; moving it to 2 would cost 60 s (suspend and start-up):
    # the plan keeps it where it is, the other GPU idle, rather than moving it
    a = PhaseJob(1, linear("a", startup=30.0, suspend=30.0), 10.0, gpus=1)
    assert search([a], 2, jct_weight=0.5) == {frozenset({1}): {1: 1}}


def _book(*curves: ThroughputCurve) -> ProfileBook:
    return ProfileBook("test", 2, {c.model: c for c in curves})


def test_the_simulator_plays_the_plan_as_the_search_predicted():
    curves = (linear("a"), ThroughputCurve("b", (1.0, 1.5)), linear("c"))
    work = (100, 300, 200)
    jobs = [PhaseJob(i, c, float(w))
            for i, (c, w) in enumerate(zip(curves, work, strict=True), start=1)]
    table = search(jobs, 2, jct_weight=0.5)
    (mean, last), = [(m, e) for m, e, t in _schedules(jobs, 2) if t == table]
    arrivals = [Arrival(0.0, JobSpec(emulate=True, model=c.model, steps=w))
                for c, w in zip(curves, work, strict=True)]
    r = Simulator(_book(*curves), Phased(table), 2, 1, 0.0, 0.0).run(arrivals)
    assert r.average_jct == pytest.approx(mean, rel=1e-3)
    assert r.makespan == pytest.approx(last, rel=1e-3)
    # in FIFO order: C (job 3) never starts while B (job 2) waits
    first = {j: min(run.start for run in r.runs if run.job == j) for j in (1, 2, 3)}
    assert first[1] <= first[2] <= first[3]


def test_no_phase_starts_a_job_while_an_earlier_one_waits():
    # C is the shortest: SRPT would run it first; the FIFO has A, B, C start in that order
    jobs = [PhaseJob(1, linear("a"), 300.0), PhaseJob(2, linear("b"), 200.0),
            PhaseJob(3, linear("c"), 10.0)]
    schedules = list(_schedules(jobs, 2))
    assert schedules
    for _, _, table in schedules:
        phases = sorted(table.items(), key=lambda kv: -len(kv[0]))  # in the order they come
        first = {i: min(n for n, (_, counts) in enumerate(phases) if i in counts)
                 for i in (1, 2, 3)}
        assert first[1] <= first[2] <= first[3], table


def test_a_job_outside_the_plan_is_placed_by_the_fallback():
    curves = (linear("a"), linear("b"))
    table = search([PhaseJob(1, curves[0], 100.0)], 2, jct_weight=0.5)
    policy = Phased(table)
    arrivals = [Arrival(0.0, JobSpec(emulate=True, model="a", steps=100)),
                Arrival(10.0, JobSpec(emulate=True, model="b", steps=100))]
    r = Simulator(_book(*curves), policy, 2, 1, 0.0, 0.0).run(arrivals)
    # job 1 on both GPUs as planned, to its end at 50 s; job 2 (no plan) after it, as
    # malleable places it: on both GPUs, 50 s
    assert [(run.job, run.gpus, run.start, run.reason) for run in r.runs] == [
        (1, (0, 1), 0.0, "done"), (2, (0, 1), pytest.approx(50.0), "done")]
    assert r.jobs[2].completion == pytest.approx(100.0)


@pytest.fixture(scope="module")
def book():
    return load_profile("summit-v100")


def test_the_planner_adopts_a_phased_plan_where_it_is_predicted_best(book):
    """4 jobs submitted together on one node of 4 GPUs: the planner's first plan weighs the
    phased plan beside the zoo, and what it predicts of the plan it follows is what the
    simulation then does (no speed error: the simulator is the prediction)."""
    adopted = []
    for seed in range(1, 11):
        planner = WhatIfPolicy()
        r = Simulator(book, planner, 4, 1, 10.0, 10.0).run(
            together(seed, book=book, models=MODELS))
        plan = planner.plan
        assert plan is not None and PHASED in plan.predicted
        mean, last = plan.predicted[plan.driver]
        ends = [j.completion for j in r.jobs.values()]
        assert sum(ends) / len(ends) == pytest.approx(mean, rel=1e-3)
        assert max(ends) == pytest.approx(last, rel=1e-3)
        if plan.driver == PHASED:
            adopted.append(seed)
            assert "phased" in planner.plan_line()
    assert adopted  # it is best somewhere (2 of these 10 sets when written: 8 and 9)


def test_every_job_ends_once_under_phased_plans_with_arrivals(book):
    """An open queue on one node: a phased plan drives the 4 jobs known first, a fifth comes
    that the plan does not know (the planner plans again at once); every job trains its
    steps to its end, in runs that follow each other."""
    drivers = []

    class Recorded(WhatIfPolicy):
        def _adopt(self, prediction):
            super()._adopt(prediction)
            drivers.append(self.driver)

    arrivals = [Arrival(t, JobSpec(emulate=True, model=m, steps=s)) for t, m, s in (
        (0.0, "alexnet", 9231), (0.0, "vgg-16", 1105), (0.0, "resnet-50", 2297),
        (0.0, "vgg-16", 1135), (200.0, "inception-v3", 3000))]
    planner = Recorded(plan_every=60.0)
    r = Simulator(book, planner, 4, 1, 10.0, 10.0).run(arrivals)
    assert drivers[0] == PHASED and len(drivers) >= 2
    assert sorted(r.jobs) == [1, 2, 3, 4, 5]
    for job_id, stats in r.jobs.items():
        runs = sorted((run for run in r.runs if run.job == job_id), key=lambda run: run.start)
        assert runs[0].start_step == 0 and runs[-1].end_step == stats.steps
        assert runs[-1].reason == "done" and runs[-1].end == stats.completion
        assert all(x.end_step == y.start_step for x, y in zip(runs, runs[1:], strict=False))


class _Checked(Phased):
    """Phased, every decision checked against the invariants every policy keeps (FIFO
    starts, counts its curve allows, GPUs of the node, ...): `check_decision`."""

    def choose(self, state, now):
        snapshot = State(nodes=state.nodes, jobs=dict(state.jobs))
        actions = super().choose(state, now)
        check_decision(self.following, snapshot, actions)
        return actions


@settings(max_examples=60, deadline=None)
@given(models=st.lists(st.sampled_from(MODELS), min_size=1, max_size=4),
       hours=st.lists(st.floats(0.05, 6.0), min_size=4, max_size=4),
       gpus=st.sampled_from([2, 4, 6]), cost=st.sampled_from([0.0, 10.0, 120.0]),
       late=st.booleans(), weight=st.sampled_from([0.0, 0.5, 1.0]))
def test_random_sets_follow_their_plan_in_fifo_order_to_every_end(book, models, hours, gpus,
                                                                   cost, late, weight):
    """A random set of 1-4 jobs on one node, the plan searched for it, played in the
    simulator (with `late`, one more job the plan does not know comes mid-way): every
    decision keeps the invariants, every job trains its steps once to its end, and with no
    job unknown the plan ends as the search predicted (within what its cost model leaves
    out: a second of cost a reshape)."""
    # as the simulator tells a policy its curves: with the costs it charges
    curves = [replace(book.lookup(m), startup_s=cost, suspend_s=cost) for m in models]
    steps = [max(1, round(h * 3600 * c.throughput(1))) for h, c in zip(hours, curves,
                                                                         strict=False)]
    jobs = [PhaseJob(i, c, float(s))
            for i, (c, s) in enumerate(zip(curves, steps, strict=True), start=1)]
    table = search(jobs, gpus, weight)
    assert table
    arrivals = [Arrival(0.0, JobSpec(emulate=True, model=m, steps=s))
                for m, s in zip(models, steps, strict=False)]
    if late:
        arrivals.append(Arrival(1800.0, JobSpec(emulate=True, model="alexnet", steps=5000)))
    r = Simulator(book, _Checked(table), gpus, 1, cost, cost).run(arrivals)
    for job_id, stats in r.jobs.items():
        runs = sorted((run for run in r.runs if run.job == job_id), key=lambda run: run.start)
        assert runs[0].start_step == 0 and runs[-1].end_step == stats.steps
        assert all(x.end_step == y.start_step for x, y in zip(runs, runs[1:], strict=False))
    if not late:
        (mean, last), = [(m, e) for m, e, t in _schedules(jobs, gpus) if t == table]
        assert r.average_jct == pytest.approx(mean, rel=0.01)
        assert r.makespan == pytest.approx(last, rel=0.01)


def test_a_prediction_with_a_phased_plan_crosses_to_the_broker(book):
    """The daemon makes plans in a process of its own: the phased plan's counts travel back
    with the prediction (pickled), by the live jobs' ids."""
    planner = WhatIfPolicy()
    Simulator(book, planner, 4, 1, 10.0, 10.0).run(together(8, book=book, models=MODELS))
    assert planner.driver == PHASED  # set 8 of the tuning sets: the phased plan drives
    table = planner._policies[PHASED].table
    assert pickle.loads(pickle.dumps(Prediction(0.0, {}, {}, 0.0, table))).table == table
    assert planner._policies[PHASED].jobs == {1, 2, 3, 4}


def test_a_job_the_plan_holds_back_says_which_ends_it_waits_for():
    # B runs on 2 GPUs only: A first on both, B once it ends (the FIFO keeps B behind A)
    a, b = PhaseJob(1, linear("a"), 300.0), PhaseJob(2, ThroughputCurve("b", (None, 2.0)), 100.0)
    table = search([a, b], 2, jct_weight=0.5)
    assert table[frozenset({1, 2})] == {1: 2}
    state = State.single_node(2)
    state.submit(Job(1, 2, True, curve=a.curve, steps_left=300.0))
    state.submit(Job(2, 2, True, curve=b.curve, steps_left=100.0))
    policy = Phased(table)
    for action in policy.decide(state, 0.0):
        state.apply(action)
    assert state.jobs[1].state is JobState.RUNNING and len(state.jobs[1].gpus) == 2
    assert policy.explain(state.jobs[2], state, 0.0) == (
        "waits for its phase of the planner's phased plan: it starts once job 1 ends")


def test_a_job_waiting_for_the_runs_the_plan_moves_says_so():
    table = {frozenset({1, 2}): {1: 1, 2: 1}, frozenset({1}): {1: 2}, frozenset({2}): {2: 2}}
    state = State.single_node(2)
    state.submit(Job(1, 2, True, curve=linear("a"), steps_left=300.0))
    state.submit(Job(2, 2, True, curve=linear("b"), steps_left=100.0))
    state.apply(Start(1, next(iter(state.nodes)), (0, 1), Role.PRIMARY))  # on both: off plan
    assert Phased(table).explain(state.jobs[2], state, 0.0) == (
        "starts on 1 GPU, its count in the planner's phased plan, once the runs the plan "
        "moves have stopped")


def test_a_planned_job_gone_from_the_broker_counts_as_ended():
    """A job of the plan that the broker withdrew (its row refused): the plan goes on with
    the jobs left, as if it had ended."""
    a, b = PhaseJob(1, linear("a"), 100.0), PhaseJob(2, linear("b"), 300.0)
    table = search([a, b], 2, jct_weight=0.5)
    state = State.single_node(2)
    state.submit(Job(2, 2, True, curve=b.curve, steps_left=300.0))  # job 1 is no more
    (start,) = Phased(table).decide(state, 0.0)
    assert (start.job, len(start.gpus)) == (2, table[frozenset({2})][2])
