"""Property-based fuzzing of the real API: whatever JSON arrives, the answer is never a 5xx,
and the daemon stays up with its state intact."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marbled.cli.client import _UnixConnection
from marbled.paths import socket_path

pytestmark = pytest.mark.daemon

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                  max_size=5),
    max_leaves=20,
)
FIELDS = st.fixed_dictionaries({}, optional={
    "command": st.one_of(st.text(max_size=20), st.lists(st.text(max_size=8), max_size=3), JSON),
    "emulate": st.one_of(st.booleans(), JSON),
    "model": st.one_of(st.sampled_from(["resnet-50", "vgg-16", "nope", ""]), JSON),
    "steps": st.one_of(st.integers(-5, 10**13), JSON),
    "gpus": st.one_of(st.sampled_from(["auto", 0, 1, 6, 7]), JSON),
    "after": st.one_of(st.lists(st.integers(-1, 5), max_size=3), st.text(max_size=5), JSON),
    "name": st.one_of(st.text(max_size=200), JSON),
    "chdir": st.one_of(st.sampled_from(["/", "/no/such/dir", "relative", "", "/\0"]),
                       st.text(max_size=20), JSON),
})


def request(daemon, method: str, path: str, body: bytes | None = None) -> int:
    conn = _UnixConnection(str(socket_path(daemon.state_dir)), timeout=10)
    try:
        conn.request(method, path, body=body,
                     headers={"Content-Type": "application/json"} if body is not None else {})
        resp = conn.getresponse()
        payload = resp.read()
        if resp.status >= 400:
            assert "error" in json.loads(payload)  # every refusal says what to fix
        return resp.status
    finally:
        conn.close()


@pytest.fixture(scope="module")
def fuzz_daemon(tmp_path_factory):
    from tests.conftest import start_daemon

    d = start_daemon(tmp_path_factory.mktemp("fuzz") / "state", "--gpus", "6")
    # Jobs that cannot start (6 GPUs held by a long rigid job) so nothing runs away.
    d.submit({"gpus": 6, "command": ["sleep", "600"], "name": "holder"})
    yield d
    assert d.proc.poll() is None, "the daemon died under fuzzing"
    assert d.query("PRAGMA integrity_check")[0][0] == "ok"
    d.stop()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.one_of(FIELDS, JSON, st.fixed_dictionaries({"jobs": st.lists(FIELDS,
                                                                              max_size=3)})))
def test_submit_never_answers_5xx(fuzz_daemon, body):
    status = request(fuzz_daemon, "POST", "/v1/jobs", json.dumps(body).encode())
    assert status < 500


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=200))
def test_raw_bytes_never_answer_5xx(fuzz_daemon, raw):
    assert request(fuzz_daemon, "POST", "/v1/jobs", raw) < 500


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
       path=st.sampled_from(["/v1/jobs/{}", "/v1/jobs/{}/cancel", "/v1/jobs/{}/suspend",
                             "/v1/jobs?state={}"]),
       arg=st.one_of(st.integers(-3, 10**20).map(str), st.text(
           alphabet=st.characters(min_codepoint=48, max_codepoint=122), max_size=12)))
def test_paths_never_answer_5xx(fuzz_daemon, method, path, arg):
    if arg == "1" and method == "POST":
        return  # do not cancel or suspend the holder job
    body = b"{}" if method in ("POST", "PUT") else None
    assert request(fuzz_daemon, method, path.format(arg), body) < 500


def test_openapi_describes_exactly_the_served_routes(fuzz_daemon):
    from marbled.api import dashboard
    from marbled.api.server import build_app
    from marbled.core.spec import JobSpec

    spec = fuzz_daemon.client.get("/v1/openapi.json")
    assert spec["openapi"].startswith("3.")
    described = {(path, method.upper()) for path, ops in spec["paths"].items() for method in ops}
    app = build_app(commands=None, views=None, on_shutdown=lambda: None)
    # the dashboard's static files (HTML, JS, CSS) are no part of the JSON API
    served = {(r.resource.canonical, r.method) for r in app.router.routes()
              if r.method != "HEAD" and r.name not in dashboard.ROUTES}
    assert described == served
    assert set(spec["components"]["schemas"]["Job"]["properties"]) == set(JobSpec.FIELDS)
