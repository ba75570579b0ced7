"""Reading an allocation from `scontrol show job -d` text, and the srun command lines.

The texts are what Slurm 22.05 printed on the test cluster (tests/slurm/cluster.sh);
the Slurm tier checks the same functions against the live cluster.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from marbled.batch.base import AllocationError
from marbled.batch.slurm import parse_scontrol_job, srun_argv
from marbled.batch.supervise import step_exit_code as exit_code

TWO_NODES = """\
JobId=1 JobName=interactive
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   RunTime=00:00:00 TimeLimit=00:05:00 TimeMin=N/A
   StartTime=2026-11-22T03:00:36 EndTime=2026-11-22T03:05:36 Deadline=N/A
   NodeList=n[1-2]
   BatchHost=n1
   NumNodes=2 NumCPUs=8 NumTasks=2 CPUs/Task=4 ReqB:S:C:T=0:0:*:*
   JOB_GRES=gpu:12
     Nodes=n[1-2] CPU_IDs=0-3 Mem=0 GRES=gpu:6(IDX:0-5)
   MinCPUsNode=4 MinMemoryNode=0 MinTmpDiskNode=0
   TresPerNode=gres:gpu:6
"""

MIXED = """\
JobId=77 JobName=train
   JobState=RUNNING Reason=None Dependency=(null)
   RunTime=00:01:00 TimeLimit=UNLIMITED TimeMin=N/A
   StartTime=2026-11-22T03:00:36 EndTime=Unknown Deadline=N/A
   NodeList=gpu[01-02],cpu7
   BatchHost=gpu01
     Nodes=gpu01 CPU_IDs=0-5,12 Mem=0 GRES=gpu:v100:4(IDX:0-1,4-5)
     Nodes=gpu02 CPU_IDs=0-1 Mem=0 GRES=gpu:v100:2(IDX:3,7)
     Nodes=cpu7 CPU_IDs=0 Mem=0
"""


def _expand(hostlist: str) -> list[str]:
    return {"n[1-2]": ["n1", "n2"]}.get(hostlist, [hostlist])


def test_two_nodes_share_one_compressed_detail_line():
    alloc = parse_scontrol_job(TWO_NODES, _expand)
    assert alloc.job_id == "1"
    assert alloc.nodes == {"n1": tuple("012345"), "n2": tuple("012345")}
    assert alloc.cpus == {"n1": 4, "n2": 4}
    assert alloc.batch_node == "n1"
    assert alloc.end_time == time.mktime((2026, 11, 22, 3, 5, 36, 0, 0, -1))


def test_typed_gres_sparse_indices_cpu_only_nodes_and_no_time_limit():
    alloc = parse_scontrol_job(MIXED, _expand)
    assert alloc.nodes == {"gpu01": ("0", "1", "4", "5"), "gpu02": ("3", "7"), "cpu7": ()}
    assert alloc.cpus == {"gpu01": 7, "gpu02": 2, "cpu7": 1}
    assert alloc.end_time is None


@pytest.mark.parametrize("text, message", [
    ("slurm_load_jobs error: Invalid job id specified", "not the output"),
    (TWO_NODES.replace("JobState=RUNNING", "JobState=COMPLETED"), "COMPLETED, not RUNNING"),
    ("JobId=3 JobName=x\n   JobState=RUNNING\n", "lists no nodes"),
])
def test_what_is_not_a_running_allocation_is_refused_with_the_reason(text, message):
    with pytest.raises(AllocationError, match=message):
        parse_scontrol_job(text, _expand)


def test_srun_line_pins_node_gpus_and_cpus_and_runs_the_step_shim():
    argv = srun_argv("12", ("n2",), 3, 6, "marble-4.9", Path("/s/jobs/4/slurm-step.json"),
                     ("python", "train.py"), ("--mem-per-gpu=8G",))
    assert argv[:10] == ["srun", "--jobid=12", "--exact", "--nodes=1", "--ntasks=1",
                         "--ntasks-per-node=1", "--cpus-per-task=6", "--nodelist=n2",
                         "--gpus=3", "--job-name=marble-4.9"]
    assert argv[10] == "--mem-per-gpu=8G"
    assert argv[-5:] == ["-m", "marbled.batch.step", "/s/jobs/4/slurm-step.json",
                         "python", "train.py"]


def test_srun_line_runs_the_step_in_the_jobs_directory():
    argv = srun_argv("12", ("n2",), 1, 1, "marble-4.9", Path("/s/jobs/4/slurm-step.json"),
                     ("python", "train.py"), chdir=Path("/home/u/project"))
    assert "--chdir=/home/u/project" in argv[:argv.index(sys.executable)]


def test_multi_node_srun_line_has_one_task_and_the_same_gpus_per_node():
    argv = srun_argv("12", ("n1", "n3"), 2, 4, "marble-5.1", Path("i.json"), ("train",))
    assert {"--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=n1,n3",
            "--gpus-per-node=2", "--cpus-per-task=4"} <= set(argv)
    assert not any(a.startswith("--gpus=") for a in argv)


@pytest.mark.parametrize("status, code", [(0, 0), (3, 3), (137, -9), (143, -15), (128, 128),
                                          (-9, -9)])
def test_srun_exit_status_becomes_the_broker_exit_code(status, code):
    assert exit_code(status) == code
