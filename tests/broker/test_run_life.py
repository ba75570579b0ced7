"""The life of a run, tested on a real Broker in this process with a FAKE launcher and a FAKE
clock (tests/broker/fakes.py): escalation, acknowledgement against exit, cancel during launch,
drains and restarts, each in milliseconds. The same paths run with real processes in
tests/integration."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from marbled.batch.supervise import write_exit
from marbled.core.model import JobState
from marbled.store.db import Store
from marbled.worker.protocol import PROGRESS_FILE
from tests.broker.fakes import FakeLauncher, in_loop, pump, running_broker

JOB = {"command": ["train"], "model": "resnet-50", "steps": 1000}  # 3 GPUs, malleable


@in_loop
async def test_no_acknowledgement_escalates_to_sigterm_then_sigkill(tmp_path):
    async with running_broker(tmp_path) as h:
        job = h.submit(**JOB)
        await pump()
        (run,) = h.launcher.runs
        run.report(40)
        h.broker.suspend(job)
        assert run.signals == ["SIGTSTP"]
        assert (run.run_dir / "suspend.json").exists()
        await h.clock.advance(59.9)
        assert run.signals == ["SIGTSTP"]
        await h.clock.advance(0.1)
        assert run.signals == ["SIGTSTP", "SIGCONT", "SIGTERM"]
        await h.clock.advance(10)
        assert run.signals[-1] == "SIGKILL"
        run.exit(-9)
        await pump()
        first = h.runs(job)[0]
        assert (first.end_reason, first.end_step) == ("suspended", None)  # step unknown
        assert "suspend-timeout" in h.events(job)
        assert h.job(job).suspensions == 1
        # GPUs are free: MARBLE resumes it at once, from its last checkpoint
        assert len(h.launcher.runs) == 2 and h.job(job).state is JobState.RUNNING


@in_loop
async def test_acknowledgement_found_by_the_monitor_then_exit(tmp_path):
    async with running_broker(tmp_path) as h:
        job = h.submit(**JOB)
        await pump()
        (run,) = h.launcher.runs
        h.broker.suspend(job)
        run.acknowledge(40)
        await h.clock.advance(1.0)  # the next look for markers
        assert "acknowledged" in h.events(job)
        await h.clock.advance(9.9)  # within the kill timeout after it: no signal
        assert run.signals == ["SIGTSTP"]
        run.exit(0)
        await pump()
        first, resumed = h.runs(job)
        assert (first.end_reason, first.end_step, resumed.start_step) == ("suspended", 40, 40)


@in_loop
async def test_acknowledged_run_that_does_not_exit_is_killed(tmp_path):
    async with running_broker(tmp_path) as h:
        job = h.submit(**JOB)
        await pump()
        (run,) = h.launcher.runs
        h.broker.suspend(job)
        run.acknowledge(40)
        await h.clock.advance(1.0)
        await h.clock.advance(10.0)  # the kill timeout after the acknowledgement
        assert run.signals == ["SIGTSTP", "SIGKILL"]
        run.exit(-9)
        await pump()
        assert h.runs(job)[0].end_step == 40  # the acknowledged checkpoint counts


@in_loop
async def test_exit_before_the_acknowledgement_is_seen(tmp_path):
    """The job writes its marker and exits between two looks: the exit reads the marker."""
    async with running_broker(tmp_path) as h:
        job = h.submit(**JOB)
        await pump()
        (run,) = h.launcher.runs
        h.broker.suspend(job)
        run.acknowledge(55)
        run.exit(0)
        await pump()
        first = h.runs(job)[0]
        assert (first.end_reason, first.end_step) == ("suspended", 55)
        assert h.events(job).count("acknowledged") == 1


@in_loop
async def test_sigusr1_without_a_marker_acknowledges_the_only_suspending_run(tmp_path):
    async with running_broker(tmp_path) as h:
        job = h.submit(**JOB)
        await pump()
        h.broker.suspend(job)
        h.broker.runs.check_acks(by_signal=True)
        (ack,) = [e for e in h.store.events(job) if e.kind == "acknowledged"]
        assert ack.data["via"] == "SIGUSR1"


@in_loop
async def test_a_late_sigusr1_of_another_run_does_not_lose_the_step_of_the_one_it_was_given_to(
        tmp_path):
    """Two runs suspended: the first's marker is seen by a look, and its SIGUSR1 comes after,
    when the second is the only run still suspending. Before, it was taken for the second's
    answer: the second's save got the kill timeout (10 s) instead of the suspend timeout, and
    its run ended at no known step (a CI run of test_suspend_resume.py's shutdown test
    recorded step 0 for such a job and ran it again from the start). Now the second answers
    by its own marker, and its run ends at its step."""
    async with running_broker(tmp_path) as h:
        first, second = h.submit(**JOB, gpus=2), h.submit(**JOB, gpus=2)
        await pump()
        one, two = h.launcher.runs
        one.report(10)
        two.report(10)
        h.broker.suspend(first)
        h.broker.suspend(second)
        one.acknowledge(30)
        await h.clock.advance(1.0)  # a look finds the first marker
        h.broker.runs.check_acks(by_signal=True)  # the first run's SIGUSR1, late
        one.exit(0)
        await h.clock.advance(30.0)  # the second saves for 30 s: past the kill timeout
        assert two.signals == ["SIGTSTP"]
        two.acknowledge(45)
        await h.clock.advance(1.0)
        two.exit(0)
        await pump()
        assert [(r.end_reason, r.end_step) for r in h.runs(second)][0] == ("suspended", 45)
        acks = [e.data["via"] for e in h.store.events(second) if e.kind == "acknowledged"]
        assert acks == ["marker"]
        assert [r.end_step for r in h.runs(first)][0] == 30


@in_loop
async def test_run_that_ends_its_steps_before_seeing_the_suspension_is_done(tmp_path):
    async with running_broker(tmp_path) as h:
        job = h.submit(**JOB)
        await pump()
        (run,) = h.launcher.runs
        h.broker.suspend(job)
        run.report(1000)
        run.exit(0)
        await pump()
        assert h.job(job).state is JobState.DONE
        assert h.runs(job)[0].end_reason == "done"


@in_loop
async def test_cancel_while_the_process_is_being_started(tmp_path):
    launcher = FakeLauncher(hold=asyncio.Event())
    async with running_broker(tmp_path, launcher=launcher) as h:
        job = h.submit(**JOB)
        await pump()
        assert job in h.broker.runs.launching and not launcher.runs
        h.broker.cancel(job)
        launcher.hold.set()
        await pump()
        (run,) = launcher.runs
        assert run.signals == ["SIGCONT", "SIGTERM"]
        run.exit(-15)
        await pump()
        assert h.job(job).state is JobState.CANCELLED
        assert h.runs(job)[0].end_reason == "cancelled"


@in_loop
async def test_drain_while_a_process_is_being_started_suspends_it_once_started(tmp_path):
    launcher = FakeLauncher(hold=asyncio.Event())
    async with running_broker(tmp_path, launcher=launcher) as h:
        job = h.submit(**JOB)
        await pump()
        drained = asyncio.get_running_loop().create_task(h.broker.drain("shutdown"))
        await pump()
        assert not drained.done()  # a run is still being started
        launcher.hold.set()
        await pump()
        (run,) = launcher.runs
        assert run.signals == ["SIGTSTP"]
        run.acknowledge(3)
        run.exit(0)
        await pump()
        await asyncio.wait_for(drained, 1)
        assert h.job(job).state is JobState.SUSPENDED


@in_loop
async def test_reshape_while_the_process_is_being_started_waits_for_its_first_step(tmp_path):
    """A policy may move a job whose process is still starting (malleable with no guard: a
    newcomer's share); the broker neither fails on it nor takes it before the run reports
    its first step (lifecycle I6), and asks it then."""
    launcher = FakeLauncher(hold=asyncio.Event())
    async with running_broker(tmp_path, launcher=launcher, policy="malleable",
                              options={"preempt_guard": 0.0}) as h:
        first = h.submit(model="inception-v3", steps=3000, command=["train"])  # 4 of 6 GPUs
        await pump()
        assert first in h.broker.runs.launching
        await h.clock.advance(1.0)  # malleable reshapes no run at the instant it started
        h.submit(model="inception-v3", steps=3000, command=["train"])  # shares: 3 and 3
        await pump()
        assert h.job(first).state is JobState.RUNNING and not h.task.done()  # alive, held
        launcher.hold.set()
        await pump()
        run = launcher.runs[0]
        await h.clock.advance(1.0)
        assert run.signals == [] and "reshape-held" in h.events(first)  # still starting up
        run.report(0, at=h.clock.time(), first_step_at=h.clock.time())
        await h.clock.advance(1.0)  # looked at again each monitor interval
        assert run.signals == ["SIGTSTP"]
        run.acknowledge(0)
        run.exit(0)
        await pump()
        assert [(r.gpu_count, r.end_reason) for r in h.runs(first)] == [(4, "suspended"),
                                                                          (3, None)]
        # counted as the ledger commits its events
        held = float(h.events(first).count("reshape-held"))  # its launch's, then its run's
        assert f"marbled_moves_held_total {held}" in h.broker.metrics.exposition()[0].decode()


@in_loop
async def test_launch_failure_fails_the_job_and_says_why(tmp_path):
    launcher = FakeLauncher(fail=FileNotFoundError(2, "No such file or directory"))
    async with running_broker(tmp_path, launcher=launcher) as h:
        job = h.submit(**JOB)
        await pump()
        assert h.job(job).state is JobState.FAILED
        (failed,) = [e for e in h.store.events(job) if e.kind == "failed"]
        assert "could not start 'train'" in failed.data["detail"]


@pytest.mark.parametrize("error", [ValueError("embedded null byte"),
                                   UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogate"),
                                   RuntimeError("a bug in a launcher")])
@in_loop
async def test_any_launch_failure_fails_the_run_and_frees_its_gpus(tmp_path, error):
    """Lifecycle I3: whatever a launch raises, the run fails with the reason, its GPUs go to
    the next job, and nothing is left `running` (before: the job stayed running forever)."""
    launcher = FakeLauncher(fail=error)
    async with running_broker(tmp_path, launcher=launcher) as h:
        job = h.submit(**{**JOB, "gpus": 6})
        await pump()
        assert h.job(job).state is JobState.FAILED and not h.job(job).gpus
        (failed,) = [e for e in h.store.events(job) if e.kind == "failed"]
        assert type(error).__name__ in failed.data["detail"] or "could not start" in \
            failed.data["detail"]
        launcher.fail = None
        second = h.submit(**{**JOB, "gpus": 6})
        await pump()
        assert h.job(second).state is JobState.RUNNING


@in_loop
async def test_a_job_directory_that_cannot_be_made_fails_the_run_not_the_broker(tmp_path):
    """The directories are made as the run launches, after the decision: an error there (a
    state directory that is no longer one) fails that run, with the path, and no other."""
    (tmp_path / "jobs").write_text("")  # not a directory: every mkdir under it fails
    async with running_broker(tmp_path) as h:
        job = h.submit(**JOB)
        await pump()
        assert h.job(job).state is JobState.FAILED and not h.launcher.runs
        assert not h.task.done() and not h.broker.runs.launching
        (failed,) = [e for e in h.store.events(job) if e.kind == "failed"]
        assert f"could not prepare the job's directory {tmp_path / 'jobs' / str(job)}: " \
               "Not a directory" == failed.data["detail"]


@in_loop
async def test_a_decision_makes_no_directory_and_each_run_has_its_own_before_launch(tmp_path):
    """A decision starting many runs only records them; each run's directories (and no stale
    answer of an earlier run) are there when its process starts, the first one without
    waiting for the others'."""
    seen: list[tuple[bool, bool, int]] = []

    class Launcher(FakeLauncher):
        async def launch(self, request):
            made = sum((request.run_dir.parent / str(j)).is_dir() for j in jobs)
            ckpt = Path(request.env["MARBLE_CHECKPOINT_DIR"])
            seen.append((ckpt.is_dir(), (request.run_dir / PROGRESS_FILE).exists(), made))
            return await super().launch(request)

    async with running_broker(tmp_path, launcher=Launcher(), policy="rigid", gpus=4) as h:
        h.broker.decide, decide = (lambda: None), h.broker.decide
        jobs = [h.submit(command=["train"], model="resnet-50", steps=10, gpus=1)
                for _ in range(4)]
        stale = h.broker.files.dir(jobs[1]) / PROGRESS_FILE  # left by an earlier run
        stale.parent.mkdir(parents=True)
        stale.write_text('{"run_id": 0}')
        decide()
        assert len(h.broker.runs.launching) == 4 and not h.launcher.runs
        assert [h.broker.files.dir(j).exists() for j in jobs] == [False, True, False, False]
        await pump()
    assert seen == [(True, False, 2), (True, False, 2), (True, False, 3), (True, False, 4)]


