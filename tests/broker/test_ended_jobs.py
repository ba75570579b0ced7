"""What a broker holds grows with the live jobs, not with every job ever: a job that has ended
leaves its state, its specs and its names, and whatever asks of it later reads the store
(`after:` by id and by name, show, explain, cancel), before and after a restart, with the
same answers as when the broker held it. A real Broker in this process (tests/broker/fakes.py)
on a real SQLite file."""

from __future__ import annotations

import pytest

from marbled.core.errors import Never, NotFound, NotNow
from marbled.core.learning import Learning
from marbled.core.model import Job, JobState, Node, Role, Start, State, TransitionError
from marbled.daemon.views import Views
from marbled.store.db import Store
from tests.broker.fakes import FakeLauncher, in_loop, pump, running_broker

TRUE = {"gpus": 1, "command": ["true"]}
LEARNED = {"model": "resnet-50", "steps": 100, "command": ["train"]}  # tracked by the learner


async def _end(h, code: int = 0) -> None:
    """Every run still going exits with `code`, and the broker decides after."""
    await pump()
    for run in h.launcher.runs:
        if not run._exit.done():
            run.exit(code)
    await pump()
    h.broker.decide()  # (an end wakes a decision; once more, for the ends seen last)
    await pump()


def _held(h) -> tuple[set, set, set]:
    b = h.broker
    return set(b.state.jobs), set(b.specs), set(dict(b.names))


@in_loop
async def test_ended_jobs_leave_the_state_specs_and_names(tmp_path):
    async with running_broker(tmp_path, store=Store(tmp_path / "marble.db"),
                              learning=Learning()) as h:
        ended = [h.submit(**TRUE, name=f"t{i}") for i in range(20)]
        ended += [h.submit(**LEARNED, name="learned")]
        for _ in range(4):  # 6 GPUs: the 21 jobs run 6 at a time
            await _end(h)
        live = h.submit(**{**TRUE, "gpus": 6}, name="big")
        waiting = h.submit(**TRUE, after=["big"])
        await pump()
        assert all(h.job(j).state is JobState.DONE for j in ended)
        assert _held(h) == ({live, waiting}, {live, waiting}, {"big"})
        assert not any(ended[-1] in jobs for jobs in h.broker.learner._jobs.values())
        # still counted, where the API shows it
        counts = h.broker.state.counts()
        assert counts[JobState.DONE] == 21 and counts[JobState.RUNNING] == 1
        assert Views(h.broker).status()["jobs"] == {"done": 21, "running": 1, "queued": 1}
        assert h.broker.state.overtaken(waiting) == 0


def _dependents(h, first: int, failed: int) -> dict[str, int]:
    return {"by id": h.submit(**TRUE, after=[first]),
            "by name": h.submit(**TRUE, after=["first"]),
            "after failed": h.submit(**TRUE, after=[failed]),
            "after failed, by name": h.submit(**TRUE, after=["failed"])}


@in_loop
async def test_after_an_ended_job_by_id_and_name_before_and_after_a_restart(tmp_path):
    store = Store(tmp_path / "marble.db")
    async with running_broker(tmp_path, store=store, gpus=1) as h:
        first = h.submit(**TRUE, name="first")
        await _end(h)
        failed = h.submit(**TRUE, name="failed")
        await _end(h, code=1)
        assert h.broker.state.outcome(first) is JobState.DONE
        assert first not in h.broker.state.jobs and failed not in h.broker.state.jobs
        blocker = h.submit(**{**TRUE, "gpus": 1})  # holds the one GPU: nothing else starts
        await pump()
        before = _dependents(h, first, failed)
        await pump()
        states = {k: h.job(j).state for k, j in before.items()}
        assert states == {"by id": JobState.QUEUED, "by name": JobState.QUEUED,
                          "after failed": JobState.CANCELLED,
                          "after failed, by name": JobState.CANCELLED}
        assert {j.id for j in h.broker.state.ready()} == {before["by id"], before["by name"]}
        with pytest.raises(NotFound, match="no job is named 'nobody'"):
            h.submit(**TRUE, after=["nobody"])
        with pytest.raises(NotFound, match="there is no job 999"):
            h.submit(**TRUE, after=[999])
        assert h.job(blocker).state is JobState.RUNNING
    async with running_broker(tmp_path, store=store, gpus=1, launcher=FakeLauncher()) as h:
        assert first not in h.broker.state.jobs and not dict(h.broker.names)
        assert h.broker.state.counts()[JobState.CANCELLED] == 2
        after = _dependents(h, first, failed)
        await pump()
        assert {k: h.job(j).state for k, j in after.items()} == states
        # the dependents of before the restart wait as they did
        ready = {j.id for j in h.broker.state.ready()}
        assert {before["by id"], before["by name"], after["by id"], after["by name"]} <= ready
        # commands on an ended job answer as they did
        with pytest.raises(Never, match=f"job {first} has already ended \\(done\\)"):
            h.broker.cancel(first)
        with pytest.raises(NotNow, match=f"job {failed} is failed; only a running job"):
            h.broker.suspend(failed)
        with pytest.raises(NotFound, match="no job 999"):
            h.broker.cancel(999)


