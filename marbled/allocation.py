"""What the batch system gave us: nodes, their GPUs and CPUs, the job id and the end time.

Slurm is read through its command-line tools (`scontrol show job -d`, and
`scontrol show hostnames` for compressed node lists), which every Slurm has.
pyslurm would be an alternative backend, but no pyslurm release on PyPI pairs
with Slurm 22.05, so the command line is the only backend today.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field


class AllocationError(RuntimeError):
    pass


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: dict[str, tuple[str, ...]]  # node -> GPU indices Slurm gave the job there
    cpus: dict[str, int]  # node -> CPUs of the job there
    end_time: float | None  # Unix time; None without a time limit
    batch_node: str | None = None  # where the batch script (and so the broker) runs
    source: str = field(default="slurm", compare=False)


_DETAIL = re.compile(r"^\s*Nodes=(\S+)\s+CPU_IDs=(\S+).*?(?:GRES=(\S+))?\s*$")
_GPU_GRES = re.compile(r"gpu(?::[^:(,]+)?:(\d+)\(IDX:([^)]*)\)")


def parse_scontrol_job(text: str, expand=None) -> Allocation:
    """An allocation from `scontrol show job -d JOBID` output (Slurm 22.05 and later).

    `expand` turns a compressed node list such as `n[1-2]` into names (by default
    through `scontrol show hostnames`).
    """
    expand = expand or expand_hostlist
    fields: dict[str, str] = {}
    nodes: dict[str, tuple[str, ...]] = {}
    cpus: dict[str, int] = {}
    for line in text.splitlines():
        detail = _DETAIL.match(line)
        if detail:
            names, cpu_ids, gres = detail.groups()
            gpus = _gpu_indices(gres or "")
            for name in expand(names):
                nodes[name] = gpus
                cpus[name] = len(_expand_ranges(cpu_ids))
            continue
        for token in line.split():
            key, sep, value = token.partition("=")
            if sep and key not in fields:
                fields[key] = value
    if "JobId" not in fields:
        raise AllocationError("not the output of 'scontrol show job -d' (no JobId=)")
    if fields.get("JobState") not in (None, "RUNNING"):
        raise AllocationError(f"job {fields['JobId']} is {fields['JobState']}, not RUNNING")
    if not nodes:
        raise AllocationError(f"job {fields['JobId']} lists no nodes (is it running?)")
    end = None
    if fields.get("TimeLimit") not in (None, "UNLIMITED", "INFINITE") and fields.get(
            "EndTime", "Unknown") != "Unknown":
        end = time.mktime(time.strptime(fields["EndTime"], "%Y-%m-%dT%H:%M:%S"))
    batch = fields.get("BatchHost")
    return Allocation(fields["JobId"], nodes, cpus, end,
                      batch if batch and batch != "(null)" else None)


def _gpu_indices(gres: str) -> tuple[str, ...]:
    out: list[str] = []
    for _count, idx in _GPU_GRES.findall(gres):
        out += [str(i) for i in _expand_ranges(idx)]
    return tuple(out)


def _expand_ranges(spec: str) -> list[int]:
    """'0-3,6' -> [0, 1, 2, 3, 6]."""
    out: list[int] = []
    for part in filter(None, spec.split(",")):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        raise AllocationError(f"{argv[0]} not found: is Slurm installed here?") from None
    except subprocess.TimeoutExpired:
        raise AllocationError(f"'{' '.join(argv)}' did not answer in 30 s") from None
    if done.returncode != 0:
        raise AllocationError(f"'{' '.join(argv)}' failed: {done.stderr.strip()}")
    return done.stdout


def expand_hostlist(hostlist: str) -> list[str]:
    return _run(["scontrol", "show", "hostnames", hostlist]).split()


def slurm_allocation(job_id: str | None = None) -> Allocation:
    """The allocation of `job_id` (default: $SLURM_JOB_ID), read from Slurm."""
    job_id = job_id or os.environ.get("SLURM_JOB_ID")
    if not job_id:
        raise AllocationError("not inside a Slurm allocation (no SLURM_JOB_ID); "
                              "run marbled from a batch script, salloc, or pass --launcher local")
    return parse_scontrol_job(_run(["scontrol", "show", "job", "-d", job_id]))
