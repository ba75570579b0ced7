"""Several nodes: promotion and growth onto any node, and no reshape that keeps a job's count
(hand-made workloads that reproduce what a user saw, and a property over random ones)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marbled.core.policy import get_policy
from marbled.core.policy.malleable import GUARD_S
from marbled.core.profiles import ProfileBook
from marbled.core.spec import JobSpec
from marbled.resources import load_profile
from marbled.sim.engine import SimResult, Simulator
from marbled.sim.workloads import Arrival, poisson

# 4-GPU nodes; 'four' trains fastest on all four GPUs of a node
BOOK = ProfileBook.from_mapping({"system": "four-gpu", "gpus_per_node": 4, "models": {
    "one": {"steps_per_second": [1.0, 0.9, 0.8, 0.7]},
    "two": {"steps_per_second": [1.0, 1.8, 1.7, 1.6]},
    "four": {"steps_per_second": [1.0, 1.9, 2.7, 3.4]},
}})


def job(at: float, model: str, steps: int) -> Arrival:
    return Arrival(at, JobSpec(emulate=True, model=model, steps=steps))


def simulate(policy: str, arrivals: list[Arrival], nodes: int = 2, **opts) -> SimResult:
    return Simulator(BOOK, get_policy(policy, **opts), 4, nodes).run(arrivals)


def runs(result: SimResult, job_id: int):
    return sorted((r for r in result.runs if r.job == job_id), key=lambda r: r.start)


# Two long jobs become 1-GPU secondaries on n0 (one GPU each frees up there before they
# arrive); n1 empties at t=100 and n0's primary frees only 2 GPUs at t=200. Read on one
# node, neither could ever reach its optimum of 4 on n0 and n1 idled to the end: the
# makespan was 20,026 s, each long job on one GPU throughout.
TRAP = [job(0, "two", 360), job(0, "one", 10), job(0, "one", 30), job(0, "four", 340),
        job(20, "four", 20_000), job(40, "four", 20_000)]


def test_marble_uses_any_node_for_a_secondary_that_cannot_grow_on_its_own():
    result = simulate("marble", TRAP)
    for long_job in (5, 6):
        assert len(runs(result, long_job)[-1].gpus) == 4, runs(result, long_job)
    assert {runs(result, j)[-1].node for j in (5, 6)} == {"node0", "node1"}
    assert result.makespan < 20_000 / 3.4 + 250  # was 20,026 s
    assert idle_node_while_below_optimum(result, 2) == 0.0


def test_marble_on_one_node_keeps_the_papers_promotion_only():
    one_node = [job(0, "two", 360), job(0, "four", 2000), job(0, "four", 2000)]
    result = simulate("marble", one_node, nodes=1)
    # the secondary on the 2 GPUs left is promoted to 4 only when the primary frees 2 more
    first, promoted = runs(result, 2)
    assert (len(first.gpus), len(promoted.gpus)) == (2, 4)
    assert promoted.start == pytest.approx(200.0)


def test_elastic_grows_onto_another_node_when_its_own_is_full():
    arrivals = [job(0, "four", 20_000), job(0, "four", 20_000)]
    result = simulate("elastic", arrivals, grow_after=10)
    # both start on node0 with one GPU; doubling to 2 fits there, to 4 only on node1
    counts = {(r.job, r.node, len(r.gpus)) for r in result.runs}
    assert (1, "node0", 1) in counts and (2, "node0", 1) in counts
    assert any(n == "node1" and g == 4 for _, n, g in counts)
    assert result.makespan < 20_000 / 1.9  # neither stays on 2 GPUs of node0 to its end


def test_malleable_never_moves_a_job_to_the_same_count():
    arrivals = [job(0, "four", 3000), job(0, "four", 3000), job(0, "two", 500),
                job(400, "four", 3000), job(900, "one", 100)]
    result = simulate("malleable", arrivals, nodes=3)
    check_no_same_count_move(result)


def check_no_same_count_move(result: SimResult) -> None:
    by_job: dict[int, list] = {}
    for r in sorted(result.runs, key=lambda r: r.start):
        by_job.setdefault(r.job, []).append(r)
    for job_runs in by_job.values():
        for before, after in itertools.pairwise(job_runs):
            if before.reason == "suspended":
                assert (len(after.gpus), after.share) != (len(before.gpus), before.share), (
                    f"job {before.job} reshaped from {before} to {after} at the same count")


def idle_node_while_below_optimum(result: SimResult, nodes: int) -> float:
    """Seconds during which a whole node has no run while a malleable job runs below its
    optimal count (4 for 'four', 2 for 'two', 1 for 'one') on another node."""
    optimum = {"one": 1, "two": 2, "four": 4}
    model = {i: s.model for i, s in result.jobs.items()}
    times = sorted({r.start for r in result.runs} | {r.end for r in result.runs})
    total = 0.0
    for a, b in itertools.pairwise(times):
        live = [r for r in result.runs if r.start <= (a + b) / 2 < r.end]
        below = any(len(r.gpus) < optimum[model[r.job]] for r in live)
        if below and len({r.node for r in live}) < nodes:
            total += b - a
    return total


workloads = st.lists(st.tuples(st.integers(0, 300), st.sampled_from(["one", "two", "four"]),
                               st.integers(50, 3000)), min_size=1, max_size=10)


# derandomized, as test_no_node_idles_while_a_job_could_use_it below: a random search
# found the malleable case after it on one run of many (see there)
@pytest.mark.parametrize("policy", ["marble", "malleable", "elastic", "adaptive"])
@settings(max_examples=60, deadline=None, derandomize=True)
@given(spec=workloads)
def test_random_multi_node_workloads(policy, spec):
    """With zero costs: no reshape keeps a job's count; and under marble no node stays
    wholly idle while a job runs below its optimum on another node."""
    arrivals = sorted((job(at, m, steps) for at, m, steps in spec), key=lambda a: a.at)
    result = simulate(policy, arrivals, nodes=3)
    check_no_same_count_move(result)
    if policy == "marble":
        assert idle_node_while_below_optimum(result, 3) == pytest.approx(0.0, abs=1e-6)


def test_malleable_moves_no_secondary_to_the_same_count_to_regrow_a_primary():
    """Found by a random search: malleable shrank job 1 to 1 GPU for job 8 at 59 s, then at
    60 s, both suspended to reshape, planned them as waiting jobs on node0 alone (the node
    with most GPUs left, first on a tie), job 8 on 1 GPU again (GPU 3), while node1 had two
    GPUs vacant: a node given no job took only a running job. It takes a waiting one too
    that gets more GPUs there: job 8 runs on node1's two."""
    spec = [(0, "two", 647), (0, "two", 109), (0, "two", 109), (0, "one", 61), (0, "two", 107),
            (0, "one", 60), (0, "one", 60), (59, "two", 302)]
    arrivals = sorted((job(at, m, steps) for at, m, steps in spec), key=lambda a: a.at)
    check_no_same_count_move(simulate("malleable", arrivals, nodes=3))


