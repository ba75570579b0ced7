"""The simulator: metrics, the lower bound, arrivals, and `marble simulate`."""

from __future__ import annotations

import itertools
import json
import types

import pytest
from click.testing import CliRunner

from marbled.cli.client_cmd import main as marble
from marbled.core.model import JobState, Role, Start, Suspend
from marbled.core.policy import POLICIES, get_policy
from marbled.core.policy.base import Policy
from marbled.core.spec import JobSpec
from marbled.resources import load_profile, workload_path
from marbled.sim.engine import Simulator
from marbled.sim.report import gpu_rows, per_node
from marbled.sim.workloads import Arrival, from_job_file, poisson
from tests.scenarios import with_multi_node_jobs

BOOK = load_profile("summit-v100")
JOBSET3 = from_job_file(workload_path("paper-jobset3"))
MIX = {"resnet-50": 1.0, "inception-v3": 1.0, "vgg-16": 1.0}


def simulate(policy, arrivals, nodes=1, **kw):
    return Simulator(BOOK, get_policy(policy), 6, nodes, **kw).run(arrivals)


def test_no_policy_beats_the_lower_bound_and_rigid_job_set_3_equals_it_exactly():
    for policy in ("marble", "rigid"):
        r = simulate(policy, JOBSET3)
        assert r.makespan >= r.lower_bound - 1e-9
    rigid = simulate("rigid", JOBSET3)
    # Three jobs one after another on all 6 GPUs: 900/6.358 + 2000/5.263 + 800/4.314 s.
    assert abs(rigid.makespan - (900 / 6.358 + 2000 / 5.263 + 800 / 4.314)) < 1e-6
    assert abs(rigid.utilization - 1.0) < 1e-12 and rigid.suspensions == 0


def test_job_stats_and_overheads_add_up():
    r = simulate("marble", JOBSET3, launch_s=5.0, suspend_s=2.0)
    assert r.suspensions == 2  # Inception-v3 and VGG-16 promoted once each
    assert sum(len(run.gpus) for run in r.runs if run.reason == "suspended") == 5
    # Every launch holds its GPUs 5 s, every suspension 2 s.
    expected = 5.0 * sum(len(run.gpus) for run in r.runs) + 2.0 * (3 + 2)
    assert abs(r.overhead_gpu_seconds - expected) < 1e-6
    assert 0 < r.overhead_share < 0.1
    for stats in r.jobs.values():
        assert stats.completion >= stats.first_start >= stats.arrival
    assert abs(r.average_jct - r.total_jct / 3) < 1e-9


def test_arrivals_delay_starts_and_the_bound():
    late = [Arrival(1000.0, a.spec) for a in JOBSET3]
    r = simulate("marble", late)
    assert min(s.first_start for s in r.jobs.values()) == 1000.0
    assert abs(r.makespan - 1000.0 - simulate("marble", JOBSET3).makespan) < 1e-6
    assert r.lower_bound >= 1000.0


def test_busy_timeline_never_exceeds_the_gpus():
    arrivals = poisson(300, 200.0, MIX, (200, 2000), seed=3)
    r = simulate("marble", arrivals, nodes=3)
    assert max(busy for _, busy in r.busy_timeline()) <= 18
    assert r.busy_timeline()[-1][1] == 0
    assert len(r.jobs) == 300 and all(s.completion > 0 for s in r.jobs.values())


def test_same_input_same_schedule():
    arrivals = poisson(200, 100.0, MIX, (200, 2000), seed=7)
    a = simulate("marble", arrivals, nodes=2)
    b = simulate("marble", arrivals, nodes=2)
    assert a.runs == b.runs


def test_marble_beats_rigid_on_a_synthetic_workload():
    arrivals = poisson(400, 60.0, MIX, (500, 3000), seed=1)
    marble_r, rigid_r = simulate("marble", arrivals, 2), simulate("rigid", arrivals, 2)
    assert marble_r.average_jct < rigid_r.average_jct


