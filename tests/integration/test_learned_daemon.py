"""`--policy learned` in the real daemon: a paper job set of emulated jobs, each trained to its
last step by the shipped network (started, and perhaps grown, shrunk or stopped and resumed
from its checkpoint), and `marble explain` on a job that waits for GPUs."""

from __future__ import annotations

import pytest

from tests.integration.test_explain_cli import LONG, explain
from tests.scenarios import check_no_gpu_shared, jobset, runs_by_job

pytestmark = pytest.mark.daemon


def test_learned_policy_runs_a_job_set_and_explains_a_wait(daemon_factory):
    daemon = daemon_factory("--policy", "learned", "--max-overtaken", "3", "--no-learn")
    specs = jobset(1)
    daemon.submit(*specs)
    jobs = daemon.wait_all(timeout=120)
    assert [(j["state"], j["step"]) for j in jobs] == [("done", s["steps"]) for s in specs]
    runs = daemon.runs()
    assert {r["job_id"] for r in runs} == {j["id"] for j in jobs}
    assert len(runs) >= len(specs)  # a move ends a run and starts another from its checkpoint
    check_no_gpu_shared(runs)

    first = len(specs) + 1
    daemon.submit({"model": "resnet-50", "steps": LONG, "emulate": True, "gpus": 3},
                  {"model": "resnet-50", "steps": LONG, "emulate": True, "gpus": 3})
    daemon.wait_for(lambda: sum(j["state"] == "running" for j in daemon.jobs()) == 2,
                    timeout=30, what="two long jobs running")
    daemon.submit({"model": "vgg-16", "steps": 1000, "emulate": True, "gpus": 2})
    assert explain(daemon, first + 2)[0] == (
        "it needs 2 GPUs on one node; the most free on a node is 0")


def test_learned_policy_moves_jobs_on_two_nodes_and_each_trains_to_its_last_step_once(
        daemon_factory):
    """Two emulated nodes of 4 GPUs, no move guard, resizable emulated jobs beside plain
    commands on their own counts. The shipped network alone makes no move in a run this
    short (its prior, elastic, doubles a run after 300 s), so the prior leans hard
    (`--prior-weight 20`) and doubles a run after 1 s (`--grow-after 1`): the policy's moves
    are made, and the test checks that some were. Every job ends done; a resizable one at
    its last step, each of its runs resuming from the step its previous one checkpointed
    (none trained twice, none skipped); the plain commands run once each, never moved
    (they speak no checkpoint protocol)."""
    daemon = daemon_factory("--policy", "learned", "--nodes", "2", "--move-guard", "0",
                            "--prior-weight", "20", "--grow-after", "1", "--no-learn", gpus=4)
    emulated = [{"model": m, "steps": s, "emulate": True}
                for m, s in (("resnet-50", 3000), ("vgg-16", 2000), ("alexnet", 4000),
                             ("resnet-50", 1500), ("inception-v3", 2500))]
    plain = [{"command": ["sleep", "2"], "gpus": g} for g in (1, 2)]
    daemon.submit(*emulated[:3], *plain, *emulated[3:])
    jobs = daemon.wait_all(timeout=180)
    assert [j["state"] for j in jobs] == ["done"] * 7
    by_job = runs_by_job(daemon)
    steps = [s["steps"] for s in emulated]
    emulated_ids = [jobs[i]["id"] for i in (0, 1, 2, 5, 6)]
    for job_id, want in zip(emulated_ids, steps, strict=True):
        runs = by_job[job_id]
        assert runs[-1]["end_step"] == want
        assert runs[0]["start_step"] in (None, 0)
        for before, after in zip(runs, runs[1:], strict=False):
            assert after["start_step"] == before["end_step"], runs
    moved = [j for j in emulated_ids if len(by_job[j]) > 1]
    assert moved, "no job was moved: the test checked no resume"
    grown = [r for j in moved for a, r in zip(by_job[j], by_job[j][1:], strict=False)
             if r["gpu_count"] > a["gpu_count"]]
    assert grown, {j: by_job[j] for j in moved}
    for job_id in (jobs[3]["id"], jobs[4]["id"]):
        assert len(by_job[job_id]) == 1
    check_no_gpu_shared(daemon.runs())