@in_loop
async def test_failed_run_is_retried_when_its_back_off_ends(tmp_path):
    async with running_broker(tmp_path) as h:
        job = h.submit(**JOB, retries=1)
        await pump()
        h.launcher.runs[0].exit(1)
        await pump()
        assert h.job(job).state is JobState.SUSPENDED and len(h.launcher.runs) == 1
        await h.clock.advance(29.9)
        assert len(h.launcher.runs) == 1
        await h.clock.advance(0.1)
        assert len(h.launcher.runs) == 2 and h.job(job).state is JobState.RUNNING


@in_loop
async def test_time_slices_end_on_a_timer(tmp_path):
    """A time-driven policy is woken at the time it named, with no event in between."""
    async with running_broker(tmp_path, policy="timeslice",
                              options={"time_slice": 100.0}) as h:
        first = h.submit(command=["a"], model="resnet-50", steps=10**6, gpus="auto")
        h.submit(command=["b"], model="resnet-50", steps=10**6)
        third = h.submit(command=["c"], model="resnet-50", steps=10**6)
        await pump()
        assert h.job(third).state is JobState.QUEUED
        h.launcher.runs[0].report(1, first_step_at=h.clock.time())  # trains (lifecycle I6)
        await h.clock.advance(99)
        assert h.launcher.runs[0].signals == []
        await h.clock.advance(1)
        assert h.launcher.runs[0].signals == ["SIGTSTP"]
        assert h.job(first).state is JobState.SUSPENDING


