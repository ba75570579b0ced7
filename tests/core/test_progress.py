"""A running job's speed and ETA (core/progress.py) and the window its reports name."""

from __future__ import annotations

import json

import pytest

from marbled.core.profiles import ThroughputCurve
from marbled.core.progress import end_forecast, run_progress
from marbled.worker import protocol
from marbled.worker.protocol import PROGRESS_FILE, RATE_WINDOW_S, JobProtocol, malformed


def _report(step: int, time: float, since: tuple[int, float] | None, first_step_at: float = 1.0,
            start_step: int = 0) -> dict:
    doc = {"step": step, "time": time, "start_step": start_step,
           "phases": {"launch": 0.0, "first_step": first_step_at}}
    if since is not None:
        doc["since"] = {"step": since[0], "time": since[1]}
    return doc


def test_the_speed_is_the_last_windows_not_the_runs_average():
    # 100 steps/s for 60 s, then 50 steps/s: the last second says 50
    report = _report(6050, 62.0, since=(6000, 61.0), first_step_at=1.0)
    p = run_progress(report, 10_000, 1, 1, None, now=62.5)
    assert p.source == "measured"
    assert p.rate == pytest.approx(50.0)
    assert p.finish_at == pytest.approx(62.0 + 3950 / 50.0)
    # the average since the first step (what was used before) would say 99 steps/s
    assert run_progress({k: v for k, v in report.items() if k != "since"}, 10_000, 1, 1, None,
                        62.5).rate == pytest.approx(6049 / 61.0)


def test_the_window_never_reaches_back_into_start_up():
    # `since` is a report from before the first step (restored at 0, first step at 5 s)
    report = _report(201, 7.0, since=(0, 4.5), first_step_at=5.0)
    p = run_progress(report, 1000, 1, 1, None, now=7.0)
    assert p.rate == pytest.approx((201 - 1) / (7.0 - 5.0))  # from the first step: 100/s


def test_before_a_second_of_training_the_curve_stands_in():
    curve = ThroughputCurve("m", [4.0, 7.0])
    report = _report(3, 1.4, since=(1, 1.2), first_step_at=1.0)
    p = run_progress(report, 100, 2, 1, curve, now=2.0)
    assert (p.source, p.rate) == ("profile", 7.0)
    assert p.finish_at == pytest.approx(2.0 + 97 / 7.0)


def test_a_window_without_new_steps_falls_back_to_the_runs_average():
    report = _report(300, 4.0, since=(300, 4.0), first_step_at=1.0)
    assert run_progress(report, None, 1, 1, None, 4.0).rate == pytest.approx(299 / 3.0)


def test_reports_name_the_newest_report_a_window_old(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(protocol.time, "time", lambda: clock[0])
    proto = JobProtocol(run_id=1, run_dir=tmp_path, report_interval=0.25)
    sent = []
    for step in range(1, 13):  # a report every 0.25 s
        proto.report(step * 10)
        sent.append(json.loads((tmp_path / PROGRESS_FILE).read_text())["since"])
        clock[0] += 0.25
    assert sent[0] == {"step": 10, "time": 100.0}  # the first report: no window yet
    # from then on: the newest report at least RATE_WINDOW_S (1 s) before this one
    assert RATE_WINDOW_S == 1.0
    assert sent[-1] == {"step": 80, "time": 101.75}  # the report 1 s before step 120
    assert all(s["step"] == max(10, (i + 1 - 4) * 10) for i, s in enumerate(sent))


def test_a_short_run_is_forecast_by_its_own_steps_before_a_speed_is_measured():
    # 99 of 100 steps in 0.1 s of training (profile: 7 steps/s on 2 GPUs): due in 1 ms, where
    # the profile's speed from `now` says 14 s
    curve = ThroughputCurve("m", [4.0, 7.0])
    report = _report(99, 1.1, since=(50, 1.05), first_step_at=1.0)
    assert run_progress(report, 100, 2, 1, curve, now=1.2).finish_at == pytest.approx(
        1.2 + 1 / 7.0)
    assert end_forecast(report, 100, 2, 1, curve, now=1.2) == pytest.approx(1.1 + 1 / 980)
    # one step trained: the curve's speed, from the report (not from `now`)
    one = _report(1, 1.0, since=None, first_step_at=1.0)
    assert end_forecast(one, 100, 2, 1, curve, now=5.0) == pytest.approx(1.0 + 99 / 7.0)
    assert end_forecast(one, 100, 2, 1, None, now=5.0) is None
    # a measured speed is run_progress's; not training yet: a whole run from now
    measured = _report(6050, 62.0, since=(6000, 61.0), first_step_at=1.0)
    assert end_forecast(measured, 10_000, 1, 1, None, 62.5) == pytest.approx(62.0 + 3950 / 50)
    assert end_forecast({"step": 0, "start_step": 0, "time": 0.5}, 100, 2, 1, curve,
                        now=3.0) == pytest.approx(3.0 + 100 / 7.0)


@pytest.mark.parametrize("doc, wrong", [
    ({"run_id": 3, "step": 10, "start_step": None, "time": 1.5, "phases": {"launch": 1.0},
      "prestart": False, "since": {"step": 9, "time": 1.0}}, None),  # as `report` writes
    ({"run_id": 3, "step": 10, "time": 2.0, "signalled_at": None, "save_seconds": 0.4}, None),
    ({"run_id": 3, "step": "10"}, "step: '10'"),
    ({"run_id": 3, "step": True}, "step: True"),
    ({"run_id": 3, "step": -1}, "step: -1"),
    ({"run_id": "3"}, "run_id: '3'"),
    ({"run_id": 3, "time": float("nan")}, "time: nan"),
    ({"run_id": 3, "phases": {"first_step": "x"}}, "phases: {'first_step': 'x'}"),
    ({"run_id": 3, "since": 5}, "since: 5"),
    ({"run_id": 3, "start_step": 2.5}, "start_step: 2.5"),
])
def test_a_report_of_the_wrong_types_is_malformed(doc, wrong):
    assert malformed(doc) == wrong
