"""LSF's runs: every job run a Job Step Manager resource set (jsrun), Summit style (CSM/JSM).

    jsrun --nrs 1 --tasks_per_rs 1 --cpu_per_rs C --gpu_per_rs K --rs_per_host 1 --bind rs \
          python -m marbled.batch.step INFO_FILE <the job's command>

(a run on N hosts: --nrs N, still one set with one task on each host.)

- One resource set with one task, C cores and K GPUs (`-n/-a/-c/-g/-r`, IBM's jsrun
  command and OLCF's "Common jsrun Options"). `--bind rs` binds the task to all
  cores of its set: the default, packed:1, binds it to one core.
  https://ibm.com/support/knowledgecenter/SSWRJV_10.1.0/jsm/jsrun.html
  https://docs.olcf.ornl.gov/systems/summit_user_guide.html#job-launcher-jsrun
- Concurrent jsruns of one job (backgrounded, as the broker runs them) "will not
  share core/gpu resources" (OLCF, "Simultaneous Job Steps"); JSM picks the GPUs
  and sets CUDA_VISIBLE_DEVICES inside the set, which the step writes to its info
  file, as nothing outside the set can see it.
- jsrun has no option naming the host of a resource set. The documented way to
  place one is an Explicit Resource File (`--erf_input FILE`): a preamble and one
  line per rank, `rank: R: { host: NAME; cpu: {PUs}; gpu: {GPUs} }`, hosts "by
  logical or actual hostname", CPUs as hardware threads (with `cpu_index_using:
  logical`, 0..cores*SMT-1 with the isolated cores skipped).
  https://www.ibm.com/support/knowledgecenter/en/SSWRJV_10.1.0/jsm/erf_format.html
  https://github.com/olcf-tutorials/ERF-CPU-Indexing
  With several compute hosts the launcher writes one (placement "erf"): the run gets
  the host and the very GPUs the broker chose, and the cores that go with them
  (each GPU its share of the host's cores). With one host nothing needs placing
  and the plain options are used (placement "rs"). NOTE: OLCF's Summit guide warns
  that "a known bug is currently preventing execution of most ERF use cases": on
  such a system use one compute host per allocation, or placement="rs" (JSM then
  picks the host, and the broker's per-host bookkeeping is only advisory).
- Signals go to the jsrun process, which forwards them: jsrun "provides features
  for stdio management, signal propagation, and task termination cleanup" (IBM,
  jsrun command). `jskill --signal SIG STEP` (IBM, jskill command) needs the JSM
  step id, which only the inside of the step knows and the step shim does not
  record. jsrun runs in its own session, an orphaned process group, where a
  SIGTSTP jsrun does not catch is discarded rather than stopping it; and a
  SIGTSTP that does not reach the job is not lost: the job finds the broker's
  suspend.json at its next progress report (marbled.worker.protocol).
  https://www.ibm.com/support/knowledgecenter/en/SSWRJV_10.1.0/jsm/jskill.html
- A run on several hosts is one resource set (one task) on each: `--nrs N
  --rs_per_host 1`, or one ERF line per host. Each task's step shim writes its
  info file by rank (marbled.batch.step.rank_file); jsrun numbers the tasks in
  JSM_NAMESPACE_RANK (see Lightning's LSFEnvironment), which the shim must read
  for the ranks' files to differ.
- A per-GPU run (`--per-gpu`): G tasks in each host's resource set, one per GPU, each
  seeing the set's GPUs (`--tasks_per_rs G`, or G ERF ranks per host), MASTER_ADDR the
  first host's name, MASTER_PORT free on the broker's host; the step shim turns
  JSM_NAMESPACE_RANK, _SIZE, _LOCAL_RANK and _LOCAL_SIZE into RANK, WORLD_SIZE, ...
- The jsrun process runs under the run's supervisor, the broker's child (as srun's,
  marbled.batch.local.start_process); its exit status is the job's, 128+N for a task
  ended by signal N as for srun (marbled.batch.supervise.step_exit_code), and the
  supervisor records it for a broker that restarts.
- The environment of jsrun reaches the task (OLCF: `export OMP_NUM_THREADS=16`
  in the job script instead of `jsrun -E`), so the MARBLE_* variables need no -E.
- So does its working directory: jsrun starts in the job's (where it was submitted
  from), and so do its tasks.
"""

from __future__ import annotations

import logging
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from marbled.batch.base import (
    Allocation,
    LaunchRequest,
    StepLauncher,
    StepRun,
    process_start_time,
)
from marbled.batch.local import signal_group, start_process
from marbled.batch.ranks import rendezvous_env

log = logging.getLogger("marbled")

STEP_INFO = "jsrun-step.json"
ERF_NAME = "jsrun.erf"
SUMMIT_SMT = 4  # Summit's default SMT level (bsub -alloc_flags smtN changes it)
PLACEMENTS = ("auto", "rs", "erf")


def jsrun_argv(gpus: int, cpus: int, info_file: Path, command: tuple[str, ...],
               extra: tuple[str, ...] = (), erf_file: Path | None = None,
               hosts: int = 1, per_gpu: bool = False) -> list[str]:
    """The jsrun command line of one run: a resource set of `cpus` cores and `gpus` GPUs with
    one task on each of `hosts` hosts, or the resource sets of `erf_file`; with `per_gpu`,
    `gpus` tasks in each set (one per GPU, every task seeing the set's GPUs)."""
    if erf_file is not None:
        shape = ["--erf_input", str(erf_file)]
    else:
        shape = ["--nrs", str(hosts), "--tasks_per_rs", str(gpus if per_gpu else 1),
                 "--cpu_per_rs", str(cpus), "--gpu_per_rs", str(gpus), "--rs_per_host", "1",
                 "--bind", "rs"]
    return ["jsrun", *shape, *extra,
            sys.executable, "-m", "marbled.batch.step", str(info_file), *command]


