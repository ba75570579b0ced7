"""Time slicing (Gandiva-style) in the simulator: round robin only when over-subscribed."""

from __future__ import annotations

from marbled.core.policy import get_policy
from marbled.core.spec import JobSpec
from marbled.resources import load_profile
from marbled.sim.engine import Simulator

BOOK = load_profile()
ALEXNET = BOOK.lookup("alexnet")  # optimal on all 6 GPUs: two jobs over-subscribe a node


def run(specs, slice_s=100.0, **kw):
    return Simulator(BOOK, get_policy("timeslice", time_slice=slice_s), 6, **kw).run(specs)


def test_two_jobs_on_a_full_node_take_turns_of_one_slice():
    steps = round(1000 * ALEXNET.throughput(6))  # about 1000 s alone
    r = run([JobSpec(emulate=True, model="alexnet", steps=steps)] * 2)
    runs = sorted(r.runs, key=lambda x: x.start)
    assert [x.job for x in runs[:6]] == [1, 2, 1, 2, 1, 2]  # round robin
    for a, b in zip(runs, runs[1:], strict=False):
        assert b.start >= a.end - 1e-9  # one at a time on the 6 GPUs
    assert all(abs((x.end - x.start) - 100.0) < 1.0 for x in runs[:-2])
    for job in (1, 2):
        chain = [x for x in runs if x.job == job]
        assert chain[-1].end_step == steps
        assert all(a.end_step == b.start_step for a, b in zip(chain, chain[1:], strict=False))
    # Slicing shares the node; it does not speed the pair up.
    assert abs(r.makespan - 2 * steps / ALEXNET.throughput(6)) < 2 * len(runs)


def test_nothing_is_suspended_when_nobody_waits():
    r = run([JobSpec(emulate=True, model="alexnet", steps=5000)])
    assert r.suspensions == 0 and len(r.runs) == 1


def test_the_job_that_waited_longest_goes_first():
    steps = round(300 * ALEXNET.throughput(6))
    r = run([JobSpec(emulate=True, model="alexnet", steps=steps)] * 3)
    order = [x.job for x in sorted(r.runs, key=lambda x: x.start)][:6]
    assert order == [1, 2, 3, 1, 2, 3]
