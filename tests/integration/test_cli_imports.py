"""`marble`'s everyday commands import what they print with and the small client, not the
broker's checks or its dependencies: `marble submit` in a shell loop of a thousand jobs pays
for each import a thousand times, and the broker checks every job again anyway (issue "a
broker that is never the bottleneck"). Each command runs to its end against a real broker
(its text printed, its refusals said), in a fresh interpreter that then lists its modules."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.daemon

# What the fast commands must never import: the job's checks and the profiles (the
# broker's), the simulator's model and learning, the broker's dependencies, and `secrets`
# (hmac and random with it: 3 ms of a 50 ms submit, for one idempotency key), and
# `hashlib` (OpenSSL's: 2.3 ms, for the environment's digest, which only the broker makes)
HEAVY = ("marbled.core.spec", "marbled.core.profiles", "marbled.core.model",
         "marbled.core.target", "marbled.core.learning", "marbled.cli.offline_api",
         "aiohttp", "sqlalchemy", "yaml", "numpy", "secrets", "hashlib")

RUN = """
import json, sys
from marbled.cli.client_cmd import main
try:
    main(sys.argv[2:], prog_name="marble")
except SystemExit as exc:
    code = exc.code
with open(sys.argv[1], "w") as out:
    json.dump({"code": code, "modules": sorted(sys.modules)}, out)
"""
# as the `marble` console script runs: its quick path for submit first (quick.py)
SCRIPT = """
import json, sys
from marbled.cli.entry import marble
record, sys.argv = sys.argv[1], ["marble", *sys.argv[2:]]
try:
    marble()
except SystemExit as exc:
    code = exc.code
with open(record, "w") as out:
    json.dump({"code": code, "modules": sorted(sys.modules)}, out)
"""


def marble(daemon, tmp_path, *args: str, run: str = RUN) -> tuple[int, list[str], str]:
    """Run `marble ARGS` in a new interpreter: its exit code, modules and output."""
    record = tmp_path / "modules.json"
    done = subprocess.run([sys.executable, "-c", run, str(record), *args],
                          env={**os.environ, "MARBLE_STATE_DIR": str(daemon.state_dir)},
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and record.exists(), done.stderr
    doc = json.loads(record.read_text())
    said = done.stdout + (f"[stderr]\n{done.stderr}" if done.stderr else "")  # which is which
    return doc["code"], doc["modules"], said


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m in HEAVY or m.split(".")[0] in HEAVY]


# each command in turn on one broker: what it is given, its exit code, what it says
COMMANDS = [
    (("submit", "--gpus", "1", "--", "true"), 0, "submitted job 1: 1 GPU (fixed)"),
    # the broker's note on a model no profile knows; its refusal said as the option's
    (("submit", "--model", "resnt-50", "--steps", "100", "--", "sleep", "30"), 0,
     "did you mean resnet-50?"),
    (("submit", "--gpus", "1", "--steps", "0", "--", "true"), 2,
     "--steps: must be a whole number"),
    (("status", "--all"), 0, " done "),
    (("status",), 0, "ended since the broker started: 1 done"),
    (("wait", "1"), 0, "1/1 ended  done=1"),
    (("show", "2"), 0, "resnt-50"),
    (("logs", "1"), 0, ""),
    (("cancel", "2"), 0, "cancel requested for job 2"),
]


def test_the_fast_commands_import_only_what_they_print_with(daemon, tmp_path):
    for args, code, says in COMMANDS:
        if args[0] == "status":  # with job 1 ended
            daemon.wait_for(lambda: daemon.jobs()[0]["state"] == "done", what="job 1 done")
        exit_code, modules, said = marble(daemon, tmp_path, *args)
        assert exit_code == code and says in said, (args, said)
        assert heavy(modules) == [], f"marble {' '.join(args)} imports {heavy(modules)}"


# the same submissions through the quick path and through click's command: what each says
# and exits with; a refusal goes from the quick path to click's command, which sends it
# again with the same Idempotency-Key and says it
SUBMISSIONS = [
    ("submit", "--gpus", "1", "--", "true"),
    ("--json", "submit", "--gpus", "1", "--name", "n", "--", "true"),
    ("submit", "--model", "resnt-50", "--steps", "100", "--after", "n", "--", "true"),
    ("submit", "--emulate", "--model", "resnet-50", "--steps", "40", "--retries", "2"),
    ("submit", "--gpus", "1", "--steps", "0", "--", "true"),
    ("submit", "--gpus", "99", "--", "true"),
    ("submit", "--after", "nobody", "--", "true"),
    ("submit", "--export", "NONE,SLURM_JOB_ID=1", "--", "true"),
    ("submit", "--gpus", "1", "--chdir", ".", "--", "true"),
]


def test_the_quick_path_says_what_click_says(daemon, tmp_path):
    """Each submission through the `marble` script (quick path) and through click's command
    alone: the same exit status and text but for the job ids, the same jobs made (one
    each, none for a refusal); the quick path imports no click where it submits."""
    import re

    def said(text: str) -> str:
        return re.sub(r"job \d+|\"(id|after|submitted_at|step|chdir)\": [^,\n]+", "X", text)

    for args in SUBMISSIONS:
        before = len(daemon.jobs())
        results = []
        for run in (SCRIPT, RUN):
            code, modules, text = marble(daemon, tmp_path, *args, run=run)
            results.append((code, said(text)))
            if run is SCRIPT and code == 0 and "--chdir" not in args:
                assert "click" not in modules, f"marble {' '.join(args)} imported click"
        assert results[0] == results[1], args
        made = len(daemon.jobs()) - before
        assert made == (2 if results[0][0] == 0 else 0), (args, made)


def test_quick_status_says_what_click_says(daemon, tmp_path):
    """`marble status` through the script (its quick path) and click's command alone, on
    the same jobs: the same text and JSON but for the times that move between two calls;
    the quick path imports no click; with the broker stopped, the script's status reads
    its records as click's command does."""
    import re

    daemon.submit({"command": ["sleep", "30"], "gpus": 1, "name": "long"},
                  {"command": ["true"], "gpus": 1}, {"command": ["false"], "gpus": 1})
    daemon.wait_for(lambda: sum(j["state"] in ("done", "failed") for j in daemon.jobs()) == 2,
                    what="two jobs ended")

    def said(text: str) -> str:  # durations and timestamps move between the two calls
        return re.sub(r"~?\d+[smhd](\d+[smhd])?|\d+\.\d+", "T", text)

    for args in (("status",), ("status", "--all"), ("--json", "status", "--limit", "1")):
        quick_code, modules, quick = marble(daemon, tmp_path, *args, run=SCRIPT)
        click_code, _, clicked = marble(daemon, tmp_path, *args, run=RUN)
        assert (quick_code, said(quick)) == (click_code, said(clicked)), args
        assert "click" not in modules, f"marble {' '.join(args)} imported click"
    assert "long" in quick and "failed" in quick
    daemon.stop()  # a stopped broker's records: the quick path leaves them to click's command
    (quick_code, _, quick), (click_code, _, clicked) = (
        marble(daemon, tmp_path, "status", "--all", run=run) for run in (SCRIPT, RUN))
    assert (quick_code, said(quick)) == (click_code, said(clicked))
    assert "no broker is running" in quick and "long" in quick, quick