def cpu_threads(positions: list[int], cores_per_gpu: int, smt: int) -> list[tuple[int, int]]:
    """Logical hardware-thread ranges (first, last) of the cores that go with the GPUs at
    `positions` on their host: GPU i has cores i*cores_per_gpu .. (i+1)*cores_per_gpu-1."""
    ranges: list[tuple[int, int]] = []
    for i in sorted(positions):
        first, last = i * cores_per_gpu * smt, (i + 1) * cores_per_gpu * smt - 1
        if ranges and ranges[-1][1] + 1 == first:
            ranges[-1] = (ranges[-1][0], last)
        else:
            ranges.append((first, last))
    return ranges


def erf_text(sets: list[tuple[str, tuple[str, ...], list[tuple[int, int]]]]) -> str:
    """An Explicit Resource File with rank r on host, GPUs and hardware threads sets[r]."""
    lines = ["cpu_index_using: logical"]
    for rank, (host, gpus, threads) in enumerate(sets):
        cpu = ",".join(f"{a}-{b}" if a != b else str(a) for a, b in threads)
        lines.append(f"rank: {rank}: {{ host: {host}; cpu: {{{cpu}}}; "
                     f"gpu: {{{','.join(gpus)}}} }}")
    return "\n".join(lines) + "\n"


@dataclass
class JsrunStep(StepRun):
    """One run: watched through its jsrun process, signalled through it too."""

    def signal(self, sig: int) -> bool:
        """Send `sig` to jsrun (through its supervisor's group: the supervisor outlives
        it), which passes it to the task; False if the run has ended."""
        if not self.alive():
            return False
        return not sig or signal_group(self.pid, sig)


class JsrunLauncher(StepLauncher):
    """Runs as jsrun resource sets inside the LSF allocation `allocation`.

    placement: "rs" (resource-set options, JSM picks host and GPUs), "erf" (an
    Explicit Resource File per run with the broker's host, GPUs and their cores),
    "auto" (erf with several compute hosts, else rs). `smt`: hardware threads per
    core for the ERF CPU ranges. `extra_args`: more jsrun options for every run,
    e.g. ("--smpiargs=off",) for jobs that do not use Spectrum MPI.
    """

    name = "jsrun"
    info_name = STEP_INFO
    step_class = JsrunStep

    def __init__(self, allocation: Allocation, extra_args: tuple[str, ...] = (),
                 placement: str = "auto", smt: int = SUMMIT_SMT):
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, "
                             f"not {placement!r}")
        if smt < 1:
            raise ValueError(f"smt must be at least 1, not {smt}")
        super().__init__(allocation, extra_args)
        self.smt = smt
        if placement == "auto":
            placement = "erf" if len(allocation.nodes) > 1 else "rs"
        self.placement = placement
        if placement == "rs" and len(allocation.nodes) > 1:
            log.warning("jsrun without resource files: JSM picks the host of every run, "
                        "not the broker")

    def erf_for(self, parts: tuple[tuple[str, tuple[str, ...]], ...], tasks: int = 1) -> str:
        """The Explicit Resource File that puts a run's task r on host parts[r][0] with GPUs
        parts[r][1], and the cores that go with them; `tasks` ranks on each host (per GPU)."""
        sets = []
        for node, devices in parts:
            node_gpus = self.allocation.nodes[node]
            positions = [node_gpus.index(d) for d in devices]
            cores_per_gpu = max(1, self.allocation.cpus.get(node, 1) // max(1, len(node_gpus)))
            sets += [(node, devices, cpu_threads(positions, cores_per_gpu, self.smt))] * tasks
        return erf_text(sets)

    async def launch(self, request: LaunchRequest) -> JsrunStep:
        run_id = request.env["MARBLE_RUN_ID"]
        parts = request.parts
        nodes = tuple(n for n, _ in parts)
        gpus = len(request.devices)
        tasks = len(nodes) * gpus if request.per_gpu else len(nodes)
        info_file = self.fresh_info_file(request, tasks)
        erf_file = None
        if self.placement == "erf":
            erf_file = request.run_dir / ERF_NAME
            erf_file.write_text(self.erf_for(parts, tasks // len(nodes)))
        argv = jsrun_argv(gpus, min(self.cpus_for(n, gpus) for n in nodes), info_file,
                          request.argv, self.extra_args, erf_file, len(nodes), request.per_gpu)
        env = request.environment()
        env.pop("CUDA_VISIBLE_DEVICES", None)  # JSM sets it inside the resource set
        # jsrun as the broker finds it: the job's PATH (its submitter's) may not have it
        argv[0] = shutil.which("jsrun") or "jsrun"
        if request.per_gpu:  # the step shim maps JSM_NAMESPACE_RANK... to RANK...
            env.update(rendezvous_env(nodes[0]))
        proc = await start_process(argv, request, env)
        return JsrunStep(pid=proc.pid, pid_start=process_start_time(proc.pid),
                         info_file=info_file, run_id=run_id, job_id=self.allocation.job_id,
                         nodes=nodes, process=proc, tasks=tasks)