@in_loop
async def test_restart_adopts_a_live_run_and_settles_one_that_ended_unwatched(tmp_path):
    store = Store(None)
    async with running_broker(tmp_path, store=store) as h:
        a = h.submit(**JOB)
        b = h.submit(**JOB)
        await pump()
        h.launcher.runs[1].report(1000)  # b reached its last step; its exit will go unseen
    # the broker died (no drain): the store shows both runs open
    launcher = FakeLauncher(adopt_alive=True)
    async with running_broker(tmp_path, store=store, launcher=launcher) as h:
        assert h.events(a)[-1] == "adopted" and h.events(b).count("adopted") == 1
        assert h.job(a).state is h.job(b).state is JobState.RUNNING
        assert not [r for r in launcher.runs if r.signals]  # nothing started twice
        adopted_b = launcher.runs[1]
        adopted_b.exit(None)  # ended while no broker watched: its files decide
        await pump()
        assert h.job(b).state is JobState.DONE
        assert h.job(a).state is JobState.RUNNING


@in_loop
async def test_run_being_suspended_at_a_crash_still_escalates_after_the_restart(tmp_path):
    store = Store(None)
    async with running_broker(tmp_path, store=store) as h:
        job = h.submit(**JOB)
        await pump()
        h.broker.suspend(job)
    async with running_broker(tmp_path, store=store) as h:
        assert h.job(job).state is JobState.SUSPENDING
        (adopted,) = h.launcher.runs
        await h.clock.advance(60)
        assert adopted.signals[-2:] == ["SIGCONT", "SIGTERM"]


