"""The demo's progress line counts each broker's jobs against the job set, not their sum
(two brokers run the same 3-job set: it once said "4 jobs still to finish")."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from marbled import demo
from marbled.resources import load_job_file, workload_path


def test_the_progress_line_counts_per_broker_against_the_set():
    line = demo.progress_line(12.34, {"marble": 1, "rigid": 3}, 3)
    assert line == "   12.3 s: jobs still to finish: MARBLE 1 of 3, LSF way 3 of 3"


class _Stop(Exception):
    pass


class _Proc:
    def terminate(self):
        pass

    def wait(self, timeout=None):
        return 0


def test_compare_policies_prints_each_brokers_count(monkeypatch, capsys):
    """Two fake brokers, 3 jobs each: the marble one has 1 left, the rigid one 3, then
    both none. The lines say so per broker; the total (4) is never printed."""
    left = {"marble": [1, 0], "rigid": [3, 0]}

    class Client:
        def __init__(self, path):
            self.policy = path.parent.name

        def post(self, path, body):
            assert len(body["jobs"]) == 3

        def get(self, path):
            if path == "/v1/runs":
                raise _Stop  # the schedule's rows are not this test's
            n = left[self.policy].pop(0) if len(left[self.policy]) > 1 else left[self.policy][0]
            return {"jobs": [{"id": i, "state": "running" if i < n else "done"}
                             for i in range(3)]}

    monkeypatch.setattr(demo, "start_broker", lambda *a, **k: _Proc())
    monkeypatch.setattr(demo, "BrokerClient", Client)
    clock = iter(range(0, 1000, 10))  # 10 s between polls: every poll prints its line
    monkeypatch.setattr(demo, "time", SimpleNamespace(monotonic=lambda: next(clock),
                                                      sleep=lambda s: None))
    assert len(load_job_file(workload_path("paper-jobset3"))) == 3
    with pytest.raises(_Stop):
        demo.compare_policies("paper-jobset3", progress=True)
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith("jobs still to finish: MARBLE 1 of 3, LSF way 3 of 3"), err
    assert err[-1].endswith("jobs still to finish: MARBLE 0 of 3, LSF way 0 of 3"), err
    assert not any("4" in line.split(":", 1)[1] for line in err), err