def test_simulate_command_prints_json_and_draws_a_gantt(tmp_path):
    png = tmp_path / "gantt.png"
    out = CliRunner().invoke(marble, ["simulate", "--workload", "paper-jobset3", "--json",
                                      "--gantt", str(png)])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    by_policy = {r["policy"]: r for r in doc["results"]}
    assert by_policy["marble"]["makespan_s"] < by_policy["rigid"]["makespan_s"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gantt_rows_are_in_gpu_order_node_by_node():
    # Rows used to follow first use: GPUs 2, 3 (run listed first) above GPUs 0, 1.
    run = types.SimpleNamespace
    runs = [run(node="node0", gpus=(2, 3), start=0.0), run(node="node0", gpus=(0, 1), start=0.0),
            run(node="node1", gpus=(0,), start=5.0), run(node="node0", gpus=(4,), start=1.0)]
    assert gpu_rows(runs) == [("node0", 0), ("node0", 1), ("node0", 2), ("node0", 3),
                              ("node0", 4), ("node1", 0)]
    assert gpu_rows([]) == []


def test_simulate_command_table_and_errors(tmp_path):
    out = CliRunner().invoke(marble, ["simulate", "--poisson", "50", "--nodes", "2"])
    assert out.exit_code == 0 and "makespan/LB" in out.output and "lower bound" in out.output
    out = CliRunner().invoke(marble, ["simulate"])
    assert out.exit_code == 2 and ("give one of --workload FILE, --poisson N, --production N "
                                   "or --together N") in out.output
    bad = tmp_path / "t.csv"
    bad.write_text("arrival,model,steps\n0,resnet-50,0\n")
    out = CliRunner().invoke(marble, ["simulate", "--workload", str(bad)])
    assert out.exit_code == 1 and "t.csv:2" in out.output


def test_unprofiled_job_is_refused_by_the_simulator():
    import pytest

    from marbled.core.spec import SpecError

    with pytest.raises(SpecError, match="profiled model"):
        simulate("marble", [JobSpec(command=("true",), gpus=1)])


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_every_policy_trains_every_step_once_and_never_shares_a_gpu(policy):
    arrivals = poisson(150, 300.0, MIX, (500, 5000), seed=5)
    if POLICIES[policy].multi_node:  # and jobs on two nodes, a fixed count or a range 1-2
        arrivals = with_multi_node_jobs(arrivals)
    r = simulate(policy, arrivals, nodes=2, launch_s=3.0, suspend_s=1.0)
    for job_id, stats in r.jobs.items():
        runs = sorted((run for run in r.runs if run.job == job_id), key=lambda run: run.start)
        assert runs[0].start_step == 0 and runs[-1].end_step == stats.steps
        assert runs[-1].reason == "done" and all(x.reason == "suspended" for x in runs[:-1])
        for a, b in itertools.pairwise(runs):
            assert a.end <= b.start and a.end_step == b.start_step
    several = [run for run in r.runs if len(run.parts()) > 1]
    assert bool(several) == POLICIES[policy].multi_node
    assert all(len({len(gpus) for _, gpus in run.parts()}) == 1 for run in several)
    held = sorted((run.start, run.end, node, g) for run in r.runs
                  for node, gpus in run.parts() for g in gpus)
    last_end: dict[tuple[str, int], float] = {}
    for start, end, node, g in held:
        assert last_end.get((node, g), 0.0) <= start + 1e-9, f"{node} GPU {g} held twice"
        last_end[(node, g)] = end
    assert r.makespan >= r.lower_bound - 1e-9
    if policy in ("marble", "malleable", "timeslice", "elastic"):
        assert r.suspensions > 0  # the workload exercises their suspensions


def test_each_models_own_costs_change_the_schedule():
    """Start-up and suspend costs come from each model's profile entry (the global
    overheads override them); a policy that weighs them reshapes only the cheap model."""
    from marbled.core.profiles import ProfileBook

    def book(startup: float) -> ProfileBook:
        curve = {"steps_per_second": [1.0, 1.9, 2.7, 3.4, 4.0, 4.4]}
        return ProfileBook.from_mapping({"system": "costs", "gpus_per_node": 6, "models": {
            "cheap": curve, "dear": {**curve, "startup_s": startup, "suspend_s": 20.0}}})

    jobs = [JobSpec(emulate=True, model=m, steps=2000) for m in ("cheap", "dear")]
    free = Simulator(book(0.0), get_policy("rigid"), 6).run(jobs)
    costly = Simulator(book(300.0), get_policy("rigid"), 6).run(jobs)
    # each job runs once, alone on the node: only the dear model's own start-up is added
    assert costly.jobs[1].completion == pytest.approx(free.jobs[1].completion)
    assert costly.jobs[2].completion == pytest.approx(free.jobs[2].completion + 300.0)
    overridden = Simulator(book(300.0), get_policy("rigid"), 6, launch_s=0.0,
                           suspend_s=0.0).run(jobs)
    assert overridden.makespan == pytest.approx(free.makespan)
    # adaptive: both share the node; when the short 'cheap' job ends, 'dear' grows into its
    # GPUs only if that pays for its suspend and start-up
    jobs = [JobSpec(emulate=True, model="cheap", steps=500),
            JobSpec(emulate=True, model="dear", steps=2000)]
    result = Simulator(book(3000.0), get_policy("adaptive"), 6).run(jobs)
    dear_runs = [r for r in result.runs if r.job == 2]
    assert len(dear_runs) == 1, dear_runs  # never moved: a move would cost more than it saves
    cheap_result = Simulator(book(0.0), get_policy("adaptive"), 6).run(jobs)
    assert len([r for r in cheap_result.runs if r.job == 2]) > 1  # grows when that is free


# Two nodes of 2 GPUs, one model at 1 step/s on 1 GPU and 2 on 2: a job on several nodes
# trains at its curve's speed at its count on each node (the broker's forecast, an emulated
# job's pace), and holds its GPUs on every node.
TWO_BY_TWO = "system: two-by-two\ngpus_per_node: 2\nmodels:\n  m: {steps_per_second: [1.0, 2.0]}\n"
MULTI_NODE_JOBS = """jobs:
  - {model: m, steps: 100, gpus: 1, nodes: 2, emulate: true}
  - {model: m, steps: 200, gpus: 1, nodes: "1-2", emulate: true}
  - {model: m, steps: 200, gpus: 2, emulate: true}
"""


@pytest.mark.parametrize("policy", sorted(p for p in POLICIES if POLICIES[p].multi_node))
def test_simulate_runs_a_fixed_two_node_job_and_a_range_job(tmp_path, policy):
    """Job 1 takes 1 GPU of each node (100 steps at 1/s: 0-100 s); the range job finds no
    node with 2 free, so it spreads, 1 + 1 (200 at 1/s: 0-200 s); job 3 needs both GPUs of
    one node: 200-300 s at 2/s."""
    (tmp_path / "p.yaml").write_text(TWO_BY_TWO)
    (tmp_path / "jobs.yaml").write_text(MULTI_NODE_JOBS)
    args = ["simulate", "--profile", str(tmp_path / "p.yaml"), "--workload",
            str(tmp_path / "jobs.yaml"), "--nodes", "2"]
    out = CliRunner().invoke(marble, [*args, "--policy", policy, "--json", "--gantt",
                                      str(tmp_path / "g.png")])
    assert out.exit_code == 0, out.output
    (result,) = json.loads(out.output)["results"]
    assert result["makespan_s"] == pytest.approx(300.0)
    assert result["average_jct_s"] == pytest.approx((100 + 200 + 300) / 3)
    assert result["average_wait_s"] == pytest.approx(200 / 3)
    assert result["utilization"] == pytest.approx((2 * 100 + 2 * 200 + 2 * 100) / (4 * 300))
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
    book = load_profile(tmp_path / "p.yaml")
    r = Simulator(book, get_policy(policy), 2, 2).run(from_job_file(tmp_path / "jobs.yaml"))
    runs = {run.job: run for run in r.runs}
    assert [(runs[j].start, runs[j].end) for j in (1, 2, 3)] == [(0, 100), (0, 200),
                                                                 (200, 300)]
    assert [len(runs[j].parts()) for j in (1, 2, 3)] == [2, 2, 1]
    # every node of a run is a row of the Gantt chart, not its first node alone
    assert gpu_rows(per_node(r.runs)) == [(n, g) for n in ("node0", "node1") for g in (0, 1)]
    # by default, the policies that place multi-node jobs, and the others named as left out
    out = CliRunner().invoke(marble, args)
    assert out.exit_code == 0, out.output
    assert "left out: elastic, learned, malleable, moldable, timeslice (single-node jobs " \
           "only" in out.output


def test_a_single_node_policy_refuses_a_multi_node_job_naming_it_and_the_policies_that_can(
        tmp_path):
    (tmp_path / "p.yaml").write_text(TWO_BY_TWO)
    (tmp_path / "jobs.yaml").write_text(MULTI_NODE_JOBS)
    out = CliRunner().invoke(marble, ["simulate", "--profile", str(tmp_path / "p.yaml"),
                                      "--workload", str(tmp_path / "jobs.yaml"), "--nodes", "2",
                                      "--policy", "moldable"])
    assert out.exit_code == 1
    assert "jobs.yaml:2: nodes: policy moldable runs single-node jobs only; use --policy " \
           "adaptive, marble, rigid or whatif" in out.output
    out = CliRunner().invoke(marble, ["simulate", "--profile", str(tmp_path / "p.yaml"),
                                      "--workload", str(tmp_path / "jobs.yaml")])
    assert out.exit_code == 1  # on one node (--nodes left out), the daemon's refusal
    assert "jobs.yaml:2: nodes: asks for 2 nodes but there are 1" in out.output


class SpreadThenOne(Policy):
    """Runs job 1 on 1 GPU of each node, suspends it at t = 50 and resumes it on 2 GPUs of
    node1: a range job's next run on another node set (as after `marble suspend`)."""

    name, summary, multi_node = "spread-then-one", "a test's script", True

    def choose(self, state, now):
        job = state.jobs[1]
        if job.state is JobState.QUEUED:
            return [Start(1, "node0", (0,), Role.PRIMARY, (("node1", (1,)),))]
        if job.state is JobState.RUNNING and job.suspensions == 0 and now >= 50:
            return [Suspend(1, None, "move")]
        if job.state is JobState.SUSPENDED:
            return [Start(1, "node1", (0, 1), Role.PRIMARY)]
        return []

    def next_decision(self, state, now):
        return 50.0 if now < 50 else None


def test_a_range_job_resumes_on_another_node_set_from_its_checkpoint(tmp_path):
    (tmp_path / "p.yaml").write_text(TWO_BY_TWO)
    spec = JobSpec(emulate=True, model="m", steps=200, gpus=1, nodes=2, nodes_min=1)
    r = Simulator(load_profile(tmp_path / "p.yaml"), SpreadThenOne(), 2, 2,
                  suspend_s=10.0).run([spec])
    first, second = r.runs
    # 50 steps at 1/s, then the checkpoint holds both nodes' GPUs 10 s more
    assert (first.start, first.end, first.end_step, first.reason) == (0, 60, 50, "suspended")
    assert first.parts() == (("node0", (0,)), ("node1", (1,)))
    # the 150 steps left at 2/s on both GPUs of node1
    assert (second.start, second.end, second.start_step) == (60, 135, 50)
    assert second.parts() == (("node1", (0, 1)),)
    assert r.overhead_gpu_seconds == pytest.approx(10.0 * 2)
    assert r.busy_gpu_seconds == pytest.approx(2 * 60 + 2 * 75)


class _Ends(Policy):
    """marble's decisions, and the end each running job was expected at, at each decision."""

    name = "ends-spy"

    def __init__(self):
        super().__init__()
        self.inner, self.seen = get_policy("marble"), []

    def choose(self, state, now):
        self.seen += [(now, j.id, j.expected_end) for j in state.engaged()
                      if j.placement is not None]
        return self.inner.choose(state, now)

    def next_decision(self, state, now):
        return now + 5.0  # look often


def test_a_run_slower_than_its_profile_is_expected_at_its_real_end_once_measured():
    """The policy reads the profile's end until the run has trained MEASURED_AFTER_S, then
    the run's own (as the broker corrects it from the speed it measures): a job twice as
    slow as its profile, and nothing changes where the profile is right."""
    from dataclasses import replace

    from marbled.sim.engine import MEASURED_AFTER_S

    slow = replace(BOOK, curves={k: replace(c, steps_per_second=tuple(
        v and v / 2 for v in c.steps_per_second)) for k, c in BOOK.curves.items()})
    job = [JobSpec(model="resnet-50", steps=20000)]
    for truth, factor in ((slow, 2.0), (None, 1.0)):
        spy = _Ends()
        r = Simulator(BOOK, spy, 6, 1, 0.0, 0.0, truth=truth).run(job)
        end = r.jobs[1].completion
        ends = {round(e, 6) for _, _, e in spy.seen}
        early = [e for t, _, e in spy.seen if t < MEASURED_AFTER_S]
        late = [e for t, _, e in spy.seen if t > MEASURED_AFTER_S]
        assert early and late
        assert all(e == pytest.approx(end / factor) for e in early)
        assert all(e == pytest.approx(end) for e in late)
        assert len(ends) == (2 if truth else 1)
