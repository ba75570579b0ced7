"""Slurm: the allocation read through pyslurm or the commands, every run a job step.

The allocation comes from marbled.batch.slurm_api: pyslurm when a pyslurm of the
running Slurm's version is installed, else `scontrol show job -d` (parsed here, with
`scontrol show hostnames` for compressed node lists), which every Slurm has.

Every run is a job step on the node and GPU count the policy chose:

    srun --jobid J --exact -N1 -n1 -c C -w NODE --gpus K --job-name marble-JOB.RUN \
         --chdir DIR python -m marbled.batch.step INFO_FILE <the job's command>

(a job on K nodes: -N K -n K --ntasks-per-node=1 -w N1,...,NK --gpus-per-node=G,
one task per node, as one step; a per-GPU job: -n K*G --ntasks-per-node=G
--gpus-per-node=G, one task per GPU, with MASTER_ADDR the first node's NodeAddr and
MASTER_PORT free on the broker's host, docs/distributed.md; with more than one task,
--kill-on-bad-exit=1: a failed task ends the step.)

- `--exact` and `-c C` keep a step to its own CPUs (without them one step takes
  every CPU of the allocation and steps run one after another); `--gpus K` is
  given always, because a step with no GPU option takes all the job's GPUs.
- Slurm picks the GPU indices; the step writes them (SLURM_STEP_GPUS) to its
  info file, as nothing outside the step can see them.
- Signals go through `scancel --signal=SIG J.STEP`: srun does not forward
  SIGTSTP (it stops itself), and the step may run on another node.
- The srun process runs under the run's supervisor (marbled.batch.supervise), the
  broker's child, which records srun's exit status, the job's, in the run's exit file:
  a step that ends while no broker watches is then known too (lifecycle I2).
- `--chdir` runs the step where the job was submitted from (the job's directory on
  the shared file system), as sbatch and srun themselves do.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from marbled.batch import ALLOCATION_VARS
from marbled.batch.base import (
    Allocation,
    AllocationError,
    BatchSystem,
    LaunchRequest,
    StepLauncher,
    StepRun,
    Watched,
    process_start_time,
)
from marbled.batch.local import signal_group, start_process
from marbled.batch.ranks import rendezvous_env
from marbled.batch.slurm_api import (
    CliReader,
    SlurmReader,
    choose_reader,
    step_end,
    step_refused,
    unavailable,
)
from marbled.batch.step import SLURM_NODE_VAR, rank_file
from marbled.worker.protocol import read_json

JOB_ID_VAR = ALLOCATION_VARS["slurm"]
STEP_INFO = "slurm-step.json"
# options a user's allocation may have put in the environment that would change a step's
# GPU or task shape; the launcher's explicit options say it all
_SHAPE_VARS = ("SLURM_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK",
               "SLURM_GPUS_PER_SOCKET", "SLURM_TRES_PER_TASK", "SLURM_CPUS_PER_GPU",
               "SLURM_CPUS_PER_TASK", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE")


# ------------------------------------------------------------------ the allocation

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
                      batch if batch and batch != "(null)" else None, source="slurm")


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


def slurm_allocation(job_id: str | None = None, reader: SlurmReader | None = None) -> Allocation:
    """The allocation of `job_id` (default: $SLURM_JOB_ID), read from Slurm by `reader`
    (default: the command line)."""
    job_id = job_id or os.environ.get(JOB_ID_VAR)
    if not job_id:
        raise AllocationError(f"not inside a Slurm allocation (no {JOB_ID_VAR}); "
                              "run marbled from a batch script, salloc, or pass --launcher local")
    return (reader or CliReader()).allocation(job_id)


# ------------------------------------------------------------------ runs as job steps

def srun_argv(job_id: str, nodes: tuple[str, ...], gpus: int, cpus: int, name: str,
              info_file: Path, command: tuple[str, ...], extra: tuple[str, ...] = (),
              chdir: Path | None = None, per_gpu: bool = False) -> list[str]:
    """One task on each of `nodes`, each with `gpus` GPUs and `cpus` CPUs, in `chdir`; with
    `per_gpu`, `gpus` tasks on each node, each with its share of `cpus`, all seeing the
    node's `gpus` GPUs (LOCAL_RANK picks one: --gpus-per-task would hide the others)."""
    if per_gpu:
        shape = [f"--ntasks={len(nodes) * gpus}", f"--ntasks-per-node={gpus}",
                 f"--cpus-per-task={max(1, cpus // gpus)}"]
        gpu_option = f"--gpus-per-node={gpus}"  # each task sees them all, as torchrun's
    else:
        shape = [f"--ntasks={len(nodes)}", "--ntasks-per-node=1", f"--cpus-per-task={cpus}"]
        gpu_option = f"--gpus={gpus}" if len(nodes) == 1 else f"--gpus-per-node={gpus}"
    where = [f"--chdir={chdir}"] if chdir else []
    # srun's --label puts `N: ` before each line task N prints: `marble logs --rank` reads it
    label = ["--label"] if per_gpu else []
    # A task that fails ends the step, as a failed rank ends a local per-GPU run
    # (marbled.batch.ranks) and torchrun's agent ends its workers: the other tasks would
    # wait for it at the rendezvous or in a collective, holding their GPUs, until a timeout
    tasks = len(nodes) * gpus if per_gpu else len(nodes)
    together = ["--kill-on-bad-exit=1"] if tasks > 1 else []
    return ["srun", f"--jobid={job_id}", "--exact", f"--nodes={len(nodes)}", *shape,
            f"--nodelist={','.join(nodes)}", gpu_option, f"--job-name={name}", *where, *label,
            *together, *extra,
            sys.executable, "-m", "marbled.batch.step", str(info_file), *command]


