"""Curves learned from runs (core/learning.py): robust estimates, the fitted scaling model,
the search for an unknown or wrongly profiled model's optimum, and the costs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marbled.core.learning import Knowledge, Learning, fit_scaling, scaled
from marbled.core.profiles import ThroughputCurve

TRUE = (100.0, 150.0, 140.0, 120.0, 100.0, 90.0)  # peaks at 2 GPUs
WRONG = ThroughputCurve("m", (50.0, 90.0, 120.0, 140.0, 150.0, 160.0))  # says 6


def explore(k: Knowledge, truth=TRUE, runs: int = 8) -> list[int]:
    tried = []
    for _ in range(runs):
        g = k.next_count(len(truth))
        tried.append(g)
        k = k.with_sample("throughput", truth[g - 1], g)
    return tried


def test_fit_recovers_an_optimus_curve_exactly():
    a, b, c = 0.002, 0.01, 0.0015
    points = {g: 1 / (a + b / g + c * g) for g in (1, 2, 4, 6)}
    coef = fit_scaling(points)
    assert coef == pytest.approx((a, b, c), rel=1e-6)
    assert scaled(coef, 3) == pytest.approx(1 / (a + b / 3 + c * 3))
    assert fit_scaling({1: 1.0, 2: 2.0}) is None  # two counts do not determine three numbers


def test_one_count_says_the_scale_and_never_moves_the_optimum():
    """A run on the profile's optimum at 0.56x its speed: a slower machine or a wrong shape,
    one count cannot tell, so the profile's optimum stands (what --no-learn does)."""
    assert explore(Knowledge("m", WRONG)) == [6] * 8
    for k in (0.5, 50.0):  # a machine k times the profile's speed: the same count, scaled
        right = Knowledge("m", ThroughputCurve("m", TRUE))
        for g in (2, 3, 2):
            right = right.with_sample("throughput", TRUE[g - 1] * k, g)
        assert right.shape_holds() and right.next_count(6) == 2
        assert right.curve(6).steps_per_second == pytest.approx([v * k for v in TRUE])


def test_a_wrong_profile_is_corrected_once_two_counts_contradict_its_shape():
    k = Knowledge("m", WRONG)
    for g in (6, 3):  # e.g. a run on its optimum and one as a secondary on 3 GPUs
        k = k.with_sample("throughput", TRUE[g - 1], g)
    assert not k.shape_holds()
    tried = explore(k)
    assert tried[:4] == [4, 2, 1, 2] and set(tried[3:]) == {2}  # the counts beside the best
    # the profile's shape, corrected by the ratios beside each count: interpolated between
    # 3 and 6, held below 3 (never a flat curve, never extrapolated)
    ratio3, ratio6 = 140 / 120, 90 / 160
    assert k.curve(6).throughput(4) == pytest.approx(140 * (ratio3 + (ratio6 - ratio3) / 3))
    assert k.curve(6).throughput(1) == pytest.approx(50 * ratio3)


def test_noise_is_not_a_shape():
    """Two counts 20% apart in ratio, but each count's own runs spread more than that."""
    k = Knowledge("m", ThroughputCurve("m", TRUE))
    for v2, v3 in ((150.0, 140.0), (110.0, 170.0), (190.0, 115.0)):
        k = k.with_sample("throughput", v2, 2).with_sample("throughput", v3, 3)
    assert k.shape_holds() and k.next_count(6) == 2
    steady = Knowledge("m", ThroughputCurve("m", TRUE))
    for _ in range(3):
        steady = steady.with_sample("throughput", 150.0, 2).with_sample("throughput", 100.0, 3)
    assert not steady.shape_holds()


def test_an_unknown_model_doubles_while_it_pays_then_settles():
    tried = explore(Knowledge("new"))
    assert tried[:3] == [1, 2, 4] and set(tried[3:]) == {2}
    flat = (10.0, 10.2, 10.3, 10.3, 10.3, 10.3)  # the second GPU adds 2%: no further doubling
    assert explore(Knowledge("flat"), flat, runs=4) == [1, 2, 2, 2]


def test_a_right_profile_is_not_explored_and_its_level_is_learned():
    right = ThroughputCurve("m", TRUE)
    k = Knowledge("m", right)
    assert explore(k) == [2] * 8
    slower = k.with_sample("throughput", 75.0, 2).with_sample("throughput", 75.0, 2)
    # one count at half the profile: the level differs (a slower machine), not the shape
    assert slower.shape_holds() and slower.next_count(6) == 2
    both = slower.with_sample("throughput", 50.0, 1)
    assert both.shape_holds() and both.next_count(6) == 2
    assert both.curve(6).throughput(4) == pytest.approx(60.0)  # 120 scaled by one half


