"""The API's contract: schemathesis, an outside fuzzer that reads only the served OpenAPI
document, runs every check against a live broker over its TCP listener with its token, and
finds no failure: no 5xx, every answer as documented, valid requests accepted and invalid ones
refused; the broker is alive afterwards with an intact database.

Nothing the fuzzer submits may run. A rigid job holds all 6 GPUs for the whole test, so every
generated job waits behind it; the broker runs with PATH set to an empty directory, so a
generated command would not be found anyway; POST /v1/shutdown is left out, and a hook turns
every cancel or suspend (any POST naming the holder's id) to another id, and cuts every
GET /v1/wait's wait (a long poll the holder would hold) to 0.1 s. At the end the holder's
run must be the only run the broker ever started.

Two things no document can list are which jobs exist and which directories: a job that
is not there (by id or name, in the path or in `after`, also an `after` id of the same
request that is not an earlier job) and a `chdir` that is not a directory are 404s, as
schemathesis takes them from valid requests, so generated requests go as generated (no hook
steers them). Everything else the broker refuses (400) must be refused by the document too
(it serves its own limits: GPUs, nodes, models; see docs/design.md "API"), and every answer,
error or not, must have its status and every field of its body in the document.

The run: schemathesis's CLI (`st run`) in a subprocess, every phase (coverage, fuzzing,
stateful), 25 examples per operation: about 1,000 requests in about 20 s on 2 cores
(MARBLE_CONTRACT_EXAMPLES=100: about 1,500 in 30 s; MARBLE_CONTRACT_EXAMPLES sets
the examples per operation, MARBLE_CONTRACT_SEED the seed; a failure prints the seed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import start_daemon

pytestmark = pytest.mark.daemon

schemathesis = pytest.importorskip("schemathesis", minversion="4.0")

EXAMPLES = int(os.environ.get("MARBLE_CONTRACT_EXAMPLES", "25"))
HOLDER = {"gpus": 6, "name": "holder",
          "command": [sys.executable, "-c", "import time; time.sleep(3600)"]}

# Loaded by schemathesis (SCHEMATHESIS_HOOKS), in its process.
HOOKS = textwrap.dedent('''
    """Keep the holder job holding its GPUs; cut the long poll's wait short; log every
    answer's status. Nothing else: every other generated request goes as generated, so
    every answer is one the document must describe."""
    import json
    import os
    import re
    from urllib.parse import quote, unquote

    import schemathesis

    HOLDER = int(os.environ["MARBLE_CONTRACT_HOLDER"])
    LOG = os.environ["MARBLE_CONTRACT_LOG"]
    ELSEWHERE = 10**9  # no job has this id


    def _names_holder(value) -> bool:
        """Could the server read the holder's id in `value` (also its digits in another
        script, percent-encoded, or inside a longer path)?"""
        text = unquote(unquote(str(value)))
        return any(int(run) == HOLDER for run in re.findall(r"\\d+", text))


    def _spare(value):
        """`value` with the holder's id made another, percent-encoded again: the decoded
        text may hold a '#' or '?', which sent raw would end the path."""
        if isinstance(value, int) and not isinstance(value, bool):
            return ELSEWHERE
        text = unquote(unquote(str(value)))
        return quote(re.sub(r"\\d+", lambda m: str(ELSEWHERE) if int(m.group()) == HOLDER
                            else m.group(), text), safe="")


    def _short_wait(case):
        """GET /v1/wait is a long poll that the holder (never ending) holds to its timeout:
        a timeout the document allows (or none: 30 s) is cut to 0.1 s, so that its
        examples do not take minutes; any other value goes as generated (its refusal is
        checked)."""
        if case.path != "/v1/wait":
            return
        query = case.query if case.query is not None else {}
        try:
            timeout = float(query.get("timeout", 30))
        except (TypeError, ValueError):
            return
        if 0.1 < timeout <= 300:
            query["timeout"] = 0.1
            case.query = query


    @schemathesis.hook
    def before_call(context, case, kwargs):
        """Safety, not steering: no generated request may cancel or suspend the holder
        (a job that ended would free the GPUs, and generated jobs would run). GETs go as
        generated: the holder's views, its run and log are answers to check too."""
        if case.method.upper() != "POST":
            _short_wait(case)
            return
        for name, value in list((case.path_parameters or {}).items()):
            if _names_holder(value):
                case.path_parameters[name] = _spare(value)


    @schemathesis.hook
    def after_call(context, case, response):
        with open(LOG, "a") as f:
            f.write(json.dumps([case.method, case.path, response.status_code]) + "\\n")