def node_address(node: str) -> str:
    """The address of a node, as Slurm reaches it (NodeAddr), for MASTER_ADDR: node names
    need not resolve; the name itself if Slurm does not say."""
    try:
        text = _run(["scontrol", "show", "node", "-o", node])
    except AllocationError:
        return node
    found = re.search(r"\bNodeAddr=(\S+)", text)
    return found.group(1) if found else node


# The signals on their way (scancel runs): the loop keeps only weak references to tasks, and
# a run's handle may be dropped as soon as it has asked (recovery's kill of a run left behind)
_DELIVERING: set[asyncio.Task] = set()


@dataclass
class SlurmStep(StepRun):
    """One run: watched through its srun process, signalled through scancel."""

    _last: asyncio.Task | None = field(default=None, repr=False)

    def signal(self, sig: int) -> bool:
        """Deliver `sig` to the step (in order with earlier signals); False if it has ended."""
        if not self.alive():
            return False
        if sig:
            self._last = asyncio.get_running_loop().create_task(self._deliver(sig, self._last))
            _DELIVERING.add(self._last)
            self._last.add_done_callback(_DELIVERING.discard)
        return True

    def ended_by(self, stderr: str) -> dict | None:
        info = read_json(rank_file(self.info_file, 0))
        if not info or info.get("run_id") != self.run_id or not info.get("step_id"):
            return step_refused(stderr)  # the step never started: was it refused?
        # the step's own job: an earlier allocation's, for a run a later broker closes
        return step_end(stderr, f"{info.get('job_id') or self.job_id}.{info['step_id']}")

    async def _deliver(self, sig: int, previous: asyncio.Task | None) -> None:
        if previous is not None:
            with contextlib.suppress(Exception):
                await previous
        info = await self.placement(timeout=10.0)
        if info and info.get("step_id"):
            name = signal.Signals(sig).name.removeprefix("SIG")
            proc = await asyncio.create_subprocess_exec(
                # the step's own job: an earlier allocation's, for a run left behind
                "scancel", "--quiet", f"--signal={name}",
                f"{info.get('job_id') or self.job_id}.{info['step_id']}",
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL)
            await proc.wait()
        elif sig in (signal.SIGTERM, signal.SIGKILL) and self.alive():
            # No step yet (srun still waits to create it): ending srun abandons the step.
            signal_group(self.pid, signal.SIGKILL)


class SlurmLauncher(StepLauncher):
    name = "slurm"
    info_name = STEP_INFO
    step_class = SlurmStep

    async def launch(self, request: LaunchRequest) -> SlurmStep:
        run_id = request.env["MARBLE_RUN_ID"]
        nodes = (request.node, *(n for n, _ in request.others))
        gpus = len(request.devices)
        tasks = len(nodes) * gpus if request.per_gpu else len(nodes)
        info_file = self.fresh_info_file(request, tasks)
        argv = srun_argv(self.allocation.job_id, nodes, gpus,
                         min(self.cpus_for(n, gpus) for n in nodes),
                         f"marble-{request.env.get('MARBLE_JOB_ID', '')}.{run_id}", info_file,
                         request.argv, self.extra_args, request.workdir, request.per_gpu)
        env = request.environment(leave_out=_SHAPE_VARS)
        env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm sets it inside the step
        # srun as the broker finds it: the job's PATH (its submitter's) may not have it
        argv[0] = shutil.which("srun") or "srun"
        if request.per_gpu:  # the step shim maps SLURM_PROCID... to RANK...
            env.update(rendezvous_env(await asyncio.to_thread(node_address, nodes[0])))
        proc = await start_process(argv, request, env)
        return SlurmStep(proc.pid, process_start_time(proc.pid), info_file, run_id,
                         self.allocation.job_id, nodes, proc, tasks=tasks)


# ------------------------------------------------------------------ the system

class SlurmSystem(BatchSystem):
    name = "Slurm"
    launcher_name = "slurm"
    allocation_var = JOB_ID_VAR
    command = "srun"

    def __init__(self, api: str = "auto"):
        self.api = api  # --slurm-api: the reader is chosen at the first read
        self.reader: SlurmReader | None = None
        self.why = ""

    def read_allocation(self) -> Allocation:
        if self.reader is None:
            self.reader, self.why = choose_reader(self.api)
        return slurm_allocation(reader=self.reader)

    def notes(self) -> list[str]:
        return [f"Slurm read through {self.why}"] if self.reader else []

    def watch(self, allocation: Allocation) -> Callable[[], Watched]:
        reader, nodes = self.reader or CliReader(), list(allocation.gpu_nodes)

        def read() -> Watched:
            states = reader.node_states(nodes)
            return Watched(reader.end(allocation.job_id).end_time,
                           {n: s for n, s in states.items() if unavailable(s)})

        return read

    def launcher(self, allocation: Allocation, step_args: tuple[str, ...] = ()) -> SlurmLauncher:
        return SlurmLauncher(allocation, step_args)

    def broker_node(self, allocation: Allocation, env: Mapping[str, str]) -> str | None:
        """The batch script's node, as Slurm names it in the environment (under salloc the
        broker is on no node of the job, and there is none)."""
        return env.get(SLURM_NODE_VAR)
