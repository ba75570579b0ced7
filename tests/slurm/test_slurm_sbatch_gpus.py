"""The stock batch script names no GPU count (`#SBATCH --exclusive`): unedited, on nodes of
any size, the broker gets every GPU of its node.

The cluster's nodes have MARBLE_SLURM_GPUS GPUs (6 by default). To see 4-GPU nodes, run
this file alone with 4 (the other Slurm tests ask for 6): the fixture's `cluster.sh up`
finds its configuration changed and restarts the cluster with 4 GPUs a node (ending the
cluster's running jobs); the next `up` without it brings back 6.

    MARBLE_SLURM_GPUS=4 .venv/bin/pytest tests/slurm/test_slurm_sbatch_gpus.py
"""

from __future__ import annotations

import re
import subprocess

from tests.scenarios import JOBS, JOBSET3_DONE
from tests.slurm.conftest import wait_slurm_job
from tests.slurm.test_slurm import _db, _sbatch


def _gpus_of(node: str) -> int:
    shown = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True,
                           text=True, check=True).stdout
    return int(re.search(r"\bGres=gpu:(?:[^:\s(]+:)?(\d+)", shown).group(1))


def test_marble_sbatch_uses_every_gpu_of_its_node_unedited(tmp_path, slurm_cluster):
    """Under --policy rigid every job runs on all the GPUs the broker has: every run's
    count is the node's, whatever the node's size."""
    job = _sbatch("marble.sbatch", tmp_path, opts="--policy rigid")
    assert wait_slurm_job(job, timeout=120) == "COMPLETED", \
        (tmp_path / f"slurm-{job}.out").read_text()
    assert _db(tmp_path, JOBS) == JOBSET3_DONE
    runs = _db(tmp_path, "SELECT node, gpu_count FROM runs")
    (node,) = {n for n, _ in runs}
    assert {count for _, count in runs} == {_gpus_of(node)}, runs