@in_loop
async def test_show_and_explain_of_an_ended_job_answer_as_when_it_was_held(tmp_path):
    store = Store(tmp_path / "marble.db")
    async with running_broker(tmp_path, store=store, gpus=4) as h:
        views = Views(h.broker)
        h.broker.intake.forget_ended = lambda: None  # the broker holds every job, as before
        jobs = {"done": h.submit(**LEARNED, name="a"),
                "fixed": h.submit(**{**LEARNED, "gpus": 1}),
                "failed": h.submit(**TRUE)}
        while any(h.job(j).state is not JobState.FAILED if k == "failed" else
                  h.job(j).state is not JobState.DONE for k, j in jobs.items()):
            await pump()
            for run in h.launcher.runs:
                if not run._exit.done():
                    run.exit(int(run.request.env["MARBLE_JOB_ID"] == str(jobs["failed"])))
            await pump()
        jobs["cancelled"] = h.submit(**TRUE, after=[jobs["failed"]])
        await pump()
        held = {k: await views.job_detail(j) for k, j in jobs.items()}
        assert all(j in h.broker.state.jobs for j in jobs.values())
        del h.broker.intake.forget_ended
        h.broker.decide()
        assert not set(jobs.values()) & set(h.broker.state.jobs)
        gone = {k: await views.job_detail(j) for k, j in jobs.items()}
        assert gone == held
        assert held["done"]["role"] == "primary" and held["cancelled"]["role"] is None
        assert held["done"]["reasons"][0] == "it has ended: done"
        listed, _ = views.jobs()
        assert [v["role"] for v in listed] == [held[k]["role"] for k in jobs]


def test_a_forgotten_job_still_counts_and_answers_through_the_lookup():
    ended = {1: JobState.DONE, 2: JobState.FAILED}
    state = State(nodes={"node0": Node("node0", (0, 1))}, ended=ended.get)
    state.ended_before({JobState.DONE: 1, JobState.FAILED: 1}, [])
    for job in (Job(3, 1, True), Job(4, 1, True, after=(1,)), Job(5, 1, True, after=(2,)),
                Job(6, 1, True, after=(3,)), Job(7, 1, True, after=(8,))):
        state.submit(job)
    assert [j.id for j in state.ready()] == [3, 4] and state.broken() == [5, 7]
    state.apply(Start(3, "node0", (0,), Role.PRIMARY))
    state.finished(3, JobState.DONE)
    ended[3] = JobState.DONE
    state.forget(3)
    assert 3 not in state.jobs and state.outcome(3) is JobState.DONE
    assert [j.id for j in state.ready()] == [4, 6] and 3 not in state._dependents
    assert state.counts()[JobState.DONE] == 2 and state.overtaken(4) == 0
    state.apply(Start(6, "node0", (0,), Role.PRIMARY))
    assert state.overtaken(4) == 1 and state.overtaken(5) == 1
    with pytest.raises(TransitionError):
        state.forget(6)  # running


def test_a_rebuilt_state_counts_the_ended_jobs_it_does_not_hold():
    # a restart rebuilds jobs 5 and 9; 6-8 ended before, and count as jobs that went first
    state = State(nodes={"node0": Node("node0", (0,))}, ended={6: JobState.DONE}.get)
    state.submit(Job(5, 1, True))
    state.submit(Job(9, 1, True))
    state.ended_before({JobState.DONE: 7, JobState.CANCELLED: 1}, [6, 7, 8])
    assert state.overtaken(5) == 3 and state.counts()[JobState.DONE] == 7
    state.apply(Start(9, "node0", (0,), Role.PRIMARY))
    assert state.overtaken(5) == 4