# Issue 21's two-node case, small: a rigid job holds node0 for 6,000 s while two long jobs
# arrive and share node1 on 2 GPUs each. adaptive and malleable kept a running job on its
# node, so both stayed on node1 on 2 GPUs and node0 idled from 6,000 s to the end: makespan
# 105,273 s, against 64,824 s for marble, 61,556 s for elastic and a lower bound of 58,834 s.
HOLDER = Arrival(0, JobSpec(emulate=True, model="one", steps=4200, gpus=4))
TWO_LONG = [HOLDER, job(10, "four", 200_000), job(10, "four", 200_000)]


@pytest.mark.parametrize("policy", ["adaptive", "malleable"])
@pytest.mark.parametrize("cost", [0.0, 10.0])
def test_a_job_moves_to_a_node_that_empties(cost, policy):
    result = Simulator(BOOK, get_policy(policy), 4, 2, cost, cost).run(TWO_LONG)
    assert result.makespan < 6000 + 2 * cost + 200_000 / 3.4 + 300, result.summary()
    assert {(r.node, len(r.gpus)) for r in (runs(result, 2)[-1], runs(result, 3)[-1])} == {
        ("node0", 4), ("node1", 4)}
    assert idle_node_while_below_optimum(result, 2) <= cost  # the suspension, no more


