"""The demo's machinery (two real brokers side by side) works and shows MARBLE's gain."""

from __future__ import annotations

import pytest

from marbled.demo import compare_policies

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
