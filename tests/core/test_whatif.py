"""The what-if planner: a simulation started from a live state plays out as the whole one did,
and the planner follows the candidate whose plan is predicted best, changing only for a gain
larger than its measured error (issue 33)."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial

import pytest

from marbled.core.explain import reasons
from marbled.core.model import JobState, State
from marbled.core.policy import get_policy
from marbled.core.policy.whatif import CANDIDATES, Prediction, WhatIfPolicy, _forward, predict
from marbled.resources import load_profile
from marbled.sim.engine import Simulator
from marbled.sim.generators import together
from marbled.sim.workloads import Arrival, poisson

MODELS = ("lenet", "alexnet", "resnet-50", "inception-v3", "resnet-101", "vgg-16")


@pytest.fixture(scope="module")
def book():
    return load_profile("summit-v100")


class _Snapshot:
    """The policy, and the simulation that starts from the state of its first decision at or
    after `at` that a plan can start from (nothing being checkpointed)."""

    def __init__(self, policy, at: float):
        self._policy, self._at, self.taken = policy, at, None

    def __getattr__(self, name: str):
        return getattr(self._policy, name)

    def decide(self, state: State, now: float) -> list:
        if self.taken is None and now >= self._at:
            self.taken = _forward(state, now, 10_000)
        return self._policy.decide(state, now)


def _at_once(arrivals: list[Arrival]) -> list[Arrival]:
    return [replace(a, at=0.0) for a in arrivals]


@pytest.mark.parametrize("policy", ["marble", "malleable", "elastic", "adaptive", "rigid"])
@pytest.mark.parametrize("fraction", [0.2, 0.5])
def test_a_simulation_from_a_live_state_ends_as_the_whole_one(book, policy, fraction):
    """Jobs all submitted at 0 on two nodes of 4 GPUs, costs 10/10 s: the simulation started
    from the state of a decision part-way (runs under way where they are, with the work they
    have left, suspended jobs with their checkpoints) ends every job when the whole one did,
    to within a step."""
    steps = {m: (2000, 20000) for m in MODELS}
    arrivals = _at_once(poisson(12, 10.0, dict.fromkeys(MODELS, 1.0), steps, 7))
    whole = Simulator(book, get_policy(policy), 4, 2, 10.0, 10.0).run(arrivals)
    spy = _Snapshot(get_policy(policy), fraction * whole.makespan)
    Simulator(book, spy, 4, 2, 10.0, 10.0).run(arrivals)
    start = spy.taken
    assert start is not None and start.running  # part-way: some run under way
    part = Simulator(start.book, get_policy(policy), 4, 2).run(start.arrivals, start.running)
    step = max(1.0 / c.throughput(1) for c in start.book.curves.values())
    for i, job_id in enumerate(start.ids, start=1):
        assert part.jobs[i].completion + start.at == pytest.approx(
            whole.jobs[job_id].completion, abs=2 * step), f"job {job_id}"


def _best(book, arrivals, nodes: int, gpus: int, metric: str) -> float:
    out = []
    for _, make in (*CANDIDATES, ("adaptive", partial(get_policy, "adaptive"))):
        r = Simulator(book, make(), gpus, nodes, 10.0, 10.0).run(arrivals)
        out.append(getattr(r, metric))
    return min(out)


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_on_jobs_submitted_together_it_reaches_the_best_candidate(book, seed):
    """With every job known at 0 and curves that are the truth, the first plan predicts each
    candidate exactly, so the planner ends as the best candidate for its objective does
    (adaptive itself is one: six jobs are few enough for its look-ahead)."""
    arrivals = together(seed, book=book, jobs=6, models=MODELS)
    for weight, metric in ((1.0, "average_jct"), (0.0, "makespan")):
        r = Simulator(book, WhatIfPolicy(jct_weight=weight), 4, 1, 10.0, 10.0).run(arrivals)
        assert getattr(r, metric) == pytest.approx(_best(book, arrivals, 1, 4, metric))


def test_an_open_queue_on_several_nodes_runs_to_the_end_with_a_job_of_fixed_count(book):
    """Arrivals over time on 3 nodes, a third of the jobs of a fixed count, a profile that is
    wrong about the jobs' speed (the truth 30 % slower): every job ends once, with its steps,
    the planner made a plan at arrivals, not at every decision, and its predictions' error
    raised the gain a change needs, by less than the profile is off."""
    arrivals = poisson(30, 2.0, dict.fromkeys(MODELS, 1.0), {m: (2000, 40000) for m in MODELS},
                       11)
    arrivals = [replace(a, spec=replace(a.spec, gpus=2)) if i % 3 == 0 else a
                for i, a in enumerate(arrivals)]
    slow = replace(book, curves={k: replace(c, steps_per_second=tuple(
        v and v * 0.7 for v in c.steps_per_second)) for k, c in book.curves.items()})
    planner = WhatIfPolicy(plan_every=600.0)
    r = Simulator(book, planner, 4, 3, 10.0, 10.0, truth=slow).run(arrivals)
    assert len(r.jobs) == 30
    for job_id, stats in r.jobs.items():
        runs = [x for x in r.runs if x.job == job_id]
        assert runs[-1].reason == "done" and runs[-1].end_step == stats.steps
        assert all(a.end_step == b.start_step for a, b in zip(runs, runs[1:], strict=False))
    assert 1 <= planner.plans <= 30
    # the profile's error shows in the predictions scored, and the hysteresis grows by it,
    # but less than the profile is off (1 / 0.7 - 1 = 0.43): the running jobs' ends are
    # corrected once measured. (With the profile's ends it was 1.6; as a median of each
    # job's error over its own time ahead, 43: then no plan ever changed.)
    assert 0.01 < planner.error() < 0.43
    assert 0.01 < planner.plan.threshold - planner.min_gain < 0.43  # the last plan's


def test_it_keeps_its_driver_unless_the_gain_beats_its_error():
    """Hysteresis: the first plan takes the best; a later one changes the driver only for a
    predicted gain above min_gain plus the error of the predictions scored so far."""
    planner = WhatIfPolicy(min_gain=0.02, jct_weight=0.5)
    first = planner.driver
    assert first == "adaptive"  # until a plan is made: adaptive, its own look-ahead and all
    ends = {c: {1: 100.0} for c in (first, "elastic")}

    def plan(at: float, elastic: float) -> None:
        predicted = {first: (1000.0, 2000.0), "elastic": (1000.0 * elastic, 2000.0 * elastic)}
        planner._adopt(Prediction(at, predicted, ends, 0.01))

    plan(0.0, 0.999)
    assert planner.driver == "elastic"  # the first plan: the best, however small the gain
    plan(10.0, 1.01)
    assert planner.driver == "elastic"  # adaptive better by 1 %: below min_gain
    plan(20.0, 1.05)
    assert planner.driver == first  # by 5 %: it changes
    # job 1 was predicted to end 100 s after the plan at 20 s; it ends at 220 s: error 1.0
    state = State.single_node(4)
    planner._score(_ended(state, 1), 220.0)
    assert list(planner._errors) == [(100.0, 100.0)] and planner.error() == 1.0
    plan(30.0, 0.5)  # elastic predicted twice as good, but predictions have been 100 % off
    assert planner.driver == first and planner.plan.threshold == pytest.approx(1.02)
    assert planner.plans == 4 and planner.cpu_s == pytest.approx(0.04)


def _ended(state: State, job_id: int) -> State:
    from marbled.core.model import Job

    state.submit(Job(job_id, 1, True))
    state.finished(job_id, JobState.DONE)
    return state


def test_a_plan_made_beside_the_decisions_is_adopted_when_ready_and_explained(book):
    """With an executor (the daemon gives it a process), a decision hands the plan over and
    goes on with its driver; a later decision adopts it, and `explain` names the plan."""
    arrivals = together(8, book=book, jobs=5, models=MODELS)
    planner = WhatIfPolicy()
    with ThreadPoolExecutor(1) as pool:
        planner.background = pool
        sim = Simulator(book, planner, 4, 1, 10.0, 10.0)
        r = sim.run(arrivals)
    assert len(r.jobs) == 5 and planner.plans >= 1
    state = State.single_node(4)
    from marbled.core.model import Job

    state.submit(Job(1, 2, True))
    lines = reasons(state.jobs[1], state, planner, 0.0)
    assert lines[0] == "it " + get_policy("adaptive").explain(state.jobs[1], state, 0.0)
    assert any(f"the planner follows {planner.driver}'s plan: predicted mean JCT" in line
               for line in lines)


def test_predict_leaves_out_a_candidate_that_cannot_place_the_jobs(book):
    """A job on two nodes: the single-node policies cannot run it, so they are no candidate."""
    from marbled.core.spec import JobSpec

    arrivals = [Arrival(0.0, JobSpec(emulate=True, model="resnet-50", steps=5000, gpus=2,
                                     nodes=2)),
                Arrival(0.0, JobSpec(emulate=True, model="vgg-16", steps=3000))]
    spy = _Snapshot(get_policy("marble"), 0.0)
    Simulator(book, spy, 4, 2).run(arrivals)
    out = predict(spy.taken)
    # (and adaptive itself, its look-ahead and all: two jobs are few enough)
    assert set(out.predicted) == {name for name, _ in CANDIDATES if name.startswith(
        "adaptive")} | {"adaptive", "marble", "rigid"}
    assert all(math.isfinite(j) and m >= j for j, m in out.predicted.values())


def test_the_queue_forecast_plays_the_plan_followed_forward(book):
    """`marble status`'s forecast under whatif is the forecast of the policy it follows (a
    planner's own plans would take it past its time budget); a FixedBias rule too."""
    from marbled.core.policy.whatif import FixedBias
    from marbled.core.spec import JobSpec
    from marbled.sim.forecast import Left, forecast

    jobs = [Left(i, JobSpec(emulate=True, model=m, steps=3000), 3000, False)
            for i, m in enumerate(MODELS[2:], start=1)]
    planner = WhatIfPolicy()
    mine = forecast(jobs, book, planner, [6], now=100.0)
    assert mine.reason is None
    assert mine.ends == forecast(jobs, book, get_policy("adaptive"), [6], now=100.0).ends
    planner.driver = "adaptive(bias -1)"
    assert forecast(jobs, book, planner, [6], now=100.0).ends == \
        forecast(jobs, book, FixedBias(-1.0), [6], now=100.0).ends


