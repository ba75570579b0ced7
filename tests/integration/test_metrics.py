"""GET /metrics on a real broker (emulated GPUs, real processes, signals and SQLite), read
with prometheus_client's own text parser; the expected values come from the paper's
Figure 5 and from the broker's store, which records every run and event."""

from __future__ import annotations

import http.client
import json
from collections import Counter
from urllib.parse import urlsplit

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from marbled.cli.client import _UnixConnection
from marbled.paths import socket_path
from tests.scenarios import check_figure5, jobset

pytestmark = pytest.mark.daemon

FAMILIES = {"marbled_jobs_submitted", "marbled_runs_started", "marbled_runs_ended",
            "marbled_suspensions", "marbled_ack_latency_seconds", "marbled_decision_seconds",
            "marbled_api_errors", "marbled_jobs", "marbled_gpus", "marbled_moves_held",
            "marbled_store_writes_held"}
STATES = ("queued", "running", "suspending", "suspended", "done", "failed", "cancelled")


def _get(conn: http.client.HTTPConnection, path: str, headers: dict | None = None,
         method: str = "GET", body: bytes | None = None) -> tuple[int, str, str]:
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type", ""), resp.read().decode()
    finally:
        conn.close()


def _unix(daemon) -> http.client.HTTPConnection:
    return _UnixConnection(str(socket_path(daemon.state_dir)), timeout=10)


class Scrape:
    """One /metrics answer, parsed: every sample by name and labels."""

    def __init__(self, text: str):
        families = list(text_string_to_metric_families(text))
        self.names = {f.name for f in families}
        self.samples = {(s.name, frozenset(s.labels.items())): s.value
                        for f in families for s in f.samples}

    def __call__(self, name: str, **labels) -> float:
        # A labelled counter has no sample until it is first counted: that is a zero.
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def labelled(self, name: str, label: str) -> dict[str, float]:
        """The non-zero samples of `name` by one label (summed over the others)."""
        out: dict[str, float] = {}
        for (n, k), v in self.samples.items():
            if n == name and v:
                out[dict(k)[label]] = out.get(dict(k)[label], 0.0) + v
        return out


def scrape(daemon) -> Scrape:
    status, content_type, text = _get(_unix(daemon), "/metrics")
    assert status == 200, text
    assert content_type == CONTENT_TYPE_LATEST
    s = Scrape(text)
    assert s.names >= FAMILIES, FAMILIES - s.names
    return s


def _job(daemon, job_id: int) -> dict:
    return daemon.client.get(f"/v1/jobs/{job_id}")