''')


# schemathesis's configuration: one status beside its defaults. POST /v1/jobs refuses a body
# over `max_request_bytes` unread, 413 as documented; a generated body of over
# `maxItems` jobs (schema-violating) can be that large. No other operation reads a body.
CONFIG = """
[[operations]]
include-path = "/v1/jobs"
include-method = "POST"
checks.negative_data_rejection.expected-statuses = [
    "400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]
"""


@pytest.fixture
def broker(tmp_path):
    no_commands = tmp_path / "empty-path"
    no_commands.mkdir()
    d = start_daemon(tmp_path / "state", "--listen", "127.0.0.1:0", "--prestart", "off",
                     env={"PATH": str(no_commands)})
    (holder,) = d.submit(HOLDER)
    d.wait_for(lambda: d.client.get(f"/v1/jobs/{holder['id']}")["state"] == "running",
               what="the holder to run")
    yield d, holder["id"]
    if d.proc.poll() is None:
        d.stop()


def test_schemathesis_finds_no_failure(broker, tmp_path):
    d, holder = broker
    url = (d.state_dir / "endpoint").read_text().strip()
    token = (d.state_dir / "token").read_text().strip()
    hooks, log = tmp_path / "hooks.py", tmp_path / "answers.jsonl"
    hooks.write_text(HOOKS)
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    seed = os.environ.get("MARBLE_CONTRACT_SEED")
    argv = [sys.executable, "-m", "schemathesis.cli", "--config-file",
            str(tmp_path / "schemathesis.toml"), "run", f"{url}/v1/openapi.json",
            "--checks", "all", "--header", f"Authorization: Bearer {token}",
            "--exclude-path", "/v1/shutdown",  # it would stop the broker
            "--max-examples", str(EXAMPLES), "--workers", "1", "--request-timeout", "30",
            "--generation-database", "none", "--no-color", *(["--seed", seed] if seed else [])]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": str(hooks), "MARBLE_CONTRACT_LOG": str(log),
           "MARBLE_CONTRACT_HOLDER": str(holder)}
    began = time.monotonic()
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    took = time.monotonic() - began
    # each line cut short: a failing request's curl line may carry a body of megabytes
    report = "\n".join(line[:3000] for line in done.stdout.splitlines())[-20_000:] + \
        done.stderr[-5_000:]

    answers = [json.loads(line) for line in log.read_text().splitlines()] \
        if log.exists() else []
    print(f"schemathesis: {len(answers)} requests in {took:.0f} s")
    assert done.returncode == 0, report
    # it did run, every operation (more examples than an operation's inputs allow are not
    # all sent: 300 per operation make about 3,000 requests, not 10 times as many)
    assert len(answers) > 10 * min(EXAMPLES, 25), report
    # (schemathesis leaves out the document's own path; /v1/shutdown is left out above)
    operations = {(method.upper(), path) for path, item in d.client.get(
        "/v1/openapi.json")["paths"].items() for method in item
        if path not in ("/v1/shutdown", "/v1/openapi.json")}
    assert operations - {(method, path) for method, path, _ in answers} == set(), report
    assert [a for a in answers if a[2] >= 500] == [], report
    assert d.proc.poll() is None, d.log()[-5000:]
    assert d.query("PRAGMA integrity_check")[0][0] == "ok"
    # nothing generated ever ran: the holder still holds the GPUs, and it is the only run
    assert d.client.get(f"/v1/jobs/{holder}")["state"] == "running"
    assert {r["job_id"] for r in d.runs()} == {holder}