def test_a_tie_goes_to_adaptive_and_its_own_rule_not_to_the_first_rule_tried(book):
    """An idle cluster makes every plan alike: the tie goes to adaptive itself where a plan is
    small enough to play it, else to its rule without look-ahead (bias 1). A tie once went to
    bias -1 (the long job's next GPU first), which then drove every plan of a 16-node trace
    at load 0.6, for 1.59x the best average JCT."""
    planner = WhatIfPolicy()
    alike = {name: (1000.0, 5000.0) for name in ("adaptive(bias -1)", "adaptive(bias 1)",
                                                 "malleable")}
    planner._adopt(Prediction(0.0, alike, {c: {} for c in alike}, 0.0))
    assert planner.driver == CANDIDATES[0][0] == "adaptive(bias 1)"
    one = _Snapshot(get_policy("marble"), 0.0)
    Simulator(book, one, 4, 1).run(together(3, book=book, jobs=3, models=MODELS))
    assert next(iter(predict(one.taken).predicted)) == "adaptive"
    # a later tie with the plan followed goes by the order too: back to adaptive's rule (the
    # hysteresis keeps a driver against a gain, not against an equal; kept, the rule without
    # look-ahead drove a 16-node trace on for 1.76x the best average JCT)
    planner._adopt(Prediction(1.0, {"malleable": (900.0, 4000.0)}, {"malleable": {}}, 0.0))
    assert planner.driver == "malleable"
    planner._errors.append((1.0, 100.0))  # an error of 1 %: a change needs a gain above it
    planner._adopt(Prediction(2.0, alike, {c: {} for c in alike}, 0.0))
    assert planner.plan.threshold > 0 and planner.driver == "adaptive(bias 1)"


def test_in_the_broker_a_plan_rests_for_its_cpu_over_the_share_of_a_core_it_may_take(book):
    """`--plan-cpu`: after a plan made beside the decisions took C CPU seconds, the next one
    is made no sooner than C / share later. With a share of one billionth, the first plan is
    the last one, though jobs keep coming and --plan-every is 0."""
    arrivals = poisson(12, 4.0, dict.fromkeys(MODELS, 1.0), {m: (2000, 20000) for m in MODELS},
                       5)
    planner = WhatIfPolicy(plan_every=0.0, plan_cpu=1e-9)
    with ThreadPoolExecutor(1) as pool:
        planner.background = pool
        r = Simulator(book, planner, 4, 2, 10.0, 10.0).run(arrivals)
    assert len(r.jobs) == 12
    assert planner.plans == 1 and planner.cpu_s > 0
    assert planner._rest_until >= planner.plan.at + planner.cpu_s / 1e-9
