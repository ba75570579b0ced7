"""Ends that come a few ms apart are one decision (issue 21): the neighbour of short jobs is
resized once when they end together, not at each end (1 -> 2 -> 3 -> 4 GPUs, each middle run
a few ms long), as the simulator takes the ends of one instant together."""

from __future__ import annotations

import asyncio

from marbled.core.learning import Learning
from marbled.worker.protocol import PROGRESS_FILE
from tests.broker.fakes import in_loop, pump, running_broker

SHORT = {"emulate": True, "model": "resnet-50", "steps": 100, "gpus": 1}  # rigid, 1 GPU
LONG = {"emulate": True, "model": "inception-v3", "steps": 100_000}  # fastest on 4 GPUs


def of_job(h, job: int) -> list:
    return [r for r in h.launcher.runs if r.request.env.get("MARBLE_JOB_ID") == str(job)]


async def answer_suspends(h) -> None:
    """Play the jobs' part: a run asked to suspend checkpoints and exits at once; one that
    has said nothing yet reports its first step (lifecycle I6: none is reshaped before)."""
    for run in h.launcher.runs:
        if run.signals[-1:] == ["SIGTSTP"] and not run._exit.done():
            run.acknowledge(1)
            run.exit(0)
        elif not run._exit.done() and not (run.run_dir / PROGRESS_FILE).exists():
            run.report(1, at=h.clock.time(), first_step_at=h.clock.time())
    await pump()


async def long_job_counts(tmp_path, coalesce_s: float, reshape_window: float = 1.0,
                          **config) -> tuple[list[int], list[str]]:
    """The GPU counts of the long job's runs when the three 1-GPU jobs beside it end 3 ms
    apart (on the broker's clock and in real time), and the long job's events."""
    async with running_broker(tmp_path, policy="adaptive", gpus=4, coalesce_s=coalesce_s,
                              reshape_window=reshape_window, time_scale=0.001,
                              **config) as h:
        shorts = [h.submit(**SHORT) for _ in range(3)]
        long = h.submit(**LONG)
        await pump()
        assert [len(r.request.devices) for r in of_job(h, long)] == [1]
        await h.clock.advance(0.006)  # past its start-up (assumed 5 s: 5 ms on this clock)
        for job in shorts:
            await answer_suspends(h)  # the long job's run trains: it may be reshaped
            await h.clock.advance(0.003)
            (run,) = of_job(h, job)
            run.exit(0)
            await asyncio.sleep(0.003)
            await answer_suspends(h)
        for _ in range(10):  # the suspensions and resumptions that follow
            await asyncio.sleep(0.02)
            await h.clock.advance(0.003)
            await answer_suspends(h)
        return [len(r.request.devices) for r in of_job(h, long)], h.events(long)


@in_loop
async def test_a_job_is_resized_once_when_its_neighbours_end_a_few_ms_apart(tmp_path):
    counts, events = await long_job_counts(tmp_path, coalesce_s=0.01)
    assert counts == [1, 4] and "reshape-refused" not in events


@in_loop
async def test_without_the_quiet_period_nor_the_guard_it_is_resized_at_every_end(tmp_path):
    """The chain the quiet period prevents, so the test above can fail (with a start-up
    that costs nothing: each run trains at once, and may be reshaped at the next end)."""
    counts, _ = await long_job_counts(tmp_path, coalesce_s=0.0, reshape_window=0.0,
                                      learning=Learning(startup_s=None))
    assert counts == [1, 2, 3, 4]


@in_loop
async def test_a_second_reshape_within_the_window_is_refused_and_logged(tmp_path):
    counts, events = await long_job_counts(tmp_path, coalesce_s=0.0, reshape_window=1.0)
    assert counts == [1, 2] and events.count("reshape-refused") == 1


async def _start_after_an_end(tmp_path, last: bool, movable: bool = True) -> float:
    """Two 1-GPU commands run on 2 GPUs and a third waits (`last`: it needs both GPUs, and
    the second run has ended before), with a job a policy may resize queued behind it
    (`movable`; else every job is rigid). The first run ends: how long (real s) the third
    waits to start, with a quiet period of 0.3 s."""
    async with running_broker(tmp_path, gpus=2, coalesce_s=0.3) as h:
        first, second = (h.submit(command=["true"], gpus=1) for _ in range(2))
        third = h.submit(command=["true"], gpus=2 if last else 1)
        if movable:
            h.submit(command=["true"], model="resnet-50")  # gpus auto: malleable
        await pump()
        assert h.broker.state.movable == movable
        if last:
            of_job(h, second)[0].exit(0)
            await asyncio.sleep(0.5)  # its quiet period is over: the third did not fit
            assert not of_job(h, third)
        began = asyncio.get_running_loop().time()
        of_job(h, first)[0].exit(0)
        while not of_job(h, third):
            await asyncio.sleep(0.005)
        return asyncio.get_running_loop().time() - began


@in_loop
async def test_the_quiet_period_is_waited_while_another_run_could_end(tmp_path):
    assert await _start_after_an_end(tmp_path, last=False) >= 0.3


@in_loop
async def test_after_the_last_run_ends_no_quiet_period_is_waited(tmp_path):
    """No run is left to end: nothing can come to be decided together, so the queue's next
    job starts at once (trivial jobs: each round of six 4 ms shorter; issue 32)."""
    assert await _start_after_an_end(tmp_path, last=True) < 0.2


@in_loop
async def test_with_every_job_rigid_no_quiet_period_is_waited(tmp_path):
    """Rigid jobs run on their own counts and are never moved by a policy: a decision at
    one end is not undone at the next, so the next job starts at once (`sleep 0.1` x200 on
    6 slots: 53.6 -> 56.3 jobs/s; issue 32), though another run could still end."""
    assert await _start_after_an_end(tmp_path, last=False, movable=False) < 0.2
