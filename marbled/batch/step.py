"""`python -m marbled.batch.step INFO_FILE ARGV...`: the first program of every job step.

It writes what only the inside of a step can see -- its step id, node and the
GPUs the batch system gave it (Slurm: SLURM_STEP_GPUS, which `scontrol show
step` does not list; LSF jsrun: CUDA_VISIBLE_DEVICES) -- to INFO_FILE, then
becomes ARGV (exec), so the training process is the step's top process and gets
the step's signals. In a multi-node step every
task (one per node) writes its own file: rank 0 INFO_FILE, rank r INFO_FILE.r. In a
per-GPU run (one task per GPU) every task does, and gets RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE and NODE_RANK from its SLURM_* or JSM_* numbers (task_rank_env): torch's
env:// rendezvous reads none of those; MASTER_ADDR and MASTER_PORT come from the launcher.

SIGTSTP is ignored across the exec, until the job installs its own handler: a
suspension that arrives before the job can checkpoint should not stop the
process (which then only the kill timeout would end), but be acknowledged by
nobody and escalate as for a local job.

It runs before every job, so it imports no batch-system module (they import
asyncio): the variables Slurm names a step by are here, and marbled.batch.slurm
uses SLURM_NODE_VAR too. Inside a jsrun resource set JSM sets only
CUDA_VISIBLE_DEVICES, and the node is the host.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from marbled.batch import ALLOCATION_VARS
from marbled.worker.protocol import RANK_VARS, atomic_write_json

SLURM_STEP_VAR = "SLURM_STEP_ID"
SLURM_NODE_VAR = "SLURMD_NODENAME"  # the node of a step, or of the batch script
SLURM_GPUS_VAR = "SLURM_STEP_GPUS"  # not listed by `scontrol show step`
PER_GPU_VAR = "MARBLE_PER_GPU"  # "1" in every rank of a per-GPU run (marbled.batch.ranks)


def step_info(env: dict[str, str]) -> dict:
    return {
        "run_id": env.get("MARBLE_RUN_ID"),
        "job_id": env.get(ALLOCATION_VARS["slurm"]),
        "step_id": env.get(SLURM_STEP_VAR),
        "node": env.get(SLURM_NODE_VAR) or socket.gethostname().split(".")[0],
        "host": socket.gethostname(),
        "gpus": env.get(SLURM_GPUS_VAR, env.get("CUDA_VISIBLE_DEVICES", "")),
        "pid": os.getpid(),
    }


def _tasks_per_node(compressed: str) -> list[int]:
    """Slurm's SLURM_STEP_TASKS_PER_NODE ('2(x3),1') as one count per node: [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in filter(None, compressed.split(",")):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise ValueError(f"cannot read tasks per node {compressed!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def task_rank_env(env: Mapping[str, str]) -> dict[str, str]:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and NODE_RANK of a batch system's task,
    from what Slurm (SLURM_PROCID...) or LSF's JSM (JSM_NAMESPACE_RANK...) set in it, which
    torch does not read; {} outside a task of either."""
    if env.get("SLURM_PROCID", "").isdigit():
        node = int(env.get("SLURM_NODEID", "0"))
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "")
        counts = _tasks_per_node(per_node) if per_node else []
        world = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS", "1")
        return {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": world,
                "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
                "LOCAL_WORLD_SIZE": str(counts[node] if node < len(counts) else 1),
                "NODE_RANK": str(node)}
    if env.get("JSM_NAMESPACE_RANK", "").isdigit():
        local_size = int(env.get("JSM_NAMESPACE_LOCAL_SIZE", "1"))
        return {"RANK": env["JSM_NAMESPACE_RANK"], "WORLD_SIZE": env.get("JSM_NAMESPACE_SIZE",
                                                                         "1"),
                "LOCAL_RANK": env.get("JSM_NAMESPACE_LOCAL_RANK", "0"),
                "LOCAL_WORLD_SIZE": str(local_size),
                "NODE_RANK": str(int(env["JSM_NAMESPACE_RANK"]) // max(1, local_size))}
    return {}


def rank_file(info_file: str | Path, rank: int) -> Path:
    """Where task `rank` of a multi-node step writes its info (rank 0: the file itself)."""
    path = Path(info_file)
    return path if rank == 0 else path.with_name(f"{path.stem}.{rank}{path.suffix}")


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: python -m marbled.batch.step INFO_FILE ARGV...")
    info_file, command = argv[0], argv[1:]
    signal.signal(signal.SIGTSTP, signal.SIG_IGN)
    if os.environ.get(PER_GPU_VAR) == "1":  # one task per GPU: torch reads no SLURM_* var
        os.environ.update(task_rank_env(os.environ))
    rank = next((int(os.environ[v]) for v in RANK_VARS if os.environ.get(v, "").isdigit()), 0)
    atomic_write_json(rank_file(info_file, rank), step_info(dict(os.environ)), durable=False)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.exit(f"marbled: cannot run {command[0]!r}: {exc.strerror}")


if __name__ == "__main__":
    main(sys.argv[1:])