def test_quick_logs_says_what_click_says(daemon, tmp_path):
    """`marble logs` through the script (its quick path) and click's command alone: the
    same output and exit status for ids, names, streams, runs and JSON, and for a name or
    id no job has (said by click's command); the quick path imports no click."""
    daemon.submit({"command": ["sh", "-c", "seq 1 5; echo oops >&2"], "gpus": 1,
                   "name": "counter"},
                  {"command": ["sh", "-c", "exit 3"], "gpus": 1})
    daemon.wait_for(lambda: all(j["state"] in ("done", "failed") for j in daemon.jobs()),
                    what="both jobs ended")
    for args in (("logs", "1"), ("logs", "counter"), ("logs", "--stderr", "1"),
                 ("logs", "-n", "2", "--all-runs", "1"), ("--json", "logs", "1"),
                 ("logs", "2"), ("logs", "nobody"), ("logs", "99")):
        quick_code, modules, quick = marble(daemon, tmp_path, *args, run=SCRIPT)
        click_code, _, clicked = marble(daemon, tmp_path, *args, run=RUN)
        assert (quick_code, quick) == (click_code, clicked), args
        if quick_code == 0:
            assert "click" not in modules, f"marble {' '.join(args)} imported click"
    assert marble(daemon, tmp_path, "logs", "counter", run=SCRIPT)[2] == "1\n2\n3\n4\n5\n"


def test_quick_cancel_says_what_click_says(daemon, tmp_path):
    """`marble cancel` through the script (its quick path) and click's command alone, on
    jobs in the same states: the same output and exit status, ids and names, refusals
    (a name no job has, an id no job has) among them; the quick path imports no click."""
    holder = {"command": ["sleep", "60"], "gpus": 6}
    daemon.submit(holder, *({"command": ["true"], "gpus": 1, "name": f"n{i}"}
                            for i in range(2, 6)))  # ids 2-5, named n2-n5, stay queued
    said = []
    for path, (by_id, by_name) in ((SCRIPT, (2, 3)), (RUN, (4, 5))):
        code, modules, text = marble(daemon, tmp_path, "cancel", str(by_id), f"n{by_name}",
                                     "nobody", "99", run=path)
        said.append((code, text.replace(f"job {by_id}", "job A").replace(f"job {by_name}",
                                                                          "job B")))
        if path is SCRIPT:
            assert "click" not in modules
    assert said[0] == said[1] and said[0][0] == 1, said
    assert "cancel requested for job B" in said[0][1] and "no job is named 'nobody'" in said[0][1]
    states = {j["id"]: j["state"] for j in daemon.jobs()}
    assert [states[i] for i in (2, 3, 4, 5)] == ["cancelled"] * 4, states
