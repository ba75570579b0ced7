"""One truth on a real broker (issue 24, items 2 and 4): a failed job shows in plain
`marble status`; and after a model's runs on 1 GPU and on 2, where 1 was faster, `marble
curves`, `marble status --json` (WANT) and `marble explain --json` give the same count and
reason, the job is brought back to 1 GPU, and no move is called a promotion.

The jobs of the second test are EMULATED training jobs (marbled.worker.emulate) whose true
curve comes from a profile the broker never sees: to the broker the model is unknown."""

from __future__ import annotations

import json
import sys

import pytest

from tests.integration.test_cli import run

pytestmark = pytest.mark.daemon

SLOWER_ON_MORE = [1000, 700, 600, 500]  # steps/s on 1..4 GPUs: fastest on 1


def test_a_failed_job_shows_in_plain_status(daemon_factory):
    d = daemon_factory("--no-learn", gpus=2)
    d.submit({"gpus": 1, "name": "broken", "command": ["sh", "-c", "echo boom >&2; exit 1"]},
             {"gpus": 1, "command": ["true"]})
    d.wait_all(timeout=30)
    table = run(d.state_dir, "status").stdout
    assert "job 1 (broken) failed: exited with code 1" in table, table
    assert "ended since the broker started: 1 failed, 1 done (marble status --all lists them" \
        in table, table
    doc = json.loads(run(d.state_dir, "status", "--json").stdout)
    assert doc["jobs"] == [] and doc["ended"] == {"done": 1, "failed": 1}
    assert [(j["id"], j["state"]) for j in doc["failed"]] == [(1, "failed")]
    assert "failed" not in run(d.state_dir, "status", "--all").stdout.split("\n")[-1]


def test_curves_status_and_explain_agree_after_a_doubling_that_did_not_pay(
        daemon_factory, tmp_path):
    truth = tmp_path / "truth.yaml"
    truth.write_text(f"system: truth\ngpus_per_node: 4\nmodels:\n"
                     f"  novel: {{steps_per_second: {SLOWER_ON_MORE}}}\n")
    d = daemon_factory("--learn-interval", "0.2", gpus=4, time_scale=1.0)
    (job,) = d.submit({"model": "novel", "steps": 200_000, "command": [
        sys.executable, "-m", "marbled.worker.emulate", "--profile", str(truth)]})
    assert job["demand"] == 1 and job["want"]["reason"] == "start"

    def back_on_one():
        runs = [r["gpu_count"] for r in d.runs() if r["job_id"] == job["id"]]
        (now,) = d.jobs()
        return runs[:2] == [1, 2] and len(runs) == 3 and now["state"] == "running" \
            and len(now["gpus"]) == 1 and runs
    assert d.wait_for(back_on_one, timeout=90, what="1 GPU, 2 GPUs, then 1 again") == [1, 2, 1]

    (novel,) = json.loads(run(d.state_dir, "curves", "novel", "--json").stdout)["models"]
    (listed,) = json.loads(run(d.state_dir, "status", "--json").stdout)["jobs"]
    reasons = json.loads(run(d.state_dir, "explain", str(job["id"]), "--json").stdout)["reasons"]
    assert novel["optimum"] == novel["next_count"] == listed["demand"] == 1
    assert novel["next_reason"] == listed["want"]
    assert listed["want"]["reason"] == "learned"
    assert f"it aims for {listed['want']['text']}" in reasons
    said = " ".join(reasons)
    assert "it was moved to explore its model's curve from 1 to 2 GPUs" in said
    assert "it was moved to its learned optimum from 2 to 1 GPU" in said
    assert "promot" not in said, reasons
    text = run(d.state_dir, "curves", "novel").stdout
    assert "novel: optimum 1 GPU (no profile), next run on 1 GPU: the fastest count its " \
           "runs measured" in text, text
    shown = run(d.state_dir, "show", str(job["id"])).stdout
    assert "want:         1 GPU: the fastest count its runs measured" in shown, shown
    assert "None" not in shown, shown
    run(d.state_dir, "cancel", str(job["id"]))


@pytest.mark.parametrize("policy", ["learned", "marble"])
def test_explain_gives_the_eta_status_gives(daemon_factory, policy):
    """A waiting job's `explain` names the next run to end with the ETA `status` shows for
    it (its own speed), not the policy's older expectation. Issue 31 saw 'in about 5 s'
    beside a status ETA of 13 s under learned. The jobs train at half their profile's
    speed (their time scale is twice the broker's), so the two would differ."""
    d = daemon_factory("--policy", policy, gpus=2, time_scale=0.05)
    slow = [sys.executable, "-m", "marbled.worker.emulate", "--time-scale", "0.1"]
    d.submit(*[{"model": "resnet-50", "steps": 1500, "gpus": 2, "command": slow}] * 2)

    def running_with_eta():
        jobs = d.jobs()
        return [j for j in jobs if j["state"] == "running" and j.get("eta_s")
                and j["step"] > 100]
    d.wait_for(running_with_eta, timeout=60, what="a running job's own ETA")
    (ahead,) = [j for j in json.loads(run(d.state_dir, "status", "--json").stdout)["jobs"]
                if j["state"] == "running"]
    (waiting,) = [j["id"] for j in d.jobs() if j["state"] == "queued"]
    reasons = json.loads(run(d.state_dir, "explain", str(waiting), "--json").stdout)["reasons"]
    (line,) = [r for r in reasons
               if r.startswith(f"the next run to end is job {ahead['id']}'s")] or [reasons]
    said = float(line.split("in about ")[1].split(" s")[0])
    assert abs(said - ahead["eta_s"]) <= 3, (line, ahead["eta_s"])
