"""How marbled asks Slurm about its allocation: pyslurm (Slurm's C API) or the command line.

Two readers behind one interface, chosen once per broker (`marbled --slurm-api`):

- `PyslurmReader`: `pyslurm.job().find_id(JOB)` and `pyslurm.node().get()`, one RPC
  each and no process started. Used only when `import pyslurm` works and its version's
  major.minor is the running Slurm's (`scontrol --version`): pyslurm 22.5.x speaks to
  Slurm 22.05 only, and a mismatched one fails in odd ways rather than cleanly.
- `CliReader`: `scontrol show job -d` (parsed by marbled.batch.slurm), `squeue` and
  `sinfo`, which every Slurm has.

`--slurm-api auto` takes pyslurm when it can and says why not otherwise; `pyslurm` refuses
to start without a usable pyslurm (docs/slurm.md says how a site installs it); `cli` never
imports it.
"""

from __future__ import annotations

import importlib
import re
import time
from dataclasses import dataclass
from typing import Protocol

from marbled.batch.base import Allocation, AllocationError

SLURM_APIS = ("auto", "pyslurm", "cli")
INSTALL_DOC = "docs/slurm.md#pyslurm (build the pyslurm release of your Slurm's version)"
# Slurm node states (base state or flag) under which a node takes no new step
UNAVAILABLE = ("DOWN", "DRAIN", "FAIL", "INVAL", "NOT_RESPONDING", "POWERED_DOWN", "REBOOT")
_GPU_TRES = re.compile(r"gres[:/]gpu(?::[^:,]+)?:(\d+)")


@dataclass(frozen=True)
class AllocationEnd:
    end_time: float | None  # Unix time; None without a time limit
    time_limit: int | None  # minutes; None: UNLIMITED


class SlurmReader(Protocol):
    name: str  # "pyslurm" or "cli", as the log and the store name it

    def allocation(self, job_id: str) -> Allocation: ...

    def end(self, job_id: str) -> AllocationEnd: ...

    def node_states(self, nodes: list[str]) -> dict[str, str]:
        """node -> Slurm's state, e.g. 'IDLE', 'MIXED+DRAIN', 'DOWN*'."""
        ...


def unavailable(state: str) -> bool:
    """Does Slurm's node state keep new steps off the node?"""
    return any(word in state.upper() for word in UNAVAILABLE)


def _run(argv: list[str]) -> str:
    from marbled.batch.slurm import _run as run  # one error wording for every Slurm command
    return run(argv)


# ------------------------------------------------------------------ the command line

class CliReader:
    name = "cli"

    def allocation(self, job_id: str) -> Allocation:
        from marbled.batch.slurm import parse_scontrol_job
        return parse_scontrol_job(_run(["scontrol", "show", "job", "-d", job_id]))

    def end(self, job_id: str) -> AllocationEnd:
        text = _run(["squeue", "-h", "-j", job_id, "-o", "%e %l"]).split()
        if len(text) != 2:
            raise AllocationError(f"squeue knows no job {job_id} (has the allocation ended?)")
        end, limit = text
        if limit in ("UNLIMITED", "INFINITE") or end in ("N/A", "Unknown", "NONE"):
            return AllocationEnd(None, None)
        return AllocationEnd(time.mktime(time.strptime(end, "%Y-%m-%dT%H:%M:%S")),
                             _minutes(limit))

    def node_states(self, nodes: list[str]) -> dict[str, str]:
        out = _run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %T"])
        return {n: s.upper() for n, s in (line.split(None, 1) for line in out.splitlines()
                                          if line.strip())}


def _minutes(limit: str) -> int:
    """squeue's %l, [days-]hours:minutes:seconds or minutes:seconds, in whole minutes."""
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, minutes, seconds = parts
    return (int(days or 0) * 24 + hours) * 60 + minutes + (seconds > 0)


# ------------------------------------------------------------------ pyslurm

