"""Runs that end some 30 ms apart, longer than the broker's quiet period, are still one
decision when their progress says they end together (issue 21): the broker waits, at most
`coalesce_max_s`, for the runs due to end, so the neighbour of three short jobs goes from
1 GPU to 4 once, not 1 -> 2 -> 3 -> 4. Jobs given as `--emulate` jobs and as plain commands
(the broker reads the pace of either from its progress reports)."""

from __future__ import annotations

import asyncio
import time

import pytest

from marbled.core.learning import Learning
from tests.broker.fakes import in_loop, pump, running_broker
from tests.broker.test_coalesced_wakes import answer_suspends, of_job

KINDS = {"emulate": {"emulate": True}, "command": {"command": ["./train.sh"]}}
SHORT = {"model": "resnet-50", "steps": 100, "gpus": 1}  # rigid, 1 GPU
LONG = {"model": "inception-v3", "steps": 100_000}  # fastest on 4 GPUs
GAP = 0.03  # real seconds between two ends: three times the quiet period
# a start-up known to cost nothing (else 5 s are assumed, real seconds for a command and at
# time scale 1, and no run is moved before: the long job here is moved 0.1 s after its start)
FREE_START = Learning(startup_s=None)


async def beside_three_short_jobs(h, kind: str, reports: bool = True) -> tuple[list, int]:
    """Three short jobs on 1 GPU each and the long one on the fourth; 0.1 s on, each short
    job has trained 99 of its 100 steps (`reports`: and says so). Their runs and the long
    job's id."""
    shorts = [h.submit(**SHORT, **KINDS[kind]) for _ in range(3)]
    long = h.submit(**LONG, **KINDS[kind])
    await pump()
    assert [len(r.request.devices) for r in of_job(h, long)] == [1]
    began = h.clock.time()
    of_job(h, long)[0].report(0, at=began, first_step_at=began)  # it trains (lifecycle I6)
    await h.clock.advance(0.1)
    runs = [of_job(h, job)[0] for job in shorts]
    if reports:
        for run in runs:
            run.report(99, at=h.clock.time(), first_step_at=began + 0.001)
    return runs, long


async def end_apart(h, runs: list, gap: float = GAP) -> None:
    """The runs end `gap` apart in real time (1 ms apart on the broker's clock); then the
    suspensions and resumptions that follow are played out."""
    for run in runs:
        run.exit(0)
        await asyncio.sleep(gap)
        await h.clock.advance(0.001)
        await answer_suspends(h)
    for _ in range(10):
        await asyncio.sleep(0.02)
        await h.clock.advance(0.003)
        await answer_suspends(h)


@pytest.mark.parametrize("kind", KINDS)
@in_loop
async def test_a_job_grows_once_when_its_neighbours_end_30_ms_apart(tmp_path, kind):
    async with running_broker(tmp_path, policy="adaptive", gpus=4, coalesce_s=0.01,
                              coalesce_max_s=0.5, time_scale=0.001,
                              learning=FREE_START) as h:
        runs, long = await beside_three_short_jobs(h, kind)
        await end_apart(h, runs)
        assert [len(r.request.devices) for r in of_job(h, long)] == [1, 4]
        assert "reshape-refused" not in h.events(long)


@in_loop
async def test_without_a_forecast_each_end_is_a_decision(tmp_path):
    """The chain the forecast prevents, so the test above can fail: no progress reports, and
    by the profile the short jobs have 30 s to go (time scale 1), so none is waited for."""
    async with running_broker(tmp_path, policy="adaptive", gpus=4, coalesce_s=0.01,
                              coalesce_max_s=0.5, reshape_window=0.0, time_scale=1.0,
                              learning=FREE_START) as h:
        runs, long = await beside_three_short_jobs(h, "emulate", reports=False)
        await end_apart(h, runs, gap=0.1)  # (a busy loop cannot take two ends as one)
        counts = [len(r.request.devices) for r in of_job(h, long)]
        assert counts[:2] == [1, 2] and counts[-1] == 4, counts  # grown at the first end


async def until_asked_to_suspend(run, limit: float) -> float:
    """Real seconds until the broker asks `run` to suspend (its decision), at most `limit`."""
    began = time.monotonic()
    while "SIGTSTP" not in run.signals and time.monotonic() - began < limit:
        await asyncio.sleep(0.005)
    return time.monotonic() - began


@pytest.mark.parametrize("others_due", [True, False])
@in_loop
async def test_a_decision_waits_for_runs_due_at_most_coalesce_max_s(tmp_path, others_due):
    """One short job ends; the other two are due (they never end here) or say nothing. The
    long job's growth into the freed GPU waits `coalesce_max_s` for them, and no more; with
    nothing due (by the profile, 30 s to go), only the quiet period."""
    bound = 0.3
    async with running_broker(tmp_path, policy="adaptive", gpus=4, coalesce_s=0.01,
                              coalesce_max_s=bound, time_scale=0.001 if others_due else 1.0,
                              learning=FREE_START) as h:
        runs, long = await beside_three_short_jobs(h, "emulate", reports=others_due)
        runs[0].exit(0)
        waited = await until_asked_to_suspend(of_job(h, long)[0], limit=5.0)
    if others_due:
        assert bound <= waited < bound + 1.0, waited  # + what a loaded machine adds
    else:
        assert waited < bound, waited
