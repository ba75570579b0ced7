"""Run every job run as a Slurm job step on the node and GPU count the policy chose.

    srun --jobid J --exact -N1 -n1 -c C -w NODE --gpus K --job-name marble-JOB.RUN \
         python -m marbled.launch.step INFO_FILE <the job's command>

(a job on K nodes: -N K -n K --ntasks-per-node=1 -w N1,...,NK --gpus-per-node=G,
one task per node, as one step.)

- `--exact` and `-c C` keep a step to its own CPUs (without them one step takes
  every CPU of the allocation and steps run one after another); `--gpus K` is
  given always, because a step with no GPU option takes all the job's GPUs.
- Slurm picks the GPU indices; the step writes them (SLURM_STEP_GPUS) to its
  info file, as nothing outside the step can see them.
- Signals go through `scancel --signal=SIG J.STEP`: srun does not forward
  SIGTSTP (it stops itself), and the step may run on another node.
- The srun process is the broker's child; its exit status is the job's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from marbled.allocation import Allocation
from marbled.launch.base import LaunchRequest
from marbled.launch.local import process_start_time, start_process
from marbled.launch.step import rank_file
from marbled.worker.protocol import read_json

STEP_INFO = "slurm-step.json"
# options a user's allocation may have put in the environment that would change a step's
# GPU or task shape; the launcher's explicit options say it all
_SHAPE_VARS = ("SLURM_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK",
               "SLURM_GPUS_PER_SOCKET", "SLURM_TRES_PER_TASK", "SLURM_CPUS_PER_GPU",
               "SLURM_CPUS_PER_TASK", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE")


def srun_argv(job_id: str, nodes: tuple[str, ...], gpus: int, cpus: int, name: str,
              info_file: Path, command: tuple[str, ...], extra: tuple[str, ...] = ()) -> list[str]:
    """One task on each of `nodes`, each with `gpus` GPUs and `cpus` CPUs."""
    gpu_option = f"--gpus={gpus}" if len(nodes) == 1 else f"--gpus-per-node={gpus}"
    return ["srun", f"--jobid={job_id}", "--exact", f"--nodes={len(nodes)}",
            f"--ntasks={len(nodes)}", "--ntasks-per-node=1", f"--cpus-per-task={cpus}",
            f"--nodelist={','.join(nodes)}", gpu_option, f"--job-name={name}", *extra,
            sys.executable, "-m", "marbled.launch.step", str(info_file), *command]


def exit_code(srun_status: int) -> int:
    """srun exits with 128+N when signal N ended the task: report it as -N, as for local runs."""
    return -(srun_status - 128) if 128 < srun_status < 128 + 65 else srun_status


@dataclass
class SlurmStep:
    """One run: watched through its srun process, signalled through scancel."""

    pid: int
    pid_start: int | None
    info_file: Path
    run_id: str
    job_id: str
    nodes: tuple[str, ...] = ()  # several for a multi-node run, in the broker's order
    process: asyncio.subprocess.Process | None = None  # None when adopted after a restart
    _last: asyncio.Task | None = field(default=None, repr=False)

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.returncode is None
        return self.pid > 0 and process_start_time(self.pid) == self.pid_start

    async def wait(self) -> int | None:
        if self.process is not None:
            return exit_code(await self.process.wait())
        while self.alive():
            await asyncio.sleep(0.2)
        return None  # an adopted srun is not our child: its status is not ours to read

    def signal(self, sig: int) -> bool:
        """Deliver `sig` to the step (in order with earlier signals); False if it has ended."""
        if not self.alive():
            return False
        if sig:
            self._last = asyncio.get_running_loop().create_task(self._deliver(sig, self._last))
        return True

    async def _deliver(self, sig: int, previous: asyncio.Task | None) -> None:
        if previous is not None:
            with contextlib.suppress(Exception):
                await previous
        info = await self.placement(timeout=10.0)
        if info and info.get("step_id"):
            name = signal.Signals(sig).name.removeprefix("SIG")
            proc = await asyncio.create_subprocess_exec(
                "scancel", "--quiet", f"--signal={name}", f"{self.job_id}.{info['step_id']}",
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL)
            await proc.wait()
        elif sig in (signal.SIGTERM, signal.SIGKILL) and self.alive():
            # No step yet (srun still waits to create it): ending srun abandons the step.
            os.kill(self.pid, signal.SIGKILL)

    async def placement(self, timeout: float = 3600.0) -> dict | None:
        """What the step reported about itself (step id, node, GPUs); None if it never did.

        For a multi-node step: every task's node and GPUs, joined in the run's node order
        ("n1,n2" and "0,1;2,3"), once every task has reported.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            infos = [read_json(rank_file(self.info_file, r)) for r in range(len(self.nodes) or 1)]
            if all(i and i.get("run_id") == self.run_id for i in infos):
                if len(infos) == 1:
                    return infos[0]
                by_node = {i["node"]: i["gpus"] for i in infos}
                order = [n for n in self.nodes if n in by_node] or sorted(by_node)
                return {**infos[0], "node": ",".join(order),
                        "gpus": ";".join(by_node[n] for n in order)}
            if not self.alive() or loop.time() > deadline:
                return None
            await asyncio.sleep(0.02)


class SlurmLauncher:
    name = "slurm"

    def __init__(self, allocation: Allocation, extra_args: tuple[str, ...] = ()):
        self.allocation = allocation
        self.extra_args = extra_args

    def cpus_for(self, node: str, gpus: int) -> int:
        """The node's CPUs shared in proportion to GPUs (at least one per step)."""
        per_gpu = self.allocation.cpus.get(node, 1) // max(1, len(self.allocation.nodes[node]))
        return max(1, per_gpu * gpus)

    async def launch(self, request: LaunchRequest) -> SlurmStep:
        run_id = request.env["MARBLE_RUN_ID"]
        info_file = request.cwd / STEP_INFO
        nodes = (request.node, *(n for n, _ in request.others))
        for rank in range(len(nodes)):
            rank_file(info_file, rank).unlink(missing_ok=True)
        gpus = len(request.devices)
        argv = srun_argv(self.allocation.job_id, nodes, gpus,
                         min(self.cpus_for(n, gpus) for n in nodes),
                         f"marble-{request.env.get('MARBLE_JOB_ID', '')}.{run_id}", info_file,
                         request.argv, self.extra_args)
        env = {k: v for k, v in os.environ.items() if k not in _SHAPE_VARS}
        env.update(request.env)
        env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm sets it inside the step
        proc = await start_process(argv, request, env)
        return SlurmStep(proc.pid, process_start_time(proc.pid), info_file, run_id,
                         self.allocation.job_id, nodes, proc)

    def adopt(self, pid: int, pid_start: int | None, run_dir: Path, run_id: int) -> SlurmStep:
        return SlurmStep(pid, pid_start, run_dir / STEP_INFO, str(run_id),
                         self.allocation.job_id)
