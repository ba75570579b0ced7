"""`marble submit --file` of a job file larger than one request may carry (the broker's
MARBLE_MAX_REQUEST_BYTES lowered to 64 KiB): sent in several requests, every job once,
`after` names across the requests linked to the file's jobs, and a re-run after a chunk
was refused submitting only the rest."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.daemon

SMALL = {"MARBLE_MAX_REQUEST_BYTES": "65536"}


def marble(state_dir, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", *args],
                          env={**os.environ, "MARBLE_STATE_DIR": str(state_dir), **(env or {})},
                          capture_output=True, text=True, timeout=240)


def sweep(path, jobs: int, missing_at: int | None = None) -> None:
    """`jobs` jobs; the first is named 'base', the last runs after it; every tenth runs
    after the one before it; job `missing_at` (from 0) runs after 'prep', which no job of
    the file is."""
    lines = []
    for i in range(jobs):
        after = ["base"] if i == jobs - 1 else [f"s{i - 1}"] if i % 10 == 9 else []
        if i == missing_at:
            after.append("prep")
        lines.append(f"- {{name: {'base' if i == 0 else f's{i}'}, gpus: 1, "
                     f"command: [python, train.py, --lr, '0.01', --seed, '{i}']"
                     + (f", after: [{', '.join(after)}]" if after else "") + "}\n")
    path.write_text("".join(lines))


def by_name(daemon) -> dict[str, list]:
    rows = daemon.query("SELECT id, name FROM jobs ORDER BY id")
    out: dict[str, list] = {}
    for r in rows:
        out.setdefault(r["name"], []).append(r["id"])
    return out


def test_a_file_over_the_limit_goes_in_several_requests_with_its_dependencies(
        daemon_factory, tmp_path):
    daemon = daemon_factory(env=SMALL)
    status = daemon.client.get("/v1/status")
    assert status["max_request_bytes"] == 65536 and status["max_jobs_per_request"] == 10_000
    # a job named 'base' before the file's: the file's 'after: base' must not take it
    holder = daemon.submit({"gpus": 6, "command": ["sleep", "1000"], "name": "base"})[0]
    path = tmp_path / "sweep.yaml"
    sweep(path, 1500)
    assert path.stat().st_size > 65536
    out = marble(daemon.state_dir, "submit", "--file", str(path), "--json")
    assert out.returncode == 0, out.stderr
    accepted = json.loads(out.stdout)["jobs"]
    assert len(accepted) == 1500
    requests = daemon.query("SELECT COUNT(*) AS n FROM requests")[0]["n"]
    assert requests >= 3
    assert f"chunk {requests} of {requests} accepted: 1,500 of 1,500 jobs" in out.stderr
    names = by_name(daemon)
    assert names["base"] == [holder["id"], accepted[0]["id"]]
    assert all(len(ids) == 1 for name, ids in names.items() if name != "base")
    ids = {j["name"]: j["id"] for j in accepted}
    detail = {j["id"]: j for j in daemon.client.get("/v1/jobs")["jobs"]}
    for i in range(1, 1500):
        want = [ids["base"]] if i == 1499 else [ids[f"s{i - 1}" if i > 1 else "base"]] \
            if i % 10 == 9 else []
        assert detail[ids[f"s{i}"]]["after"] == want, i
    assert not list((daemon.state_dir / "submissions").glob("*"))  # done: nothing to resume


def test_a_re_run_after_a_refused_chunk_submits_only_the_rest(daemon_factory, tmp_path):
    daemon = daemon_factory(env=SMALL)
    daemon.submit({"gpus": 6, "command": ["sleep", "1000"], "name": "holder"})
    path = tmp_path / "sweep.yaml"
    sweep(path, 1500, missing_at=1200)  # in a later chunk: 'prep' does not exist yet
    out = marble(daemon.state_dir, "submit", "--file", str(path))
    assert out.returncode == 1
    assert "of 1,500 jobs (chunks 1-" in out.stderr and "failed: refused (404)" in out.stderr
    assert "job 1201: after: no job is named 'prep'" in out.stderr, out.stderr
    assert f"{path}:1201: " in out.stderr  # the file's line
    assert "run the same command again to submit the rest" in out.stderr
    before = len(by_name(daemon)) - 1
    assert 0 < before < 1200
    prep = marble(daemon.state_dir, "submit", "--gpus", "1", "--name", "prep", "--", "true")
    assert prep.returncode == 0, prep.stderr
    # an edit in a chunk the broker accepted: refused before anything is sent
    edited = path.read_text().replace("--seed, '5']", "--seed, '55']", 1)
    original = path.read_text()
    path.write_text(edited)
    out = marble(daemon.state_dir, "submit", "--file", str(path))
    assert out.returncode == 1 and "chunk 1 of " in out.stderr and "remove " in out.stderr
    assert len(by_name(daemon)) - 2 == before
    # the same command again, from a shell with another environment (sent with the jobs)
    path.write_text(original)
    out = marble(daemon.state_dir, "submit", "--file", str(path), "--json",
                 env={"MARBLE_TEST_OTHER_SHELL": "1"})
    assert out.returncode == 0, out.stderr
    assert "chunk 1 of" in out.stderr and "accepted before (jobs 2-" in out.stderr
    accepted = json.loads(out.stdout)["jobs"]
    assert len(accepted) == 1500
    names = by_name(daemon)
    assert len(names) == 1 + 1 + 1500 and all(len(ids) == 1 for ids in names.values())
    # submitted once more, once done: new jobs, as a small file's are
    out = marble(daemon.state_dir, "submit", "--file", str(path), "--json")
    assert out.returncode == 0, out.stderr
    assert len(daemon.query("SELECT id FROM jobs")) == 2 + 3000
