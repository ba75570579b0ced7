"""No livelock: with zero launch and suspend costs, on up to 8 nodes, every policy lets time
advance, and the simulator stops a loop that would not with an error naming the policy and the
job (issue 21)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marbled.core.model import JobState, Suspend
from marbled.core.policy import POLICIES, get_policy
from marbled.resources import load_profile
from marbled.sim.engine import Simulator
from marbled.sim.workloads import poisson
from tests.scenarios import with_multi_node_jobs

BOOK = load_profile("summit-v100")
MIX = dict.fromkeys(("resnet-50", "inception-v3", "resnet-101", "vgg-16"), 1.0)
# Found by a search over random Poisson workloads: adaptive resized job 23 3 -> 2 -> 3 ... at
# t = 278.6 s forever (a shrink for a newcomer that then did not take the GPU, and a growth
# into it), since a job started at an instant counted as settled when its reshape cost nothing.
EIGHT_NODES = {"n": 50, "rate": 300.0, "steps": (100, 500), "seed": 158252, "nodes": 8,
               "gpus": 6}


def simulate(policy: str, n: int, rate: float, steps: tuple[int, int], seed: int, nodes: int,
             gpus: int, rigid: float = 0.0):
    arrivals = poisson(n, rate, MIX, steps, seed, rigid, max_gpus=gpus)
    if nodes > 1 and POLICIES[policy].multi_node:  # with jobs on two nodes too
        arrivals = with_multi_node_jobs(arrivals, every=3)
    sim = Simulator(BOOK, get_policy(policy), gpus, nodes, launch_s=0.0, suspend_s=0.0)
    return sim.run(arrivals), arrivals


def reshaped_twice_at_one_instant(result) -> list[tuple[int, float]]:
    """(job, time) of every run that began and was suspended at the same instant."""
    return [(r.job, r.start) for r in result.runs
            if r.reason == "suspended" and r.end == r.start]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_the_eight_node_case_ends(policy):
    result, arrivals = simulate(policy, **EIGHT_NODES)
    assert len(result.jobs) == len(arrivals)
    assert reshaped_twice_at_one_instant(result) == []


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 20), rate=st.sampled_from([20.0, 300.0, 3000.0]),
       low=st.sampled_from([10, 100, 2000]), seed=st.integers(0, 10**6),
       nodes=st.integers(1, 8), gpus=st.sampled_from([4, 6]),
       rigid=st.sampled_from([0.0, 0.3]))
def test_every_policy_ends_on_random_multi_node_workloads(n, rate, low, seed, nodes, gpus,
                                                           rigid):
    for policy in sorted(POLICIES):
        result, arrivals = simulate(policy, n, rate, (low, 5 * low), seed, nodes, gpus, rigid)
        assert len(result.jobs) == len(arrivals), policy
        assert result.makespan >= max(a.at for a in arrivals), policy


class Undoes:
    """A policy that reshapes a running job at every decision: a livelock by construction."""

    name = "undoes"

    def __init__(self):
        self.inner = get_policy("adaptive")

    def decide(self, state, now):
        first = state.jobs.get(1)
        if first is not None and first.state is JobState.RUNNING:
            return [Suspend(1, None, "undo")]
        return self.inner.decide(state, now)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_policy_that_undoes_every_run_still_makes_progress():
    """No run is reshaped before its first step (lifecycle I6), so even a policy that
    suspends a job at every decision cannot loop without progress: each of its runs
    trains a step first (before the rule, this was a livelock the simulator stopped
    with an error naming the policy and the job; the guard stays behind the rule)."""
    arrivals = poisson(3, 60.0, MIX, (100, 200), 1)
    sim = Simulator(BOOK, Undoes(), 4, 2, launch_s=0.0, suspend_s=0.0)
    result = sim.run(arrivals)
    undone = [r for r in result.runs if r.job == 1 and r.reason == "suspended"]
    assert undone and all(r.end_step > r.start_step for r in undone)
    assert len(result.jobs) == len(arrivals)
