"""A restarted broker settles the runs that ended while no broker watched from the job's own
files, on a real Broker in this process (tests/broker/fakes.py): the broker is stopped as by
a crash (no drain), and the next one, on the same store, finds the run's process gone.
tests/integration/test_fault_injection.py does the same with real brokers killed -9."""

from __future__ import annotations

import ast
import contextlib
import inspect

import pytest

from marbled.core.model import JobState
from marbled.core.outcome import RECOVERED
from marbled.daemon import learner, recovery
from marbled.store.db import Store
from tests.broker.fakes import FakeLauncher, in_loop, pump, running_broker

JOB = {"command": ["train"], "model": "resnet-50", "steps": 1000}  # 3 GPUs, malleable


@contextlib.asynccontextmanager
async def restarted(tmp_path, *, suspend: bool = False, report: int | None = None,
                    ack: int | None = None, move_node: bool = False):
    """A broker starts JOB's run; the broker asks it to suspend (`suspend`), and the job
    reports step `report` and acknowledges a checkpoint at `ack`, if given; the broker dies
    (no drain); a second broker on the same store (its node renamed if `move_node`: the
    allocation moved on) finds the run's process gone. Yields (the second broker's harness,
    the job id, its launcher)."""
    store = Store(None)
    async with running_broker(tmp_path, store=store) as h:
        job = h.submit(**JOB)
        await pump()
        (run,) = h.launcher.runs
        if suspend:
            h.broker.suspend(job)
        if report is not None:
            run.report(report, start_step=0)
        if ack is not None:
            run.acknowledge(ack)
    if move_node:
        store.writer().execute("UPDATE runs SET node = 'gone'")
        store.writer().commit()
    launcher = FakeLauncher(adopt_alive=False)
    async with running_broker(tmp_path, store=store, launcher=launcher) as h:
        await pump()
        yield h, job, launcher


def reason(h, job: int) -> str:
    return h.store.jobs([job])[0].reason


@in_loop
async def test_a_run_that_finished_while_being_suspended_is_done_without_a_relaunch(tmp_path):
    # The fault-injection bug: asked to suspend, the job reached its last step first and
    # exited; the broker died before it saw the exit. It was recorded 'suspended' with no
    # end step, then launched again for a run of 0 steps (1000 -> 1000).
    async with restarted(tmp_path, suspend=True, report=1000) as (h, job, launcher):
        assert h.job(job).state is JobState.DONE
        (only,) = h.runs(job)
        assert (only.end_reason, only.start_step, only.end_step, only.exit_code) == \
            ("done", 0, 1000, None)
        assert len(launcher.runs) == 1  # the adopted run; nothing launched
        assert reason(h, job) == f"{RECOVERED}: done (its last report: step 1000)"
        (ended,) = [e for e in h.store.events(job) if e.kind == "done"]
        assert ended.data["recovered"] is True


@in_loop
async def test_an_acknowledged_suspension_no_broker_saw_resumes_from_its_checkpoint(tmp_path):
    async with restarted(tmp_path, suspend=True, ack=400) as (h, job, _):
        first, resumed = h.runs(job)
        assert (first.end_reason, first.end_step) == ("suspended", 400)
        assert resumed.start_step == 400 and h.job(job).state is JobState.RUNNING
        assert f"{RECOVERED}: suspended at its checkpoint of step 400" in [
            e.data.get("detail") for e in h.store.events(job) if e.data]


@in_loop
async def test_a_run_that_never_reported_ends_where_it_started(tmp_path):
    # The broker died between a run's row and its process's first report (or its launch).
    async with restarted(tmp_path) as (h, job, _):
        first, again = h.runs(job)
        assert (first.end_reason, first.start_step, first.end_step) == ("suspended", 0, 0)
        assert again.start_step == 0 and again.ended_at is None


@in_loop
async def test_a_crash_without_a_checkpoint_takes_its_end_step_from_where_the_next_run_resumed(
        tmp_path):
    async with restarted(tmp_path, report=400) as (h, job, launcher):  # then it died
        first = h.runs(job)[0]
        assert (first.end_reason, first.end_step) == ("suspended", None)  # not known yet
        assert reason(h, job).startswith(f"{RECOVERED}: outcome unknown: run again from "
                                         "its last checkpoint")
        resumed = launcher.runs[-1]
        resumed.report(1000, start_step=350)  # its last checkpoint was at 350
        resumed.exit(0)
        await pump()
        first, second = h.runs(job)
        assert (first.end_step, second.start_step, second.end_step) == (350, 350, 1000)


@in_loop
async def test_a_run_on_a_node_that_left_is_settled_from_its_files(tmp_path):
    async with restarted(tmp_path, report=1000, move_node=True) as (h, job, launcher):
        assert h.job(job).state is JobState.DONE and not launcher.runs
        (only,) = h.runs(job)
        assert (only.end_reason, only.end_step) == ("done", 1000)
        assert reason(h, job) == (f"{RECOVERED}: done (its last report: step 1000); node gone "
                                  "left with its allocation")


@pytest.mark.parametrize("module", [learner, recovery], ids=lambda m: m.__name__)
def test_the_learner_and_recovery_take_the_brokers_parts_not_the_broker(module):
    """The broker imports them: neither imports it back, not even for type hints."""
    imported = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.ImportFrom):
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    # the walk sees imports under TYPE_CHECKING (the learner's of a run's record)
    assert imported & {"marbled.daemon.runs", "marbled.daemon.live_run"}
    assert not {m for m in imported if m.startswith("marbled.daemon.broker")}
