"""A broker gives back to the system what its ended jobs held (daemon/memory.py): glibc keeps
the freed blocks of objects over 512 bytes, so a broker whose queue of 20,000 jobs drained
stayed near its peak. The trim itself in a fresh interpreter (its RSS read from /proc), and
when a real Broker in this process (tests/broker/fakes.py) asks for it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from marbled.daemon import intake
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
