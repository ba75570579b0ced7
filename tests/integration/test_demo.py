"""The demo's machinery (two real brokers side by side) works and shows MARBLE's gain."""

from __future__ import annotations

import pytest

from marbled.core.policy import get_policy
from marbled.demo import compare_policies
from marbled.resources import load_profile, workload_path
from marbled.sim.engine import Simulator
from marbled.sim.workloads import from_job_file

pytestmark = pytest.mark.daemon


def test_demo_comparison_on_job_set_3():
    out = compare_policies("paper-jobset3", gpus=6, time_scale=0.01)
    marble, rigid = out["policies"]["marble"], out["policies"]["rigid"]
    assert not marble["failed"] and not rigid["failed"]
    assert {r["role"] for r in marble["runs"]} == {"primary", "secondary"}
    assert any(r["why"] == "suspended" for r in marble["runs"])
    assert all(len(r["gpus"]) == 6 for r in rigid["runs"])
    # Measured times track the simulator's prediction from the same policy code
    # (launch costs make the measurement a little longer).
    for p in (marble, rigid):
        assert p["simulated_s"] <= p["total_s"] <= p["simulated_s"] * 1.3
    assert out["speedup"] > 1.3


def _shape(runs) -> list[tuple]:
    return sorted((r["job"], r["role"], len(r["gpus"]), r["why"]) for r in runs)


def test_simulator_predicts_the_daemons_schedule():
    """Same policy code, two drivers: the daemon's runs (real processes, real clock) and the
    simulator's (virtual clock) have the same jobs, roles, GPU counts and endings."""
    out = compare_policies("paper-jobset2", gpus=6, time_scale=0.01)
    arrivals = from_job_file(workload_path("paper-jobset2"))
    for policy in ("marble", "rigid"):
        sim = Simulator(load_profile(), get_policy(policy), 6).run(arrivals)
        predicted = [{"job": r.job, "role": r.role.value, "gpus": r.gpus, "why": r.reason}
                     for r in sim.runs]
        assert _shape(out["policies"][policy]["runs"]) == _shape(predicted)