def test_metrics_count_what_the_broker_did(daemon):
    (node,) = daemon.client.get("/v1/status")["nodes"]
    empty = scrape(daemon)
    assert empty("marbled_jobs_submitted_total") == 0
    assert empty("marbled_gpus", node=node, state="idle") == 6
    assert empty("marbled_gpus", node=node, state="busy") == 0
    assert empty.labelled("marbled_runs_started_total", "kind") == {}

    # Figure 5: one promotion (a SIGTSTP, an acknowledgement, a resume) at least.
    daemon.submit(*jobset(3))
    daemon.wait_all(timeout=90)
    check_figure5(daemon)

    # A long job: while it runs its GPUs are busy; then the user suspends it (MARBLE
    # resumes it at once: it is alone) and cancels it.
    (long,) = daemon.submit({"model": "resnet-50", "steps": 10**7, "emulate": True})
    job = daemon.wait_for(lambda: (j := _job(daemon, long["id"]))["state"] == "running"
                          and j["gpus"] and j, what="the long job to run")
    running = scrape(daemon)
    assert running("marbled_gpus", node=node, state="busy") == len(job["gpus"]) == 3
    assert running("marbled_gpus", node=node, state="idle") == 6 - len(job["gpus"])
    assert running.labelled("marbled_jobs", "state") == {"running": 1, "done": 3}
    daemon.wait_for(lambda: _job(daemon, long["id"])["step"] > 0, what="a first step")
    daemon.client.post(f"/v1/jobs/{long['id']}/suspend", {})
    daemon.wait_for(lambda: (j := _job(daemon, long["id"]))["suspensions"] == 1
                    and j["state"] == "running", what="the suspended job to resume")
    daemon.client.post(f"/v1/jobs/{long['id']}/cancel", {})
    daemon.wait_for(lambda: _job(daemon, long["id"])["state"] == "cancelled",
                    what="the cancel")

    s = scrape(daemon)
    assert s("marbled_jobs_submitted_total") == 4
    assert s.labelled("marbled_jobs", "state") == {"done": 3, "cancelled": 1}
    assert set(STATES) == {dict(k)["state"] for n, k in s.samples
                           if n == "marbled_jobs"}  # every state, zeros too
    assert s("marbled_gpus", node=node, state="busy") == 0
    assert s("marbled_gpus", node=node, state="idle") == 6

    # Runs: as the store has them, each job's first run "started", the others "resumed".
    runs = daemon.query("SELECT job_id, role, end_reason FROM runs ORDER BY job_id, id")
    seen: set[int] = set()
    started: Counter = Counter()
    for r in runs:
        started[("resumed" if r["job_id"] in seen else "started", r["role"])] += 1
        seen.add(r["job_id"])
    assert started[("resumed", "primary")] >= 2  # Inception-v3 promoted, the long job resumed
    for (kind, role), n in started.items():
        assert s("marbled_runs_started_total", kind=kind, role=role) == n, (kind, role)
    assert sum(s.labelled("marbled_runs_started_total", "kind").values()) == len(runs)
    ended = Counter(r["end_reason"] for r in runs)
    assert ended["cancelled"] == 1 and ended["done"] == 3
    assert s.labelled("marbled_runs_ended_total", "outcome") == dict(ended)

    # Suspensions: the promotions are the policy's, the one asked through the API the user's.
    asked = daemon.query("SELECT json_extract(data, '$.reason') AS reason FROM events "
                         "WHERE kind = 'suspend-requested'")
    by_user = sum(1 for e in asked if e["reason"] == "requested by the user")
    assert by_user == 1 and len(asked) - by_user >= 1
    assert s.labelled("marbled_suspensions_total", "reason") == {
        "policy": len(asked) - by_user, "user": 1}

    # Acknowledgement latency: one observation per acknowledged SIGTSTP that says when.
    acks = daemon.query("SELECT json_extract(data, '$.latency') AS latency FROM events "
                        "WHERE kind = 'acknowledged'")
    latencies = [a["latency"] for a in acks if a["latency"] is not None]
    assert len(latencies) >= 2
    assert s("marbled_ack_latency_seconds_count") == len(latencies)
    assert s("marbled_ack_latency_seconds_sum") == pytest.approx(sum(latencies))
    assert s("marbled_ack_latency_seconds_bucket", le="+Inf") == len(latencies)

    # Decisions: at least one per run started (several runs may start in one).
    decisions = s("marbled_decision_seconds_count")
    assert decisions >= len({r["job_id"] for r in runs})
    assert 0 < s("marbled_decision_seconds_sum") < decisions  # seconds, each well under one
    assert s("marbled_decision_seconds_bucket", le="+Inf") == decisions
    assert s.labelled("marbled_api_errors_total", "code") == {}


def test_metrics_over_tcp_need_the_token_and_errors_are_counted(daemon_factory):
    d = daemon_factory("--listen", "127.0.0.1:0")
    url = urlsplit((d.state_dir / "endpoint").read_text().strip())
    token = (d.state_dir / "token").read_text().strip()

    def tcp(headers: dict) -> tuple[int, str, str]:
        return _get(http.client.HTTPConnection(url.hostname, url.port, timeout=10),
                    "/metrics", headers)

    for headers in ({}, {"Authorization": "Bearer wrong"}):
        status, _, body = tcp(headers)
        assert status == 401 and "token" in json.loads(body)["error"]
    status, content_type, text = tcp({"Authorization": f"Bearer {token}"})
    assert (status, content_type) == (200, CONTENT_TYPE_LATEST)
    over_tcp = Scrape(text)
    assert over_tcp.names >= FAMILIES
    assert over_tcp.labelled("marbled_api_errors_total", "code") == {"401": 2}

    assert _get(_unix(d), "/v1/jobs/999")[0] == 404
    assert _get(_unix(d), "/v1/jobs", {"Content-Type": "application/json"}, "POST",
                b"{")[0] == 400
    s = scrape(d)
    assert s.labelled("marbled_api_errors_total", "code") == {"401": 2, "404": 1, "400": 1}
    assert s("marbled_jobs_submitted_total") == 0
    assert s.labelled("marbled_jobs", "state") == {}
