"""The optional TCP listener (marbled --listen): only requests with the allocation's token.

A real broker on a real TCP socket (127.0.0.1); the socket's own access rule
(SO_PEERCRED) is tested in test_bad_input.py.
"""

from __future__ import annotations

import http.client
import json
import os
import stat
import subprocess
import sys
from urllib.parse import urlsplit

import pytest

from marbled.cli.client import ApiError, BrokerClient

pytestmark = pytest.mark.daemon


def _raw(url: str, method: str, path: str, headers: dict, body: dict | None = None):
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={**headers,
                                                   "Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read() or b"{}")


@pytest.fixture
def listening(daemon_factory):
    d = daemon_factory("--listen", "127.0.0.1:0")
    url = (d.state_dir / "endpoint").read_text().strip()
    token_file = d.state_dir / "token"
    return d, url, token_file


def test_token_is_private_to_the_user_and_changes_with_every_start(listening,
                                                                   daemon_factory):
    d, _, token_file = listening
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    first = token_file.read_text().strip()
    assert len(first) >= 40
    d.stop()
    assert not token_file.exists()  # gone with the broker
    daemon_factory("--listen", "127.0.0.1:0", state_dir=d.state_dir)
    assert token_file.read_text().strip() != first


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"},
])
def test_requests_without_the_right_token_are_refused(listening, headers):
    d, url, _ = listening
    for method, path, body in (("GET", "/v1/status", None), ("GET", "/v1/jobs", None),
                               ("POST", "/v1/jobs", {"gpus": 1, "command": ["true"]}),
                               ("POST", "/v1/shutdown", {})):
        status, doc = _raw(url, method, path, headers, body)
        assert status == 401 and "token" in doc["error"]
    assert d.jobs() == [] and d.proc.poll() is None  # nothing submitted, nothing stopped


def test_the_token_lets_a_client_on_another_node_submit_and_watch(listening):
    d, url, token_file = listening
    client = BrokerClient(url=url, token=token_file.read_text().strip())
    (job,) = client.post("/v1/jobs", {"gpus": 1, "command": ["true"]})["jobs"]
    assert client.get(f"/v1/jobs/{job['id']}")["id"] == job["id"]
    with pytest.raises(ApiError) as err:
        BrokerClient(url=url, token="x" * 43).get("/v1/status")
    assert err.value.status == 401
    # the CLI, as on another node: the URL and the token from the environment
    env = {**os.environ, "MARBLE_URL": url, "MARBLE_TOKEN": token_file.read_text().strip()}
    env.pop("MARBLE_STATE_DIR", None)
    out = subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", "--state-dir",
                          "/nonexistent", "status", "--all", "--json"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert [j["id"] for j in json.loads(out.stdout)["jobs"]] == [job["id"]]


def test_without_listen_there_is_no_token_and_no_tcp(daemon):
    assert not (daemon.state_dir / "token").exists()
    assert not (daemon.state_dir / "endpoint").exists()