def test_median_resists_an_outlier_and_min_samples_gates_trust():
    k = Knowledge("m", learning=Learning(min_samples=3))
    for v in (100.0, 101.0):
        k = k.with_sample("throughput", v, 1)
    assert k.measured() == {}
    k = k.with_sample("throughput", 5.0, 1)  # a run that was mostly start-up
    assert k.measured() == {1: 100.0}


def test_costs_come_from_the_profile_until_measured():
    profiled = ThroughputCurve("m", TRUE, startup_s=8.0, suspend_s=1.0)
    k = Knowledge("m", profiled).with_sample("throughput", 150.0, 2)
    assert (k.curve(6).startup_s, k.curve(6).suspend_s) == (8.0, 1.0)
    k = k.with_sample("startup", 3.0).with_sample("startup", 5.0).with_sample("suspend", 0.2)
    assert (k.curve(6).startup_s, k.curve(6).suspend_s) == (4.0, 0.2)


def test_disagreement_names_the_optimum_and_the_counts():
    k = Knowledge("m", WRONG)
    for g in (6, 3, 1, 2):
        k = k.with_sample("throughput", TRUE[g - 1], g)
    said = k.disagreement(6)
    assert "100 steps/s on 1 GPU, the profile says 50" in said
    assert "optimum 2 GPUs, the profile says 6" in said
    assert "90 steps/s on 6 GPUs, the profile says 160" in said
    assert Knowledge("m", ThroughputCurve("m", TRUE)).disagreement(6) is None
    faster = Knowledge("m", WRONG).with_sample("throughput", 8000.0, 6)
    assert faster.disagreement(6) == "its runs train at 50x the profile's speed; the " \
        "profile's shape holds"


curves = st.tuples(st.floats(0.0, 0.01), st.floats(0.001, 0.05), st.floats(0.0, 0.01))


@settings(max_examples=200, deadline=None)
@given(coef=curves, size=st.integers(2, 8))
def test_search_ends_on_a_count_within_gain_of_the_best(coef, size):
    """On any Optimus-shaped truth the search settles, and on a count whose throughput is
    within the doubling threshold of the true optimum."""
    truth = tuple(1 / (coef[0] + coef[1] / g + coef[2] * g) for g in range(1, size + 1))
    tried = explore(Knowledge("m"), truth, runs=3 * size)
    final = tried[-1]
    assert tried[-size:] == [final] * size  # settled
    assert truth[final - 1] >= max(truth) / (1 + Learning().gain) ** 2


def _faster(book, k: float):
    """`book` on a machine k times as fast: every throughput times k, every cost over k."""
    from dataclasses import replace

    from marbled.core.profiles import ProfileBook

    def scaled_curve(c: ThroughputCurve) -> ThroughputCurve:
        return replace(c, steps_per_second=tuple(v and v * k for v in c.steps_per_second),
                       shared=tuple((n, v * k) for n, v in c.shared),
                       startup_s=c.startup_s and c.startup_s / k,
                       suspend_s=c.suspend_s and c.suspend_s / k)

    return ProfileBook(f"{book.system} x{k}", book.gpus_per_node,
                       {key: scaled_curve(c) for key, c in book.curves.items()})


@pytest.mark.parametrize("k", [0.5, 50.0])
@pytest.mark.parametrize("policy", ["marble"])
def test_a_machine_k_times_the_profile_makes_the_no_learn_decisions(k, policy):
    """The paper job sets run on a machine k times the profile's speed: learning sees the
    scale, so every run (job, node, GPUs, role, steps) is the one --no-learn makes."""
    from marbled.core.policy import get_policy
    from marbled.resources import load_job_file, load_profile, workload_path
    from marbled.sim.engine import Simulator

    book = load_profile()
    truth = _faster(book, k)
    for n in range(1, 10):
        jobs = load_job_file(workload_path(f"paper-jobset{n}"))
        told, learned = (Simulator(book, get_policy(policy), book.gpus_per_node, truth=truth,
                                   learning=how).run(jobs) for how in (None, Learning()))
        shape = [(r.job, r.node, r.gpus, r.role, r.start_step, r.end_step)
                 for r in told.runs]
        assert [(r.job, r.node, r.gpus, r.role, r.start_step, r.end_step)
                for r in learned.runs] == shape, n
        assert learned.makespan == pytest.approx(told.makespan, rel=0.03), n
