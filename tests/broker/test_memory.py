"""A broker gives back to the system what its ended jobs held (daemon/memory.py): glibc keeps
the freed blocks of objects over 512 bytes, so a broker whose queue of 20,000 jobs drained
stayed near its peak. The trim itself in a fresh interpreter (its RSS read from /proc), and
when a real Broker in this process (tests/broker/fakes.py) asks for it. And CPython's dicts
and sets never shrink when items leave, so the state's indexes kept tables sized for every
job once queued (issue 32): `memory.compact` rebuilds them, in place, when jobs leave."""

from __future__ import annotations

import subprocess
import sys

import pytest

from marbled.core.spec import JobSpec
from marbled.daemon import intake
from marbled.daemon.memory import compact
from marbled.store.db import Store
from tests.broker.fakes import in_loop, pump, running_broker
from tests.broker.test_ended_jobs import TRUE, _end

# 20,000 records of 28 fields (each __dict__ over 512 bytes: glibc's, not Python's own
# allocator), freed but for a few made after them: what the trim gives back
PROBE = """
import gc
from marbled.daemon.memory import give_back_freed
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
class Record:
    pass
held = []
for i in range(20000):
    r = Record()
    r.__dict__.update({f"f{k}": k * i for k in range(28)})
    held.append(r)
kept = [Record() for _ in range(2000)]
del held
gc.collect()
before = rss()
asked = give_back_freed()
print(asked, before - rss())
"""


def test_the_memory_of_freed_records_goes_back_to_the_system():
    asked, given = subprocess.run([sys.executable, "-c", PROBE], capture_output=True,
                                  text=True, check=True).stdout.split()
    if asked != "True":
        pytest.skip("this C library has no malloc_trim (not glibc): nothing to give back")
    assert int(given) > 5 * 2**20, f"only {int(given)} bytes went back"


@in_loop
async def test_the_broker_gives_memory_back_when_its_jobs_have_left(tmp_path, monkeypatch):
    """Once its state is empty (and every TRIM_EVERY jobs that left), not at each job."""
    asked: list[int] = []
    monkeypatch.setattr(intake, "give_back_freed", lambda: asked.append(1) or True)
    monkeypatch.setattr(intake, "TRIM_EVERY", 5)
    async with running_broker(tmp_path, store=Store(tmp_path / "marble.db")) as h:
        blocker = h.submit(**{**TRUE, "gpus": 6})
        await pump()
        jobs = [h.submit(**TRUE) for _ in range(12)]  # wait behind the blocker
        await _end(h)  # the blocker leaves: 1 of 5, a job still held
        assert asked == [] and h.broker.intake.left_since_trim == 1
        await _end(h)  # 6 more leave: 7, past 5
        assert len(asked) == 1 and h.broker.intake.left_since_trim == 0
        await _end(h)  # the last 6: the state is empty
        assert {h.job(j).state.value for j in [blocker, *jobs]} == {"done"}
        assert not h.broker.state.jobs and len(asked) == 2


class Holder:
    def __init__(self, n: int):
        self.drained = {i: str(i) for i in range(n)}
        self.emptied = set(range(n))
        self.dense = {i: i for i in range(n)}


def test_sparse_tables_are_rebuilt_in_place_and_dense_ones_left():
    h = Holder(20_000)
    drained, emptied, dense_size = h.drained, h.emptied, sys.getsizeof(h.dense)
    for i in range(19_990):  # items leave one by one, as jobs leave the state
        del h.drained[i]
    for i in range(20_000):
        h.emptied.discard(i)
    assert sys.getsizeof(h.drained) > 500_000 and sys.getsizeof(h.emptied) > 500_000
    assert compact(h) == 2
    assert h.drained is drained and h.drained == {i: str(i) for i in range(19_990, 20_000)}
    assert h.emptied is emptied and h.emptied == set()
    assert sys.getsizeof(h.drained) < 4096 and sys.getsizeof(h.emptied) < 4096
    assert sys.getsizeof(h.dense) == dense_size  # full: not rebuilt


@in_loop
async def test_a_drained_broker_holds_no_table_sized_for_its_old_queue(tmp_path):
    """3,000 commands through a broker on 6 GPUs: once none is left, the tables of its
    state, its ledger and itself are small again."""
    async with running_broker(tmp_path, gpus=6) as h:
        for _ in range(3):
            h.broker.submit([JobSpec.from_mapping({"command": ["true"], "gpus": 1})] * 1000)
        big = sys.getsizeof(h.broker.state.jobs)
        while h.broker.state.jobs:
            for run in h.launcher.runs:
                if not run._exit.done():
                    run.exit(0)
            await pump()
        tables = {f"{type(o).__name__}.{name}": sys.getsizeof(v)
                  for o in (h.broker.state, h.broker.ledger, h.broker)
                  for name, v in vars(o).items() if isinstance(v, (dict, set))}
    assert big > 50_000
    assert max(tables.values()) < 4096, {k: v for k, v in tables.items() if v >= 4096}