class PyslurmReader:
    name = "pyslurm"

    def __init__(self, module):
        self.pyslurm = module

    def _job(self, job_id: str) -> dict:
        try:
            found = self.pyslurm.job().find_id(job_id)
        except ValueError as exc:  # pyslurm: ("Invalid job id specified", errno)
            raise AllocationError(f"Slurm knows no job {job_id}: {exc}") from None
        if not found:
            raise AllocationError(f"Slurm knows no job {job_id}")
        return found[0]

    def allocation(self, job_id: str) -> Allocation:
        job = self._job(job_id)
        if job.get("job_state") != "RUNNING":
            raise AllocationError(f"job {job_id} is {job.get('job_state')}, not RUNNING")
        cpus = {n: int(c) for n, c in (job.get("cpus_allocated") or {}).items()}
        if not cpus:
            raise AllocationError(f"job {job_id} lists no nodes (is it running?)")
        per_node = _gpus_per_node(job, len(cpus))
        counts = dict.fromkeys(cpus, per_node)
        if not per_node and job.get("shared") == "0":
            # --exclusive with no GPU request: the job has every GPU of its nodes, which
            # its TRES strings do not list (`scontrol show job -d` does: GRES=gpu:6(IDX:..))
            every = self.pyslurm.node().get()
            counts = {n: _node_gpus(every.get(n, {}).get("gres") or ()) for n in cpus}
        # Device names are slots: inside each step Slurm picks the indices (SLURM_STEP_GPUS)
        nodes = {n: tuple(str(i) for i in range(counts[n])) for n in cpus}
        end = _end(job)
        batch = job.get("batch_host") or None
        return Allocation(str(job["job_id"]), nodes, cpus, end.end_time, batch, source="slurm")

    def end(self, job_id: str) -> AllocationEnd:
        return _end(self._job(job_id))

    def node_states(self, nodes: list[str]) -> dict[str, str]:
        every = self.pyslurm.node().get()
        return {n: every[n]["state"] for n in nodes if n in every}


def _end(job: dict) -> AllocationEnd:
    limit = job.get("time_limit")
    if not isinstance(limit, int):  # "UNLIMITED", "Partition_Limit"
        return AllocationEnd(None, None)
    return AllocationEnd(float(job["end_time"]) if job.get("end_time") else None, limit)


def _node_gpus(gres: list[str] | tuple) -> int:
    """The GPUs a node has, from its configured GRES (pyslurm: ['gpu:6'], ['gpu:a100:4(S:0)'])."""
    return sum(int(m.group(1)) for g in gres
               if (m := re.match(r"gpu(?::[^:(,]+)?:(\d+)", g)))


def _gpus_per_node(job: dict, nodes: int) -> int:
    """GPUs on each node of the job, from its TRES request (--gres=gpu:N, --gpus-per-node=N,
    or --gpus=N on one node); 0 without GPUs."""
    found = _GPU_TRES.search(job.get("tres_per_node") or "")
    if found:
        return int(found.group(1))
    found = _GPU_TRES.search(job.get("tres_per_job") or "")
    if found and nodes == 1:
        return int(found.group(1))
    if found:
        raise AllocationError(
            f"job {job['job_id']} asked for {found.group(1)} GPUs over {nodes} nodes "
            "(--gpus), which pyslurm does not split per node: ask with --gpus-per-node "
            "or --gres=gpu:N, or run marbled --slurm-api cli")
    return 0


# ------------------------------------------------------------------ the choice

