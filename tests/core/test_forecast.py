"""The queue's forecast never fails on a job it cannot model: it leaves it out, says why, and
names jobs by their broker ids (the issue saw "job 3" for job 12, with a model list of the
queue's models only)."""

from __future__ import annotations

import pytest

from marbled.core.policy import POLICIES
from marbled.core.profiles import ProfileBook
from marbled.core.spec import JobSpec
from marbled.resources import load_profile
from marbled.sim.forecast import Left, forecast


@pytest.fixture(scope="module")
def book():
    return load_profile("summit-v100")


def left(job_id: int, after: tuple[int, ...] = (), running: bool = False, **fields) -> Left:
    spec = JobSpec.from_mapping({"command": ["python", "train.py"], **fields})
    return Left(job_id, spec, spec.steps or 0, running, after)


def test_jobs_it_cannot_model_are_left_out_with_why(book):
    jobs = [left(10, model="resnet-50", steps=600, running=True),
            left(11, model="vgg-16", steps=400),
            left(12, model="resnt-50", steps=300),  # a typo: explored, no curve yet
            left(13, (12,), model="lenet", steps=100),  # waits for the one left out
            left(14, gpus=2)]  # a command with a fixed count: no model, no steps
    result = forecast(jobs, book, POLICIES["marble"](), [6], now=1000.0)
    assert result.reason is None
    assert set(result.ends) == {10, 11}
    assert result.finish_at == max(end for _, end in result.ends.values()) > 1000.0
    assert result.left_out == {
        12: "model 'resnt-50' has no curve yet",
        13: "it waits for job 12, which is left out",
        14: "it has no model and step count to simulate"}


def test_with_every_job_left_out_it_says_it_cannot_say(book):
    result = forecast([left(5, model="mystery", steps=10, running=True)], book,
                      POLICIES["marble"](), [6], now=0.0)
    assert result.finish_at is None and result.ends == {}
    assert result.reason == "it can simulate none of the jobs left"
    assert set(result.left_out) == {5}


def test_a_simulator_refusal_names_the_brokers_job_not_its_place_in_the_simulation():
    # a curve that rules out 1 GPU, and a job fixed on 1 GPU: the simulator refuses it
    odd = ProfileBook.from_mapping({"system": "odd", "gpus_per_node": 4, "models": {
        "net": {"steps_per_second": [1.0, 2.0]}, "big": {"steps_per_second": [None, 2.0]}}})
    jobs = [left(31, model="net", steps=10), left(32, model="net", steps=10),
            left(33, model="big", steps=10, gpus=1)]
    result = forecast(jobs, odd, POLICIES["marble"](), [4], now=0.0)
    assert result.finish_at is None
    assert "job 33:" in result.reason and "job 3:" not in result.reason


def test_jobs_the_nodes_cannot_hold_are_left_out_not_a_failure(book):
    """A job a larger allocation queued (`State.unfit`): before, the whole forecast failed
    ("cannot simulate the queue: job 1: gpus: asks for 6 GPUs but the largest node has 2")."""
    jobs = [left(1, model="resnet-50", steps=600, gpus=6), left(2, model="vgg-16", steps=400)]
    why = "it asks for 6 GPUs on one node, and this allocation has 1 node of 2 GPUs"
    result = forecast(jobs, book, POLICIES["marble"](), [2], now=0.0, unfit={1: why})
    assert result.reason is None and set(result.ends) == {2}
    assert result.left_out == {1: f"it cannot run in this allocation: {why}"}
