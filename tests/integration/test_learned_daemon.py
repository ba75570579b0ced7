"""`--policy learned` in the real daemon: a paper job set of emulated jobs, each started once
by the shipped network, and `marble explain` on a job that waits for GPUs."""

from __future__ import annotations

import pytest

from tests.integration.test_explain_cli import LONG, explain
from tests.scenarios import check_no_gpu_shared, jobset

pytestmark = pytest.mark.daemon


def test_learned_policy_runs_a_job_set_and_explains_a_wait(daemon_factory):
    daemon = daemon_factory("--policy", "learned", "--max-overtaken", "3", "--no-learn")
    specs = jobset(1)
    daemon.submit(*specs)
    jobs = daemon.wait_all(timeout=120)
    assert [(j["state"], j["step"]) for j in jobs] == [("done", s["steps"]) for s in specs]
    runs = daemon.runs()
    assert len(runs) == len(specs)  # one run each: never suspended nor resized
    check_no_gpu_shared(runs)

    first = len(specs) + 1
    daemon.submit({"model": "resnet-50", "steps": LONG, "emulate": True, "gpus": 3},
                  {"model": "resnet-50", "steps": LONG, "emulate": True, "gpus": 3})
    daemon.wait_for(lambda: sum(j["state"] == "running" for j in daemon.jobs()) == 2,
                    timeout=30, what="two long jobs running")
    daemon.submit({"model": "vgg-16", "steps": 1000, "emulate": True, "gpus": 2})
    assert explain(daemon, first + 2)[0] == (
        "it needs 2 GPUs on one node; the most free on a node is 0")