def _major_minor(text: str) -> tuple[int, int] | None:
    found = re.search(r"(\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def running_slurm() -> str:
    """The version of the Slurm on PATH, e.g. '22.05.8'."""
    return _run(["scontrol", "--version"]).split()[-1]


def pyslurm_problem() -> tuple[object | None, str]:
    """(the pyslurm module, why it is usable) or (None, why it is not)."""
    try:
        module = importlib.import_module("pyslurm")
    except ImportError as exc:
        return None, f"pyslurm cannot be imported ({exc})"
    try:
        theirs = str(module.version())
        slurm = running_slurm()
    except AllocationError as exc:
        return None, str(exc)
    if _major_minor(theirs) != _major_minor(slurm):
        return None, (f"pyslurm {theirs} is not built for the running Slurm {slurm} "
                      "(major.minor must match)")
    return module, f"pyslurm {theirs} matches Slurm {slurm}"


def choose_reader(api: str = "auto") -> tuple[SlurmReader, str]:
    """The reader `--slurm-api API` means, and why (for the log). AllocationError when
    pyslurm is asked for and cannot be used."""
    if api not in SLURM_APIS:
        raise AllocationError(f"--slurm-api {api}: choose one of {', '.join(SLURM_APIS)}")
    if api == "cli":
        return CliReader(), "the Slurm commands (--slurm-api cli)"
    module, why = pyslurm_problem()
    if module is not None:
        return PyslurmReader(module), why
    if api == "pyslurm":
        raise AllocationError(f"--slurm-api pyslurm: {why}; install the pyslurm release of "
                              f"your Slurm ({INSTALL_DOC}), or use --slurm-api auto or cli")
    return CliReader(), f"the Slurm commands: {why}"



# ------------------------------------------------------------------ a step's end

# What slurmstepd writes to a step's stderr (so to srun's) when Slurm ends the step itself:
# "slurmstepd-n1: error: *** STEP 7.0 ON n1 CANCELLED AT 2026-11-25T23:04:27 ***"
# (scancel; "... DUE TO TIME LIMIT ***" and others), "Detected 1 oom-kill event(s) in StepId=7.0"
_CANCELLED = re.compile(
    r"\*\*\* STEP (\d+\.\d+) ON (\S+) CANCELLED AT (\S+)(?: DUE TO ([^*]+?))? \*\*\*")
_OOM = re.compile(r"Detected \d+ oom-kill event\(s\) in StepId=(\d+\.\d+)")
_STATES = {"TIME LIMIT": "TIMEOUT", "NODE FAILURE": "NODE_FAIL", "PREEMPTION": "PREEMPTED"}
# What srun itself writes when Slurm ends its step; slurmstepd's line above does not always
# reach srun before it exits (seen with scancel JOB.STEP): then this is all there is
_ABORTED = "srun: Job step aborted"
# What srun writes when Slurm does not create its step at all, so the command never ran:
# "srun: error: Unable to create step for job 180: Invalid generic resource (gres)
# specification", seen when a step asked for GPUs a few ms after other steps of the
# allocation had ended, and the same request succeeded later
_NOT_CREATED = re.compile(r"srun: error: Unable to create step for job \S+: (.+)")
# What srun writes when it cannot use its allocation at all, before any step (srun's
# allocate.c): "srun: error: Slurm job 379 has expired" (the allocation ended, as its broker
# died: found by a hunt), or "srun: error: Unable to confirm allocation for job 379: Socket
# timed out..." (the controller did not answer); its command never ran either
_NO_ALLOCATION = re.compile(
    r"srun: error: (Slurm job \S+ has expired|Unable to confirm allocation for job \S+: .+)")


def step_refused(log: str) -> dict | None:
    """Slurm's refusal to create a step, from srun's stderr (`never_ran`: its command did not
    start); None if srun said no such thing."""
    for words, what in ((_NOT_CREATED, "Slurm did not create the step"),
                        (_NO_ALLOCATION, "srun could not use its allocation")):
        found = words.search(log)
        if found is not None:
            return {"state": "NOT_CREATED", "never_ran": True,
                    "detail": f"{what}: {found.group(1).strip()}"}
    return None


def step_end(log: str, step: str) -> dict | None:
    """How Slurm ended step `step` ('JOB.STEP'), from its record in the step's stderr: state
    (CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED, OUT_OF_MEMORY) and a sentence; None when
    Slurm did not end it (the step's own exit, or a signal the broker sent)."""
    for found in _OOM.finditer(log):
        if found.group(1) == step:
            return {"state": "OUT_OF_MEMORY",
                    "detail": f"Slurm killed step {step}: out of memory (cgroup OOM killer)"}
    for found in _CANCELLED.finditer(log):
        if found.group(1) == step:
            due = (found.group(4) or "").strip()
            state = _STATES.get(due, "CANCELLED")
            why = f"due to {due.lower()}" if due else "(scancel)"
            return {"state": state, "node": found.group(2), "at": found.group(3),
                    "detail": f"Slurm cancelled step {step} on {found.group(2)} {why}"}
    if _ABORTED in log and not _CANCELLED.search(log):  # no other step's record either
        return {"state": "CANCELLED",
                "detail": f"Slurm cancelled step {step} (srun: job step aborted)"}
    return None
