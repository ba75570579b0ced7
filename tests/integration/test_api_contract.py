"""The API's contract: schemathesis, an outside fuzzer that reads only the served OpenAPI
document, runs every check against a live broker over its TCP listener with its token, and
finds no failure: no 5xx, every answer as documented, valid requests accepted and invalid ones
refused; the broker is alive afterwards with an intact database.

Nothing the fuzzer submits may run. A rigid job holds all 6 GPUs for the whole test, so every
generated job waits behind it; the broker runs with PATH set to an empty directory, so a
generated command would not be found anyway; POST /v1/shutdown is left out, and a hook turns
every cancel or suspend (any request naming the holder's id) to another id. At the end the
holder's run must be the only run the broker ever started.

Two things no document can list are which jobs exist and which directories: a generated
valid job's `after` (job ids or names) is pointed at the holder, as a client names jobs it
knows, and its `chdir` at an existing directory. Everything else the
broker refuses must be refused by the document too (it serves its own limits: GPUs, nodes,
models; see docs/design.md "API").

The run: schemathesis's CLI (`st run`) in a subprocess, every phase (coverage, fuzzing,
stateful), 25 examples per operation: about 750 requests in about 50 s on 2 cores
(MARBLE_CONTRACT_EXAMPLES=100: about 1,700 in 3 minutes; MARBLE_CONTRACT_EXAMPLES sets
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
    """Keep the holder job holding its GPUs; log every answer's status."""
    import json
    import os
    import re
    from urllib.parse import unquote

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
        if isinstance(value, int) and not isinstance(value, bool):
            return ELSEWHERE
        text = unquote(unquote(str(value)))
        return re.sub(r"\\d+", lambda m: str(ELSEWHERE) if int(m.group()) == HOLDER
                      else m.group(), text)


    def _earlier_jobs_only(job):
        """A valid job's `after` names earlier jobs, which the document cannot list: here
        the holder (the broker's job, by id or name)."""
        if isinstance(job, dict) and job.get("after") is not None:
            after = job["after"]
            refs = after if isinstance(after, list) else [after]
            refs = [HOLDER if isinstance(r, int) else "holder" for r in refs]
            job["after"] = refs if isinstance(after, list) else refs[0]


    def _existing_directory(job):
        """A valid job's `chdir` is a directory the client has: here the root."""
        if isinstance(job, dict) and job.get("chdir") is not None:
            job["chdir"] = "/"


    @schemathesis.hook
    def before_call(context, case, kwargs):
        for name, value in list((case.path_parameters or {}).items()):
            if _names_holder(value):
                case.path_parameters[name] = _spare(value)
        meta = case.meta
        positive = meta is None or meta.generation.mode.is_positive
        if positive and case.method.upper() == "POST" and case.path == "/v1/jobs" \\
                and isinstance(case.body, dict):
            jobs = case.body.get("jobs")
            for job in jobs if isinstance(jobs, list) else [case.body]:
                _earlier_jobs_only(job)
                _existing_directory(job)


    @schemathesis.hook
    def after_call(context, case, response):
        with open(LOG, "a") as f:
            f.write(json.dumps([case.method, case.path, response.status_code]) + "\\n")
''')


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
    seed = os.environ.get("MARBLE_CONTRACT_SEED")
    argv = [sys.executable, "-m", "schemathesis.cli", "run", f"{url}/v1/openapi.json",
            "--checks", "all", "--header", f"Authorization: Bearer {token}",
            "--exclude-path", "/v1/shutdown",  # it would stop the broker
            # The hook sends a request naming the holder to an id no job has; when the
            # stateful phase follows a value from a 201 that equals the holder's id (an
            # `after` the hook pointed at it), that is a 404 of our own making (ST302).
            "--exclude-checks", "ensure_resource_availability",
            "--max-examples", str(EXAMPLES), "--workers", "1", "--request-timeout", "30",
            "--generation-database", "none", "--no-color", *(["--seed", seed] if seed else [])]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": str(hooks), "MARBLE_CONTRACT_LOG": str(log),
           "MARBLE_CONTRACT_HOLDER": str(holder)}
    began = time.monotonic()
    done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    took = time.monotonic() - began
    report = done.stdout[-20_000:] + done.stderr[-5_000:]

    answers = [json.loads(line) for line in log.read_text().splitlines()] \
        if log.exists() else []
    print(f"schemathesis: {len(answers)} requests in {took:.0f} s")
    assert done.returncode == 0, report
    assert len(answers) > 10 * EXAMPLES, report  # it did run, every operation
    assert [a for a in answers if a[2] >= 500] == [], report
    assert d.proc.poll() is None, d.log()[-5000:]
    assert d.query("PRAGMA integrity_check")[0][0] == "ok"
    # nothing generated ever ran: the holder still holds the GPUs, and it is the only run
    assert d.client.get(f"/v1/jobs/{holder}")["state"] == "running"
    assert {r["job_id"] for r in d.runs()} == {holder}
