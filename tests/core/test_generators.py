"""The workload families of issue 33 (`marbled.sim.generators`): production-shaped traces
hold the statistics they are drawn from, at the load asked, on one node and on several;
job sets submitted together arrive at once; every policy runs them in the simulator."""

from __future__ import annotations

import collections
import itertools
import json
import math

import pytest

from marbled.core.policy import get_policy
from marbled.resources import load_profile
from marbled.sim.engine import Simulator
from marbled.sim.generators import PRODUCTION, production, together

BOOK = load_profile("summit-v100")


def _asked(arrivals, nodes: int, gpus_per_node: int) -> tuple[list[int], list[float]]:
    """Each job's request and duration on it (all jobs rigid: they keep their request; one
    on several nodes trains at its count on each node, as the simulator runs it)."""
    counts, seconds = [], []
    for a in arrivals:
        counts.append(a.spec.gpus * a.spec.nodes)
        seconds.append(a.spec.steps / BOOK.lookup(a.spec.model).throughput(a.spec.gpus))
    return counts, seconds


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_large_trace_holds_its_statistics(seed):
    nodes, per = 16, 6
    arrivals = production(seed, book=BOOK, nodes=nodes, gpus_per_node=per, load=0.95,
                          jobs=4000, rigid_share=1.0, whole_nodes=True)
    counts, seconds = _asked(arrivals, nodes, per)
    assert len(arrivals) == 4000 and arrivals == sorted(arrivals, key=lambda a: a.at)
    share = collections.Counter(counts)
    assert 0.64 < share[1] / len(counts) < 0.76
    assert 0.04 < sum(v for g, v in share.items() if g >= 8) / len(counts) < 0.12
    one = sorted(s for g, s in zip(counts, seconds, strict=True) if g == 1)
    p50, p99 = one[len(one) // 2], one[int(0.99 * (len(one) - 1))]
    assert 20 * 60 < p50 < 55 * 60, p50  # the studies: 30-40 min
    assert 15 * 3600 < p99 < 150 * 3600, p99  # heavy-tailed: tens of hours
    def log_mean(keep) -> float:
        logs = [math.log(s) for g, s in zip(counts, seconds, strict=True) if keep(g)]
        return sum(logs) / len(logs)

    # larger requests run longer: by x 8 ** 0.3 = 1.87 and more (0.63 in log) as drawn; a
    # sweep's jobs are one draw, so the sample's error is about 0.25: only the sign is sure
    assert log_mean(lambda g: g >= 8) > log_mean(lambda g: g == 1)
    span = arrivals[-1].at
    offered = sum(g * s for g, s in zip(counts, seconds, strict=True)) / (span * nodes * per)
    assert 0.9 < offered < 1.05, offered


def test_arrivals_follow_the_day_and_sweeps_come_in_bursts():
    arrivals = production(4, book=BOOK, nodes=16, gpus_per_node=6, load=0.6, jobs=6000)
    hours = collections.Counter(int(a.at // 3600) % 24 for a in arrivals)
    peak = sum(hours[h] for h in range(3, 9))  # sin peaks at 6 h
    trough = sum(hours[h] for h in range(15, 21))  # and is lowest at 18 h
    assert peak > 2 * trough, (peak, trough)
    # a sweep: jobs of one model and request within a minute of each other
    close = sum(1 for a, b in itertools.pairwise(arrivals)
                if b.at - a.at < PRODUCTION.sweep_within_s and a.spec.model == b.spec.model)
    assert close > 0.1 * len(arrivals)


def test_the_same_seed_gives_the_same_trace_and_another_seed_another():
    kw = {"book": BOOK, "nodes": 4, "gpus_per_node": 4, "load": 0.95}
    assert production(7, **kw) == production(7, **kw)
    assert production(7, **kw) != production(8, **kw)


def test_a_request_larger_than_a_node_runs_on_whole_nodes_or_on_one_node():
    many = production(5, book=BOOK, nodes=4, gpus_per_node=4, load=0.9, jobs=2000,
                      whole_nodes=True)
    wide = [a.spec for a in many if a.spec.nodes > 1]
    assert wide and all(s.gpus == 4 and s.nodes in (2, 4) for s in wide)
    one = production(5, book=BOOK, nodes=4, gpus_per_node=4, load=0.9, jobs=2000)
    assert all(a.spec.nodes == 1 for a in one)  # by default: every policy can run it
    alone = production(5, book=BOOK, nodes=1, gpus_per_node=4, load=0.9, jobs=500)
    assert all(a.spec.nodes == 1 and (a.spec.gpus or 1) <= 4 for a in alone)
    rigid = sum(a.spec.gpus is not None for a in alone) / len(alone)
    assert 0.2 < rigid < 0.4  # the default rigid share, 0.3


@pytest.mark.parametrize("bad", [{"load": 0}, {"load": math.nan}, {"nodes": 0},
                                 {"jobs": 0}, {"rigid_share": 1.5}, {"models": ["nope"]}])
def test_bad_arguments_say_what_to_change(bad):
    kw = {"book": BOOK, "nodes": 2, "gpus_per_node": 6, "load": 0.8, **bad}
    with pytest.raises(ValueError, match=next(iter(bad))):
        production(1, **kw)


def test_jobs_submitted_together_arrive_at_once():
    jobs = together(3, book=BOOK, jobs=4)
    assert len(jobs) == 4 and {a.at for a in jobs} == {0.0}
    assert all(a.spec.gpus is None and a.spec.steps > 0 for a in jobs)
    assert together(3, book=BOOK) == jobs and together(4, book=BOOK) != jobs


@pytest.mark.parametrize("policy", ["marble", "adaptive", "elastic", "rigid"])
def test_every_family_runs_in_the_simulator(policy):
    for arrivals, nodes in ((production(2, book=BOOK, nodes=2, gpus_per_node=6, load=0.95,
                                        jobs=60), 2),
                            (together(2, book=BOOK, jobs=4), 1)):
        result = Simulator(BOOK, get_policy(policy), 6, nodes, 10.0, 10.0).run(arrivals)
        assert result.makespan > 0 and len(result.jobs) == len(arrivals)


def test_marble_simulate_draws_the_families():
    from click.testing import CliRunner

    from marbled.cli.client_cmd import main as marble

    run = CliRunner().invoke
    out = run(marble, ["simulate", "--production", "60", "--nodes", "2", "--seed", "3",
                       "--load", "0.8", "--policy", "adaptive", "--policy", "marble", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    expected = production(3, book=BOOK, nodes=2, gpus_per_node=6, load=0.8, jobs=60)
    assert [r["jobs"] for r in doc["results"]] == [60, 60]
    result = Simulator(BOOK, get_policy("marble"), 6, 2).run(expected)
    assert doc["results"][1]["makespan_s"] == pytest.approx(result.makespan)
    out = run(marble, ["simulate", "--together", "4", "--gpus", "4", "--best-static",
                       "--policy", "adaptive", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["best_static"]["objective"] == "makespan"
    assert doc["best_static_jct"]["average_jct_s"] <= doc["best_static"]["average_jct_s"]
    both = run(marble, ["simulate", "--poisson", "20", "--together", "3"])
    assert both.exit_code == 2 and "give one of --workload FILE, --poisson N" in both.output
    bad = run(marble, ["simulate", "--together", "3", "--models", "resnet-5O"])
    assert bad.exit_code == 2 and "['resnet-5O']; the profile has" in bad.output


def test_a_refusal_of_the_simulator_survives_a_worker_process():
    """policy_matrix runs cells in a multiprocessing pool: a policy's refusal of a job must
    come back whole (it did not unpickle, and the pool hung instead of saying it)."""
    import pickle

    from marbled.sim.engine import WorkloadError

    arrivals = production(5, book=BOOK, nodes=4, gpus_per_node=4, load=0.9, jobs=200,
                          whole_nodes=True)
    with pytest.raises(WorkloadError) as refused:
        Simulator(BOOK, get_policy("elastic"), 4, 4).run(arrivals)
    back = pickle.loads(pickle.dumps(refused.value))
    assert type(back) is WorkloadError and str(back) == str(refused.value)
    assert "policy elastic runs single-node jobs only" in str(back)
