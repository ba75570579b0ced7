"""A job runs where it was submitted from, as sbatch's do: a real broker, the real `marble`
command run from a project directory outside the state directory, real training scripts
named by relative paths, and their checkpoints kept in the state directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_bad_input import post_job
from tests.scenarios import TRAIN, project

pytestmark = pytest.mark.daemon

def marble(daemon, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", *args], cwd=cwd,
                          env={**os.environ, "MARBLE_STATE_DIR": str(daemon.state_dir)},
                          capture_output=True, text=True, timeout=120)


def submitted(out: subprocess.CompletedProcess) -> list[int]:
    assert out.returncode == 0, out.stderr
    return [j["id"] for j in json.loads(out.stdout)["jobs"]]


def test_jobs_run_where_they_were_submitted_from(daemon, tmp_path):
    home = project(tmp_path / "home" / "project", "cifar")
    (home / "other").mkdir()
    (home / "other" / "data.txt").write_text("imagenet\n")
    (home / "other" / "train.py").write_text(TRAIN)
    sets = project(tmp_path / "sets", "mnist")
    (sets / "sub").mkdir()
    (sets / "sub" / "data.txt").write_text("svhn\n")
    (sets / "sub" / "train.py").write_text(TRAIN)
    (sets / "jobs.yaml").write_text(
        f"- {{command: {sys.executable} train.py, model: resnet-50, steps: 40}}\n"
        f"- {{command: {sys.executable} train.py, gpus: 1, steps: 30, chdir: sub}}\n")

    # `cd ~/project; marble submit ... -- python train.py`: a relative script
    (first,) = submitted(marble(daemon, "submit", "--model", "resnet-50", "--steps", "50",
                                "--json", "--", sys.executable, "train.py", cwd=home))
    (moved,) = submitted(marble(daemon, "submit", "--gpus", "1", "--steps", "20",
                                "--chdir", "other", "--json", "--", sys.executable, "train.py",
                                cwd=home))
    # a job file from anywhere: its jobs run in its directory, or their chdir read from it
    from_file = submitted(marble(daemon, "submit", "--file", str(sets / "jobs.yaml"), "--json",
                                 cwd=tmp_path))

    jobs = {j["id"]: j for j in daemon.wait_all(timeout=90)}
    assert {i: j["state"] for i, j in jobs.items()} == dict.fromkeys(jobs, "done"), \
        [(j["id"], j["reason"]) for j in jobs.values()]
    assert (home / "trained.txt").read_text() == f"cifar 50 {home}\n"
    assert (home / "other" / "trained.txt").read_text() == f"imagenet 20 {home / 'other'}\n"
    assert (sets / "trained.txt").read_text() == f"mnist 40 {sets}\n"
    assert (sets / "sub" / "trained.txt").read_text() == f"svhn 30 {sets / 'sub'}\n"
    # the job's own files stay in the state directory, none in the project
    assert json.loads((daemon.state_dir / "jobs" / str(first) / "checkpoint" / "step.json")
                      .read_text()) == {"step": 50}
    assert sorted(p.name for p in home.iterdir()) == ["data.txt", "other", "train.py",
                                                      "trained.txt"]

    shown = json.loads(marble(daemon, "show", str(first), "--json", cwd=tmp_path).stdout)
    assert shown["chdir"] == str(home)
    assert daemon.client.get(f"/v1/jobs/{moved}")["chdir"] == str(home / "other")
    assert [jobs[i]["chdir"] for i in from_file] == [str(sets), str(sets / "sub")]
    assert f"chdir:        {home}\n" in marble(daemon, "show", str(first), cwd=tmp_path).stdout


def test_a_suspended_job_resumes_in_its_directory(daemon, tmp_path):
    home = project(tmp_path / "project", "cifar")
    (job,) = submitted(marble(daemon, "submit", "--model", "resnet-50", "--steps", "400",
                              "--json", "--", sys.executable, "train.py", "0.02", cwd=home))
    daemon.wait_for(lambda: daemon.client.get(f"/v1/jobs/{job}")["step"] > 20,
                    what="the job to train")
    assert marble(daemon, "suspend", str(job), cwd=home).returncode == 0
    (done,) = daemon.wait_all(timeout=60)
    runs = daemon.query("SELECT end_reason, start_step FROM runs WHERE job_id = ? ORDER BY id",
                        job)
    assert [r["end_reason"] for r in runs] == ["suspended", "done"] and runs[1]["start_step"] > 0
    assert done["state"] == "done"
    assert (home / "trained.txt").read_text() == f"cifar 400 {home}\n"


def test_a_directory_a_job_cannot_run_in_is_refused(daemon, tmp_path):
    home = project(tmp_path / "project", "cifar")
    out = marble(daemon, "submit", "--gpus", "1", "--chdir", "nowhere", "--", "true", cwd=home)
    assert out.returncode == 2
    assert f"Invalid value for '--chdir': '{home / 'nowhere'}' does not exist" in out.stderr

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("- {command: 'true', gpus: 1}\n- {command: 'true', gpus: 1, chdir: gone}\n")
    out = marble(daemon, "submit", "--file", str(jobs), cwd=home)
    assert out.returncode == 1
    assert f"{jobs}:2: job 2: chdir: '{tmp_path / 'gone'}' does not exist" in out.stderr

    # a directory that is not there is a 404 (the request is well formed, as for an `after`
    # naming no job); a relative path is bad input (400), as the OpenAPI document says
    for chdir, code, says in (("/no/such/dir", 404, "'/no/such/dir' does not exist"),
                              ("project", 400, "'project' is not an absolute path")):
        status, body = post_job(daemon, {"command": ["true"], "gpus": 1, "chdir": chdir})
        assert (status, body["field"]) == (code, "chdir") and says in body["error"]
    assert daemon.jobs() == []


def test_a_job_whose_directory_is_gone_at_its_start_fails_saying_so(daemon, tmp_path):
    home = project(tmp_path / "project", "cifar")
    (holder,) = daemon.submit({"command": ["sleep", "2"], "gpus": 6})
    (job,) = submitted(marble(daemon, "submit", "--gpus", "1", "--after", str(holder["id"]),
                              "--json", "--", sys.executable, "train.py", cwd=home))
    for path in home.iterdir():
        path.unlink()
    home.rmdir()
    daemon.wait_all(timeout=30)
    shown = daemon.client.get(f"/v1/jobs/{job}")
    assert shown["state"] == "failed"
    detail = next(e["data"]["detail"] for e in shown["events"] if e["kind"] == "failed")
    assert detail == (f"could not start {sys.executable!r} in {home}: No such file or "
                      "directory (the job's directory)")
