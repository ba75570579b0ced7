"""Lifecycle I6 in the real daemon: a job whose start-up is slow (its imports, here a sleep
before the worker's first step) is not reshaped by the adaptive policy before its first
step, however its neighbours arrive; once it trains it may be (real processes, signals and
the worker protocol, via marbled.worker)."""

from __future__ import annotations

import sys
import time

import pytest

pytestmark = pytest.mark.daemon

SLOW_START = 7.0  # real seconds from its restore to its first step (a slow warm-up)
ASSUMED = 5.0  # the start-up assumed of a model never measured (core.learning)
WRAPPER = """\
import runpy, sys, time
from marbled.worker.protocol import JobProtocol
JobProtocol.from_env().restored(0)  # it speaks the protocol: restored, its first step to come
time.sleep(float(sys.argv[1]))  # a slow start-up: building the model, warming up
sys.argv = [sys.argv[0], *sys.argv[2:]]
runpy.run_module("marbled.worker.emulate", run_name="__main__")
"""


def job(script, model: str, steps: int, start_up: float) -> dict:
    return {"model": model, "steps": steps,
            "command": [sys.executable, str(script), str(start_up), "--time-scale", "0.01"]}


def test_a_slow_starting_job_is_not_reshaped_before_its_first_step(daemon_factory, tmp_path):
    script = tmp_path / "slow_start.py"
    script.write_text(WRAPPER)
    daemon = daemon_factory("--policy", "adaptive")
    # alone, the long job takes its fastest count (4 of 6 GPUs) ...
    [slow] = daemon.submit(job(script, "inception-v3", 3000, SLOW_START))
    deadline = time.monotonic() + 10
    while not daemon.runs() and time.monotonic() < deadline:
        time.sleep(0.05)
    # ... and once it has run past the start-up assumed of its model, but before its first
    # step, four jobs arrive for which adaptive would make room
    time.sleep(ASSUMED + 0.5)
    daemon.submit(*[job(script, "resnet-50", 3000, 0.0)] * 4)
    jobs = daemon.wait_all(timeout=180)
    assert {j["state"] for j in jobs} == {"done"}
    runs = [r for r in daemon.runs() if r["job_id"] == slow["id"]]
    asked = daemon.query("SELECT at, run_id FROM events WHERE kind = 'suspend-requested' "
                         "AND job_id = ?", slow["id"])
    for ask in asked:  # no run was asked to suspend during its start-up
        run = next(r for r in runs if r["id"] == ask["run_id"])
        assert ask["at"] - run["started_at"] >= SLOW_START, (dict(run), dict(ask))
    for run in runs[:-1]:  # every suspended run trained before it was stopped
        assert run["end_step"] > run["start_step"], [dict(r) for r in runs]
    # the policy wanted the move during the start-up: the broker held it, said so once a
    # run (a later run starts up slowly too, and may be held as well)
    held = [h["run_id"] for h in daemon.query(
        "SELECT at, run_id FROM events WHERE kind = 'reshape-held' AND job_id = ?",
        slow["id"])]
    assert held[:1] == [runs[0]["id"]] and len(held) == len(set(held)), held
    assert set(held) <= {r["id"] for r in runs}, held
