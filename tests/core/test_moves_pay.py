"""Lifecycle I6, moves pay: a reshape is priced at the start-up and suspension each model is
measured to take on this machine (an assumed few seconds until one is measured, never 0),
and a run that has not reported its first step is not reshaped by a policy, in the
simulator as in the daemon (`core.decision.starting_up`, the one rule both drivers use)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from marbled.core.decision import settle, starting_up
from marbled.core.learning import DEFAULT_STARTUP_S, LearnedBook, Learning
from marbled.core.measure import trains
from marbled.core.model import Cancel, Job, Start, State, Suspend
from marbled.core.policy import get_policy
from marbled.core.policy.base import reshape_cost, reshape_pays
from marbled.resources import load_profile
from marbled.sim.engine import Simulator
from marbled.sim.workloads import Arrival, JobSpec

pytestmark = pytest.mark.core

ADAPTIVE = get_policy("adaptive")
BOOK = load_profile("summit-v100")
RESNET = BOOK.lookup("resnet-50")  # fastest on 3 GPUs; the profile gives no costs


def grown_alone(curve, steps: float = 20_000.0) -> tuple[State, float]:
    """One ResNet-50 job started on 1 GPU of an idle 6-GPU node at t = 0, its run expected
    to end by its curve; (the state, the time 1000 s on, when it has long settled)."""
    state = State.single_node(6)
    state.submit(Job(1, RESNET.optimal_gpus(6), True, curve=curve, steps_left=steps))
    [start] = [a for a in ADAPTIVE.decide(state, 0.0) if isinstance(a, Start)]
    state.apply(replace(start, gpus=(0,)), 0.0)
    state.expect(1, steps / curve.throughput(1))
    return state, 1000.0


def moves(state: State, now: float, trained: bool) -> list:
    """What settle() hands a driver whose word is that job 1's run has (not) trained."""
    return [a for a, _ in settle(ADAPTIVE, state, now,
                                 lambda a: starting_up(a, state, lambda _: trained))]


def test_adaptive_does_not_reshape_a_run_that_has_not_reported_its_first_step():
    state, now = grown_alone(RESNET)
    wanted = ADAPTIVE.decide(state, now)
    assert [type(a) for a in wanted] == [Suspend]  # 1 -> 3 GPUs pays: the policy wants it
    assert moves(state, now, trained=False) == []  # before its first step: not taken
    assert state.jobs[1].state.value == "running" and len(state.jobs[1].gpus) == 1
    [move] = moves(state, now, trained=True)  # once it trains, it is
    assert isinstance(move, Suspend) and "1 -> 3 GPUs" in move.reason


def test_the_rule_holds_only_a_policys_suspension_of_a_running_job():
    state, _ = grown_alone(RESNET)
    assert starting_up(Suspend(1, None, "x"), state, lambda _: False)
    assert not starting_up(Suspend(1, None, "x"), state, lambda _: True)
    assert not starting_up(Cancel(1, "x"), state, lambda _: False)  # a cancel always goes


def test_a_run_trains_once_it_reports_its_first_step():
    assert not trains({})
    assert not trains({"step": 0, "start_step": 0, "phases": {"python": 1.0}})
    assert not trains({"step": 40, "start_step": 40, "phases": {"restored": 2.0}})
    assert trains({"step": 40, "start_step": 40, "phases": {"first_step": 3.0}})
    assert trains({"step": 41, "start_step": 40})  # a job that marks no phases


def test_a_measured_start_up_makes_a_move_that_paid_at_cost_0_not_pay():
    # 1 -> 3 GPUs with 300 s of work left on 1 GPU saves about 150 s: free, it pays
    state, now = grown_alone(RESNET, steps=300 * RESNET.throughput(1) + 1000 * RESNET.throughput(1))
    assert reshape_cost(state.jobs[1]) == 0.0
    assert reshape_pays(state.jobs[1], 3, now) is True
    assert [type(a) for a in ADAPTIVE.decide(state, now)] == [Suspend]
    # this machine's runs of the model took 200 s to their first step: it no longer pays
    book = LearnedBook(BOOK, Learning())
    for seconds in (190.0, 200.0, 400.0):  # the median of the last runs: an outlier is not it
        book.record("resnet-50", "startup", seconds)
    learned = book.lookup("resnet-50")
    assert learned.startup_s == 200.0 and learned.steps_per_second == RESNET.steps_per_second
    measured, now = grown_alone(learned, steps=300 * RESNET.throughput(1)
                                + 1000 * RESNET.throughput(1))
    assert reshape_cost(measured.jobs[1]) == 200.0
    assert reshape_pays(measured.jobs[1], 3, now) is False
    assert ADAPTIVE.decide(measured, now) == []


def test_until_a_start_up_is_measured_a_few_seconds_are_assumed_not_0():
    book = LearnedBook(BOOK, Learning())
    assert book.lookup("resnet-50").startup_s == DEFAULT_STARTUP_S > 0
    assert book.lookup("resnet-50").suspend_s is None  # nothing assumed of a checkpoint
    assert "startup_s" not in book.as_profile()["models"]["resnet-50"]  # not a measurement
    book.record("resnet-50", "startup", 12.0)
    book.record("resnet-50", "suspend", 3.0)
    curve = book.lookup("resnet-50")
    assert (curve.startup_s, curve.suspend_s) == (12.0, 3.0)
    assert book.as_profile()["models"]["resnet-50"]["startup_s"] == 12.0
    assert LearnedBook(BOOK, Learning(startup_s=None)).lookup("resnet-50").startup_s is None


def test_the_simulator_reshapes_no_run_before_its_first_step():
    """Malleable (Equipartition) shares the node with each newcomer at once: the jobs that
    arrive 10 s apart took their runs before their first step (a 60 s start-up), undone at
    step 0. Now each run is reshaped only once it has trained a step."""
    launch, suspend = 60.0, 5.0
    sim = Simulator(BOOK, get_policy("malleable"), 6, launch_s=launch, suspend_s=suspend)
    result = sim.run([Arrival(0.0, JobSpec(model="inception-v3", steps=20_000)),
                      Arrival(10.0, JobSpec(model="resnet-50", steps=20_000)),
                      Arrival(20.0, JobSpec(model="vgg-16", steps=5_000))])
    suspended = [r for r in result.runs if r.reason == "suspended"]
    assert suspended  # it still reshapes
    for run in suspended:  # each after its start-up and first step, then its checkpoint
        assert run.end - run.start > launch + suspend, run
        assert run.end_step > run.start_step, run
