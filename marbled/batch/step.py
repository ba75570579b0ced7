"""`python -m marbled.batch.step INFO_FILE ARGV...`: the first program of every job step.

It writes what only the inside of a step can see -- its step id, node and the
GPUs the batch system gave it (Slurm: SLURM_STEP_GPUS, which `scontrol show
step` does not list; LSF jsrun: CUDA_VISIBLE_DEVICES) -- to INFO_FILE, then
becomes ARGV (exec), so the training process is the step's top process and gets
the step's signals. In a multi-node step every
task (one per node) writes its own file: rank 0 INFO_FILE, rank r INFO_FILE.r.

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
import signal
import socket
import sys
from pathlib import Path

from marbled.batch import ALLOCATION_VARS
from marbled.worker.protocol import RANK_VARS, atomic_write_json

SLURM_STEP_VAR = "SLURM_STEP_ID"
SLURM_NODE_VAR = "SLURMD_NODENAME"  # the node of a step, or of the batch script
SLURM_GPUS_VAR = "SLURM_STEP_GPUS"  # not listed by `scontrol show step`


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


def rank_file(info_file: str | Path, rank: int) -> Path:
    """Where task `rank` of a multi-node step writes its info (rank 0: the file itself)."""
    path = Path(info_file)
    return path if rank == 0 else path.with_name(f"{path.stem}.{rank}{path.suffix}")


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: python -m marbled.batch.step INFO_FILE ARGV...")
    info_file, command = argv[0], argv[1:]
    signal.signal(signal.SIGTSTP, signal.SIG_IGN)
    rank = next((int(os.environ[v]) for v in RANK_VARS if os.environ.get(v, "").isdigit()), 0)
    atomic_write_json(rank_file(info_file, rank), step_info(dict(os.environ)), durable=False)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.exit(f"marbled: cannot run {command[0]!r}: {exc.strerror}")


if __name__ == "__main__":
    main(sys.argv[1:])
