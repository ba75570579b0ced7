"""The paper's walk-throughs: Figure 5 (job set 3) and job set 2 (VII-B1), plus the LSF baseline."""

from __future__ import annotations

import pytest

from marbled.core.model import Job, JobState, Placement, Role, Start, State, Suspend
from marbled.core.policy import get_policy
from marbled.core.spec import JobSpec
from marbled.resources import load_job_file, load_profile, workload_path
from marbled.sim.engine import SimResult, SimRun, Simulator


@pytest.fixture(scope="module")
def book():
    return load_profile("summit-v100")


def simulate(book, policy: str, specs: list[JobSpec]) -> SimResult:
    return Simulator(book, get_policy(policy), 6).run(specs)


def jobset(n: int) -> list[JobSpec]:
    return load_job_file(workload_path(f"paper-jobset{n}"))


def runs_of(result: SimResult, job: int) -> list[SimRun]:
    return sorted((r for r in result.runs if r.job == job), key=lambda r: r.start)


# ---------------------------------------------------------------- Figure 5 (job set 3)


@pytest.fixture(scope="module")
def figure5(book) -> SimResult:
    specs = jobset(3)
    assert [(s.model, s.steps) for s in specs] == [
        ("resnet-50", 900),
        ("inception-v3", 2000),
        ("vgg-16", 800),
    ]
    return simulate(book, "marble", specs)


def test_figure5_job1_is_primary_on_3_gpus(figure5):
    (run,) = runs_of(figure5, 1)
    assert run.role is Role.PRIMARY
    assert len(run.gpus) == 3
    assert run.start == 0.0
    assert run.reason == "done" and run.end_step == 900


def test_figure5_job2_is_secondary_on_3_until_job1_ends(figure5):
    job1 = runs_of(figure5, 1)[0]
    first = runs_of(figure5, 2)[0]
    assert first.role is Role.SECONDARY
    assert len(first.gpus) == 3
    assert first.start == 0.0
    assert not set(first.gpus) & set(job1.gpus)
    assert first.reason == "suspended"
    assert first.end == job1.end


def test_figure5_job2_resumes_as_primary_on_4_including_its_old_3(figure5):
    first, second = runs_of(figure5, 2)[:2]
    assert second.role is Role.PRIMARY
    assert len(second.gpus) == 4
    assert set(first.gpus) <= set(second.gpus)
    assert second.start == first.end
    assert second.start_step == first.end_step > 0
    assert runs_of(figure5, 2)[-1].end_step == 2000


def test_figure5_job3_starts_as_secondary_on_the_2_left(figure5):
    job1 = runs_of(figure5, 1)[0]
    resumed = runs_of(figure5, 2)[1]
    first = runs_of(figure5, 3)[0]
    assert first.role is Role.SECONDARY
    assert len(first.gpus) == 2
    assert first.start == job1.end
    assert not set(first.gpus) & set(resumed.gpus)
    assert runs_of(figure5, 3)[-1].end_step == 800


def test_figure5_marble_beats_lsf(book, figure5):
    lsf = simulate(book, "rigid", jobset(3))
    assert figure5.makespan < lsf.makespan
    assert lsf.makespan == pytest.approx(707, rel=0.01)


# ---------------------------------------------------------------- job set 2


@pytest.fixture(scope="module")
def set2(book) -> SimResult:
    specs = jobset(2)
    assert [s.model for s in specs] == ["inception-v3", "resnet-50", "resnet-101"]
    return simulate(book, "marble", specs)


def test_set2_job1_is_primary_on_4(set2):
    (run,) = runs_of(set2, 1)
    assert run.role is Role.PRIMARY and len(run.gpus) == 4 and run.start == 0.0
    assert run.reason == "done"


def test_set2_job2_is_secondary_on_the_2_left(set2):
    job1 = runs_of(set2, 1)[0]
    (run,) = runs_of(set2, 2)
    assert run.role is Role.SECONDARY and len(run.gpus) == 2 and run.start == 0.0
    assert not set(run.gpus) & set(job1.gpus)
    assert run.reason == "done" and run.end < job1.end


def test_set2_job3_follows_job2_as_secondary_then_is_promoted_to_3(set2):
    job1 = runs_of(set2, 1)[0]
    job2 = runs_of(set2, 2)[0]
    runs = runs_of(set2, 3)
    assert len(runs) == 2
    first, second = runs
    assert first.role is Role.SECONDARY and len(first.gpus) == 2
    assert first.start == job2.end
    assert first.reason == "suspended" and first.end == job1.end
    assert second.role is Role.PRIMARY and len(second.gpus) == 3
    assert set(first.gpus) <= set(second.gpus)
    assert second.start == first.end
    assert second.start_step == first.end_step
    assert 0 < first.end_step < 1000  # still running on 2 GPUs when job 1 ends
    assert second.reason == "done" and second.end_step == 1000


# ---------------------------------------------------------------- Figure 5, action by action


def test_figure5_decision_sequence():
    policy = get_policy("marble")
    state = State.single_node(6)
    for job in (Job(1, 3, True), Job(2, 4, True), Job(3, 5, True)):
        state.submit(job)

    actions = policy.decide(state)
    assert actions == [
        Start(1, "node0", (0, 1, 2), Role.PRIMARY),
        Start(2, "node0", (3, 4, 5), Role.SECONDARY),
    ]
    for a in actions:
        state.apply(a)
    assert policy.decide(state) == []  # nothing changes until an event

    state.finished(1, JobState.DONE)
    actions = policy.decide(state)
    assert actions == [
        Suspend(2, Placement("node0", (0, 3, 4, 5)), "promote"),
        Start(3, "node0", (1, 2), Role.SECONDARY),
    ]
    assert actions[0].resume_on == Placement("node0", (0, 3, 4, 5))
    for a in actions:
        state.apply(a)
    assert state.jobs[2].state is JobState.SUSPENDING
    assert policy.decide(state) == []  # job 2 keeps its GPUs while it checkpoints

    state.suspended(2)
    assert state.free("node0") == []  # its 4 GPUs stay reserved
    assert policy.decide(state) == [Start(2, "node0", (0, 3, 4, 5), Role.PRIMARY)]


# ---------------------------------------------------------------- rigid (LSF)


def test_rigid_job_set1_runs_each_job_alone_on_the_whole_node_in_fifo_order(book):
    result = simulate(book, "rigid", jobset(1))
    runs = sorted(result.runs, key=lambda r: r.start)
    assert [r.job for r in runs] == [1, 2, 3]
    for r in runs:
        assert r.gpus == (0, 1, 2, 3, 4, 5)
        assert r.role is Role.PRIMARY
        assert r.reason == "done"
    for before, after in zip(runs, runs[1:], strict=False):
        assert before.end <= after.start
    assert result.makespan == pytest.approx(958, rel=0.01)


def test_rigid_packs_explicit_two_gpu_jobs_side_by_side(book):
    specs = [
        JobSpec.from_mapping({"emulate": True, "model": "resnet-50", "steps": 100, "gpus": 2})
        for _ in range(4)
    ]
    result = simulate(book, "rigid", specs)
    at_zero = [r for r in result.runs if r.start == 0.0]
    assert sorted(r.job for r in at_zero) == [1, 2, 3]
    gpus = [g for r in at_zero for g in r.gpus]
    assert sorted(gpus) == [0, 1, 2, 3, 4, 5]
    assert all(len(r.gpus) == 2 for r in result.runs)
    (fourth,) = runs_of(result, 4)
    assert fourth.start > 0.0
    assert fourth.start == min(r.end for r in at_zero)
