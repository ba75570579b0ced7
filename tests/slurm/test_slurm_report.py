"""`marble report --slurm` on the state file of a broker whose runs were real job steps.

This cluster keeps no accounting (AccountingStorageType=accounting_storage/none), so the
report must say so, through pyslurm and through the commands. The join itself is then
shown against a stand-in `sacct` and `scontrol` (sample output of a cluster with
accounting, not this one's) on the same real state file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from marbled.paths import DB_NAME
from tests.slurm.conftest import PYSLURM_LIB, with_pythonpath
from tests.slurm.test_slurm import ONE_NODE, _broker, _placed

pytestmark = pytest.mark.slurm

NOT_ENABLED = ("Slurm accounting is not enabled on this cluster "
               "(AccountingStorageType=accounting_storage/none)")


def _report(db: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "marbled.cli.client_cmd", "report", "--slurm",
                           "--db", str(db), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr
    return done


def _standins(where: Path, job: str, step: str) -> dict[str, str]:
    """`scontrol show config` saying slurmdbd, and a `sacct` printing a sample record of the
    step (Slurm killed it out of memory) and writing its arguments beside it."""
    where.mkdir()
    scontrol = shutil.which("scontrol")
    (where / "scontrol").write_text(
        '#!/bin/sh\n[ "$1 $2" = "show config" ] && '
        'echo "AccountingStorageType   = accounting_storage/slurmdbd" && exit 0\n'
        f'exec {scontrol} "$@"\n')
    (where / "sacct").write_text(
        f'#!/bin/sh\necho "$@" > {where}/sacct.args\n'
        'echo "JobID|State|ExitCode|Elapsed|TotalCPU|MaxRSS"\n'
        f'echo "{job}|RUNNING|0:0|00:01:00|00:00:00|"\n'
        f'echo "{job}.{step}|OUT_OF_MEMORY|0:125|00:00:41|00:39.870|8388608K"\n')
    for name in ("scontrol", "sacct"):
        (where / name).chmod(0o755)
    return {"PATH": f"{where}{os.pathsep}{os.environ['PATH']}"}


def test_report_slurm_says_this_cluster_keeps_no_accounting(daemon_factory, allocate,
                                                            slurm_api, tmp_path):
    job = allocate(*ONE_NODE)
    d = _broker(daemon_factory, job)
    d.submit({"model": "resnet-50", "steps": 50, "emulate": True})
    (done,) = d.wait_all(timeout=60)
    assert done["state"] == "done"
    ((run_id, placed),) = _placed(d).items()
    assert placed["slurm_job"] == job  # the placed event names the step's job
    step = f"{job}.{placed['step']}"
    db = d.state_dir / DB_NAME
    env = with_pythonpath(PYSLURM_LIB) if slurm_api == "pyslurm" else {}

    text = _report(db, env=env).stdout
    assert NOT_ENABLED in text
    assert step in text  # the broker's side is still listed, for staff to look up
    doc = json.loads(_report(db, "--json", env=env).stdout)
    assert doc["accounting"]["enabled"] is False
    assert doc["accounting"]["note"] in text and NOT_ENABLED in doc["accounting"]["note"]
    assert doc["accounting"]["source"] == ("pyslurm" if slurm_api == "pyslurm"
                                           else "scontrol show config")
    (row,) = doc["rows"]
    assert (row["run_id"], row["slurm_step"], row["outcome"], row["slurm_state"]) == \
        (run_id, step, "done", None)

    if slurm_api == "cli":  # the join, against sample accounting of this very step
        standin = _standins(tmp_path / "standin", job, placed["step"])
        doc = json.loads(_report(db, "--json", env=standin).stdout)
        assert doc["accounting"] == {
            "enabled": True, "source": "sacct",
            "note": "Slurm's accounting (accounting_storage/slurmdbd) read through sacct"}
        (row,) = doc["rows"]
        assert (row["slurm_state"], row["slurm_exit"], row["elapsed_s"], row["cpu_s"],
                row["max_rss_mib"]) == ("OUT_OF_MEMORY", "0:125", 41.0, 39.87, 8192.0)
        assert row["disagrees"] == "broker: done, Slurm: OUT_OF_MEMORY"
        args = (tmp_path / "standin" / "sacct.args").read_text().split()
        assert args[-2:] == ["-j", job] and "--parsable2" in args
        text = _report(db, env=standin).stdout
        assert "1 run(s) where Slurm's record disagrees with the broker's" in text