def idle_over_two_decisions(result: SimResult, nodes: int, guard: float) -> list[str]:
    """Where a node stays idle across two consecutive decisions while a job could use it.

    The decision instants are the arrivals and the starts and ends of runs (at zero costs a
    decision acts at once). For every three consecutive instants t0 < t1 < t2, a node that
    has no run over both (t0, t1) and (t1, t2) is a failure if over (t1, t2) an arrived job
    waits (every job here can run on one GPU), or a job runs on another node below its
    fastest count with more than `guard` seconds of its run left at t1 (the policy's
    guard: a run near its end is never moved). One decision may pass: a run that started
    at t1 is not moved at t1 (no reshape at the instant a run starts), and a run is not
    moved before its first step (lifecycle I6: at zero costs, one step after its start)."""
    optimum = {"one": 1, "two": 2, "four": 4}
    names = [f"node{i}" for i in range(nodes)]
    times = sorted({r.start for r in result.runs} | {r.end for r in result.runs}
                   | {j.arrival for j in result.jobs.values()})
    idle_before: set[str] = set()
    failures = []
    for t1, t2 in itertools.pairwise(times):
        mid = (t1 + t2) / 2
        live = [r for r in result.runs if r.start <= mid < r.end]
        idle = set(names) - {r.node for r in live}
        for node in idle & idle_before:
            waiting = [j.id for j in result.jobs.values() if j.arrival <= t1
                       and j.first_start > t1]
            below = [r.job for r in live if r.node != node and r.start < t1
                     and r.start + (r.end - r.start) / max(r.end_step - r.start_step, 1) <= t1
                     and len(r.gpus) < optimum[result.jobs[r.job].model]
                     and (result.jobs[r.job].steps - r.start_step) / (r.end_step - r.start_step)
                     * (r.end - r.start) - (t1 - r.start) > guard]
            if waiting or below:
                failures.append(f"{node} idle over {t1:.0f}-{t2:.0f} s: waiting {waiting}, "
                                f"below their optimum elsewhere {below}")
        idle_before = idle
    return failures


# the policies that move running jobs at once, and the time left under which each never
# moves one (elastic grows a job only after `grow_after` seconds on its count, by design)
MOVERS = {"adaptive": 0.0, "malleable": GUARD_S, "marble": 0.0}


# derandomized: the same examples on every run, so that CI does not pass or fail by chance
# (a random search found the malleable case below)
@pytest.mark.parametrize("policy", sorted(MOVERS))
@settings(max_examples=60, deadline=None, derandomize=True)
@given(spec=st.lists(st.tuples(st.integers(0, 3000), st.sampled_from(["one", "two", "four"]),
                               st.integers(50, 20_000)), min_size=1, max_size=20),
       nodes=st.integers(2, 4))
def test_no_node_idles_while_a_job_could_use_it(policy, spec, nodes):
    arrivals = sorted((job(at, m, steps) for at, m, steps in spec), key=lambda a: a.at)
    result = simulate(policy, arrivals, nodes=nodes)
    assert idle_over_two_decisions(result, nodes, guard=MOVERS[policy]) == []  # zero costs


def test_malleable_moves_a_job_below_its_optimum_to_a_node_that_empties():
    """Found by the property test above: malleable kept job 2 on 1 GPU of node1 while node0
    idled from 27.8 s to 50.3 s (job 2 had 490 s left, past its 300 s guard). Job 4 held the
    rest of node1 but was no job to move (its run near its end), so the plan saw job 2
    alone there, and a node given no job took a job only from a node two shared."""
    spec = [(0, "two", 50), (0, "two", 542), (0, "one", 50), (1, "four", 133)]
    arrivals = sorted((job(at, m, steps) for at, m, steps in spec), key=lambda a: a.at)
    result = simulate("malleable", arrivals, nodes=3)
    assert idle_over_two_decisions(result, 3, guard=MOVERS["malleable"]) == []


def test_malleable_ends_when_a_job_may_take_an_idle_node():
    """benchmarks/policy_matrix.py's nodes8-heavy cell at zero costs: once a running job
    could move to an idle node, malleable looped (job 118 reshaped twice at one instant:
    RunawayPolicy) until a run that has just started is not reshaped at that instant. (It
    still moves one job to its count on another node here once, at t = 192,996 s: the jobs
    it keeps running within one decision are planned again at the next; see
    docs/simulator.md.)"""
    book = load_profile("summit-v100")
    models = ("lenet", "alexnet", "resnet-50", "inception-v3", "resnet-101", "vgg-16")
    steps = {m: tuple(round(h * 3600 * book.lookup(m).throughput(1)) for h in (1, 24))
             for m in models}
    arrivals = poisson(16 * 8, 0.4 * 8, dict.fromkeys(models, 1.0), steps, 801)
    result = Simulator(book, get_policy("malleable"), 4, 8, 0.0, 0.0).run(arrivals)
    assert len(result.jobs) == 16 * 8
    assert result.makespan < 1.2 * result.lower_bound  # 1.15; elastic, the best here: 1.15