@pytest.mark.parametrize("reason", ["requested by the user"])
@in_loop
async def test_user_suspension_is_recorded_with_its_reason(tmp_path, reason):
    async with running_broker(tmp_path) as h:
        job = h.submit(**JOB)
        await pump()
        h.broker.suspend(job)
        (asked,) = [e for e in h.store.events(job) if e.kind == "suspend-requested"]
        assert asked.data["reason"] == reason


@in_loop
async def test_a_secondary_adopted_at_a_restart_is_promoted_when_gpus_free_up(tmp_path):
    """MARBLE's promotion after a crash: a run the new broker adopts keeps when it started,
    so a policy may move it once it has run a reshape's cost. Before, an adopted run had no
    start for the policies (`run_started` None): marble never promoted an adopted secondary,
    malleable and adaptive never reshaped an adopted run, until it ended."""
    store = Store(None)
    async with running_broker(tmp_path, store=store) as h:
        first = h.submit(command=["a"], model="inception-v3", steps=10**6)  # 4 GPUs
        second = h.submit(command=["b"], model="inception-v3", steps=10**6)
        await pump()
        assert len(h.job(first).gpus) == 4 and len(h.job(second).gpus) == 2  # a secondary
        for run in h.launcher.runs:
            run.report(10, at=h.clock.time())
    # the broker died (no drain); the next one adopts both runs
    launcher = FakeLauncher(adopt_alive=True)
    async with running_broker(tmp_path, store=store, launcher=launcher) as h:
        assert h.job(second).run_started is not None
        await h.clock.advance(600)
        primary, secondary = launcher.runs
        primary.exit(0)  # the primary ends: its 4 GPUs are free
        await pump()
        assert secondary.signals == ["SIGTSTP"]  # promoted: to its checkpoint, then on 4
        assert h.job(second).resume_on is not None and len(h.job(second).resume_on.gpus) == 4


@in_loop
@pytest.mark.parametrize("recorded, state, runs", [
    (0, JobState.DONE, 1),      # it completed: never run again (lifecycle I2)
    (3, JobState.RUNNING, 2),   # it failed on its own: its code, not the kill; retried
    (None, JobState.RUNNING, 2),  # nothing recorded: killed, retried
])
async def test_a_recorded_exit_outranks_the_kill_of_the_process_that_recorded_it(
        tmp_path, recorded, state, runs):
    """The run's supervisor records its command's exit, then is SIGKILLed before it exits
    itself (a window of microseconds, so the test plays the supervisor: it writes the record
    as `supervise.py` does and the FAKE run exits -9). The record is what the command did."""
    async with running_broker(tmp_path) as h:
        job = h.submit(command=["sh", "-c", "true"], gpus=1, retries=1)
        await pump()
        (run,) = h.launcher.runs
        if recorded is not None:
            write_exit(str(run.run_dir), run.run_id, recorded)
        run.exit(-9)
        await pump()
        await h.clock.advance(60)  # past any retry's back-off
        assert h.job(job).state is state
        assert len(h.launcher.runs) == runs
        assert h.runs(job)[0].exit_code == (-9 if recorded is None else recorded)
