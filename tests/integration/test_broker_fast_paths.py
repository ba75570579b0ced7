"""The broker's fast paths keep their guarantees: a group commit sends a job's 201 only once
the job is durable (kill -9 right after some answers: every job answered is in the store),
and GET /v1/jobs pages (limit, after, state) cover the FIFO exactly, as `marble status` uses
them."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from marbled.cli.client import ApiError, BrokerClient, BrokerUnreachable
from marbled.paths import DB_NAME, socket_path
from tests.conftest import kill_left_runs, start_daemon

pytestmark = pytest.mark.daemon

HOLDER = {"gpus": 6, "command": ["sleep", "600"], "name": "holder"}


def test_every_job_answered_201_survives_a_kill_during_concurrent_submissions(tmp_path):
    """20 clients submit one job per request (each named); the broker is killed with SIGKILL
    once some 201s have come back. Every name answered 201 is in the store, with its
    'submitted' event, and the store is intact; a new broker on it starts and knows them."""
    for attempt in range(3):  # three kills at different moments
        state = tmp_path / f"state{attempt}"
        d = start_daemon(state)
        d.submit(HOLDER)
        answered: list[tuple[int, str]] = []
        lock = threading.Lock()
        stop = threading.Event()

        def submit(k: int, d=d, answered=answered, stop=stop, lock=lock) -> None:
            client = BrokerClient(socket_path(d.state_dir), timeout=10)
            for i in range(10_000):
                if stop.is_set():
                    return
                name = f"c{k}-{i}"
                try:
                    (job,) = client.post("/v1/jobs", {"gpus": 1, "command": ["true"],
                                                      "name": name})["jobs"]
                except (OSError, ApiError, BrokerUnreachable, ValueError):
                    return  # the broker is gone: this job was never answered
                with lock:
                    answered.append((job["id"], name))

        threads = [threading.Thread(target=submit, args=(k,)) for k in range(20)]
        for t in threads:
            t.start()
        target = 200 * (attempt + 1)
        deadline = time.monotonic() + 60
        while len(answered) < target and time.monotonic() < deadline:
            time.sleep(0.005)
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(timeout=30)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert len(answered) >= target, "the clients got too few answers before the kill"

        con = sqlite3.connect(state / DB_NAME)
        stored = dict(con.execute("SELECT id, name FROM jobs"))
        submitted = {i for (i,) in con.execute(
            "SELECT job_id FROM events WHERE kind = 'submitted'")}
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        con.close()
        lost = [(i, n) for i, n in answered if stored.get(i) != n]
        assert not lost, f"answered 201 but not in the store: {lost[:5]}"
        assert {i for i, _ in answered} <= submitted
        assert set(stored) == submitted  # every stored job has its event, and no more

        again = start_daemon(state)
        try:
            listed = {j["id"]: j["name"] for j in again.jobs()}
            assert all(listed.get(i) == n for i, n in answered)
        finally:
            again.stop(signal.SIGKILL)
            kill_left_runs(state)  # the holder, which outlives two kills


def test_pages_cover_the_fifo_and_filter_by_the_state_shown(daemon):
    daemon.submit(HOLDER)
    daemon.wait_for(lambda: daemon.jobs()[0]["state"] == "running", what="the holder runs")
    daemon.client.post("/v1/jobs", {"jobs": [{"gpus": 1, "command": ["true"],
                                              "name": f"q{i}"} for i in range(25)]})
    daemon.client.post("/v1/jobs/5/cancel")
    every = daemon.client.get("/v1/jobs")
    assert [j["id"] for j in every["jobs"]] == list(range(1, 27)) and every["next"] is None

    seen, after = [], 0
    while True:
        page = daemon.client.get(f"/v1/jobs?limit=7&after={after}")
        assert len(page["jobs"]) <= 7
        seen += [j["id"] for j in page["jobs"]]
        if page["next"] is None:
            break
        assert page["next"] == page["jobs"][-1]["id"]
        after = page["next"]
    assert seen == list(range(1, 27))

    queued = daemon.client.get("/v1/jobs?state=queued&limit=10")
    assert [j["id"] for j in queued["jobs"]] == [2, 3, 4, *range(6, 13)]
    assert queued["next"] == 12
    rest = daemon.client.get("/v1/jobs?state=queued&after=12")
    assert [j["id"] for j in rest["jobs"]] == list(range(13, 27)) and rest["next"] is None
    both = daemon.client.get("/v1/jobs?state=running&state=cancelled")
    assert [(j["id"], j["state"]) for j in both["jobs"]] == [(1, "running"), (5, "cancelled")]
    last = daemon.client.get("/v1/jobs?limit=1&after=25")
    assert [j["id"] for j in last["jobs"]] == [26] and last["next"] is None

    for bad in ("limit=0", "limit=x", "limit=-1", "after=-1", "after=1.5", "state=nope",
                "limit=10001"):
        with pytest.raises(ApiError) as refused:
            daemon.client.get(f"/v1/jobs?{bad}")
        assert refused.value.status == 400, bad

    marble = [sys.executable, "-m", "marbled.cli.client_cmd", "--state-dir",
              str(daemon.state_dir), "status"]
    shown = subprocess.run([*marble, "--limit", "5"], capture_output=True, text=True,
                           check=True).stdout
    rows = [line.split()[0] for line in shown.splitlines()[2:] if line.split()[0].isdigit()]
    assert rows == ["1", "2", "3", "4", "6"]
    assert "... and 20 more (" in shown and "--limit 0" in shown
    doc = json.loads(subprocess.run([*marble, "--json"], capture_output=True, text=True,
                                    check=True).stdout)
    assert [j["id"] for j in doc["jobs"]] == [1, 2, 3, 4, *range(6, 27)] and doc["more"] == 0
    doc = json.loads(subprocess.run([*marble, "--all", "--json"], capture_output=True,
                                    text=True, check=True).stdout)
    assert [j["id"] for j in doc["jobs"]] == list(range(1, 27))


def test_since_windows_jobs_and_runs_on_what_is_live_and_what_ended_after(daemon, tmp_path):
    """The dashboard's window (?since=T): unfinished jobs and open runs always, ended ones
    only if they ended at T or later; the same from the store when no broker runs."""
    daemon.client.post("/v1/jobs", {"jobs": [{"gpus": 1, "command": ["true"]}] * 5})
    daemon.wait_for(lambda: all(j["state"] == "done" for j in daemon.jobs()),
                    what="the first five done")
    cut = time.time()
    time.sleep(0.05)
    daemon.client.post("/v1/jobs", {"jobs": [{"gpus": 1, "command": ["true"]},
                                             {"gpus": 1, "command": ["sleep", "30"]}]})
    daemon.wait_for(lambda: [j["state"] for j in daemon.jobs()][5:] == ["done", "running"],
                    what="job 6 done and job 7 running")
    jobs = daemon.client.get(f"/v1/jobs?since={cut}")
    assert [(j["id"], j["state"]) for j in jobs["jobs"]] == [(6, "done"), (7, "running")]
    runs = daemon.client.get(f"/v1/runs?since={cut}")
    assert [(r["job_id"], r["ended_at"] is None) for r in runs["runs"]] == [
        (6, False), (7, True)]
    assert runs["since"] == cut
    assert len(daemon.client.get("/v1/runs")["runs"]) == 7  # no window: every run
    assert [j["id"] for j in daemon.client.get(f"/v1/jobs?since={time.time() + 60}")[
        "jobs"]] == [7]  # the future: what is unfinished
    page = daemon.client.get(f"/v1/jobs?since={cut}&state=done&limit=1")
    assert [j["id"] for j in page["jobs"]] == [6] and page["next"] is None
    for bad in ("since=-1", "since=x", "since=nan", "since=inf", "since=1e12"):
        for route in ("jobs", "runs"):
            with pytest.raises(ApiError) as refused:
                daemon.client.get(f"/v1/{route}?{bad}")
            assert refused.value.status == 400 and refused.value.field == "since", bad
            assert "Unix time" in str(refused.value)
    daemon.client.post("/v1/jobs/7/cancel")
    daemon.wait_for(lambda: daemon.jobs()[6]["state"] == "cancelled", what="job 7 cancelled")
    daemon.stop()
    from marbled.cli.offline_api import OfflineApi

    offline = OfflineApi(daemon.state_dir)  # no broker: the store answers the same
    assert [j["id"] for j in offline.get(f"/v1/jobs?since={cut}")["jobs"]] == [6, 7]
    assert [r["job_id"] for r in offline.get(f"/v1/runs?since={cut}")["runs"]] == [6, 7]
    assert len(offline.get(f"/v1/runs?since={time.time() + 60}")["runs"]) == 0
