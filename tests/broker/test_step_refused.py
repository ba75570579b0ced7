"""A run whose step the batch system refused to create never ran its command (Slurm:
"srun: error: Unable to create step for job 180: Invalid generic resource (gres)
specification", seen in a CI run when a step asked for GPUs a few ms after other steps had
ended): it is run again after a short wait, not counted as the job's failure, and only a
refusal that repeats REFUSED_TRIES times fails the job. The refusal comes from the launcher
(`ended_by`); here a fake run says it (the Slurm launcher's reading is tested below), and
real srun refusals are the Slurm tier's."""

from __future__ import annotations

from marbled.batch.slurm import SlurmStep
from marbled.batch.slurm_api import step_refused
from marbled.daemon.run_failures import REFUSED_FIRST_S, REFUSED_TRIES
from tests.broker.fakes import in_loop, pump, running_broker

LINE = ("srun: error: Unable to create step for job 180: Invalid generic resource (gres) "
        "specification")
REFUSAL = step_refused(LINE)
COMMAND = {"command": ["true"], "gpus": 2}


def test_srun_s_refusal_is_read_only_for_a_step_that_never_started(tmp_path):
    assert REFUSAL == {"state": "NOT_CREATED", "never_ran": True,
                       "detail": "Slurm did not create the step: Invalid generic resource "
                                 "(gres) specification"}
    assert step_refused("srun: error: task 0: Exited with exit code 1") is None
    step = SlurmStep(123, None, tmp_path / "step.json", "7", "180", ("n1",), None)
    assert step.ended_by(LINE) == REFUSAL  # no info file: the step never started
    (tmp_path / "step.json").write_text('{"run_id": "7", "step_id": "3", "job_id": "180"}')
    assert step.ended_by(LINE) is None  # it started: its end is its own


def test_srun_that_cannot_use_its_allocation_never_ran_its_command():
    """srun's words when its allocation has ended (a step launched as the broker died and its
    allocation was cancelled: a hunt) or the controller does not confirm it (srun's
    allocate.c): no step was created, so the command never ran."""
    expired = ("srun: error: Slurm job 379 has expired\nsrun: Check SLURM_JOB_ID environment "
               "variable. Expired or invalid job 379")
    assert step_refused(expired) == {
        "state": "NOT_CREATED", "never_ran": True,
        "detail": "srun could not use its allocation: Slurm job 379 has expired"}
    timed_out = ("srun: error: Unable to confirm allocation for job 911: Socket timed out on "
                 "send/recv operation\nsrun: Check SLURM_JOB_ID environment variable. "
                 "Expired or invalid job 911")
    assert step_refused(timed_out)["detail"] == (
        "srun could not use its allocation: Unable to confirm allocation for job 911: Socket "
        "timed out on send/recv operation")


def _ends(h, job: int) -> list[tuple[str, str]]:
    """(kind, detail) of the job's runs' ends, in order."""
    return [(e.kind, e.data["detail"]) for e in h.store.events(job)
            if e.kind in ("suspended", "done", "failed", "cancelled")]


async def _refuse(h, job: int) -> None:
    """The job's newest run ends as a refused step."""
    run = h.launcher.runs[-1]
    assert run.request.env["MARBLE_JOB_ID"] == str(job)
    run.ended_by = lambda stderr: REFUSAL
    run.exit(1)
    await pump()


@in_loop
async def test_a_refused_step_runs_again_later_and_is_no_failure(tmp_path):
    async with running_broker(tmp_path) as h:
        job = h.submit(**COMMAND)
        await pump()
        delay = REFUSED_FIRST_S
        for refusal in range(1, REFUSED_TRIES + 1):
            await _refuse(h, job)
            assert h.job(job).state.value == "suspended" and len(h.launcher.runs) == refusal
            await h.clock.advance(delay * 0.9)
            assert len(h.launcher.runs) == refusal  # it waits
            await h.clock.advance(delay * 0.2)
            assert len(h.launcher.runs) == refusal + 1, refusal  # then runs again
            delay *= 2
        h.launcher.runs[-1].exit(0)  # the step was created this time, and ran
        await pump()
        assert h.job(job).state.value == "done"
        runs, ends = h.runs(job), _ends(h, job)
    assert [r.end_reason for r in runs] == ["suspended"] * REFUSED_TRIES + ["done"]
    assert [kind for kind, _ in ends] == ["suspended"] * REFUSED_TRIES + ["done"]
    assert "its command never ran: again in 0.5 s (refusal 1 of at most 5" in ends[0][1]
    assert "again in 8 s (refusal 5 of at most 5" in ends[4][1]


@in_loop
async def test_a_refusal_that_repeats_fails_the_job_and_a_cancel_is_not_retried(tmp_path):
    async with running_broker(tmp_path) as h:
        job = h.submit(**COMMAND)
        await pump()
        for _ in range(REFUSED_TRIES):
            await _refuse(h, job)
            await h.clock.advance(REFUSED_FIRST_S * 2 ** REFUSED_TRIES)
        await _refuse(h, job)  # one more in a row: a step that is never created
        assert h.job(job).state.value == "failed"
        assert "Slurm did not create the step: Invalid generic resource" in _ends(h, job)[-1][1]
        other = h.submit(**COMMAND)
        await pump()
        h.broker.cancel(other)
        await _refuse(h, other)
        assert h.job(other).state.value == "cancelled"
