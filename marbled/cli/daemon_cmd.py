"""`marbled`: the broker daemon."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import click

from marbled.batch import LAUNCHERS, choose
from marbled.batch.base import AllocationError
from marbled.batch.slurm_api import SLURM_APIS
from marbled.cli.entry import without_collections
from marbled.cli.policy_options import make_policy, policy_settings, policy_summaries
from marbled.core.learning import Learning
from marbled.core.policy import POLICIES
from marbled.core.profiles import ProfileError
from marbled.daemon.config import BrokerConfig
from marbled.paths import default_state_dir, socket_path, state_dir_problem
from marbled.resources import DEFAULT_PROFILE, find_profile, load_profile

EX_TEMPFAIL = 75  # sysexits.h: try again later -- here, in the next allocation


def _host_port(value: str | None) -> tuple[str, int] | None:
    if value is None:
        return None
    host, _, port = value.rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        raise click.BadParameter(f"'{value}' is not [HOST:]PORT, e.g. 0.0.0.0:7070 or 0")
    return host or "0.0.0.0", int(port)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--state-dir", type=click.Path(path_type=Path), envvar="MARBLE_STATE_DIR",
              help="Where the database, socket, logs and checkpoints live. "
                   "[default: $MARBLE_STATE_DIR, else ~/.local/state/marble/<allocation id>]")
@click.option("--gpus", "emulated_gpus", type=click.IntRange(1, 1024), default=None,
              help="Run on N EMULATED GPUs (ids 0..N-1), for machines without GPUs. "
                   "Without it: CUDA_VISIBLE_DEVICES, else every GPU NVML reports.")
@click.option("--nodes", "emulated_nodes", type=click.IntRange(1, 64), default=1,
              show_default=True,
              help="With --gpus: emulate this many nodes of --gpus GPUs each (node0, node1, "
                   "...; every run is a process on this host), to try multi-node policies.")
@click.option("--policy", type=click.Choice(sorted(POLICIES)), default="marble",
              show_default=True, help=policy_summaries() + ".")
@policy_settings
@click.option("--profile", default=DEFAULT_PROFILE, show_default=True,
              help="Throughput curves: a name in profiles/ or a YAML path.")
@click.option("--learn/--no-learn", default=True, show_default=True,
              help="Learn each model's curve and costs from its runs (kept in the state "
                   "database; 'marble curves' shows them) and size later jobs by it; a model "
                   "no profile knows is then explored instead of refused.")
@click.option("--start-gpus", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="With --learn: the GPU count the first job of a model no profile knows "
                   "starts on; later runs double it while a doubling pays.")
@click.option("--learn-interval", type=click.FloatRange(min=0.05), default=30.0,
              show_default=True,
              help="Seconds between looks at the runs' progress: each sets a run's expected "
                   "end (what policies weigh) by its measured speed, and with --learn is a "
                   "throughput sample of every run training long enough.")
@click.option("--time-scale", type=click.FloatRange(min=1e-4, max=1e4), default=1.0,
              show_default=True,
              help="For emulated jobs: real seconds per profiled second (0.02 runs 50x faster).")
@click.option("--suspend-timeout", type=click.FloatRange(min=0.1), default=60.0,
              show_default=True, help="Seconds from SIGTSTP to the job's acknowledgement "
                                      "before the broker escalates to SIGTERM.")
@click.option("--kill-timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds from SIGTERM (or from the acknowledgement) to the exit before "
                   "SIGKILL.")
@click.option("--monitor-interval", type=click.FloatRange(min=0.05), default=1.0,
              show_default=True, help="Seconds between checks for acknowledgement markers.")
@click.option("--prestart", type=click.Choice(["ahead", "suspend", "off"]), default="ahead",
              show_default=True,
              help="Start the process of a job's next run before its GPUs are free, so its "
                   "framework import is done by then: 'ahead' keeps one waiting for each "
                   "running secondary (the jobs MARBLE promotes), 'suspend' starts it at "
                   "the suspension. Only for jobs that call JobProtocol.ready().")
@click.option("--launcher", type=click.Choice(LAUNCHERS),
              default="auto", show_default=True,
              help="How runs start: 'slurm' as job steps (srun) on the allocation's nodes and "
                   "GPUs, 'jsrun' as LSF/JSM resource sets (contrib/lsf), 'local' as "
                   "processes here. auto: slurm inside a Slurm allocation, jsrun inside an "
                   "LSF one with jsrun on PATH, else local (always local with --gpus).")
@click.option("--drain-before", type=click.FloatRange(min=0), default=120.0, show_default=True,
              help="Under Slurm or LSF: seconds before the allocation's end at which every job "
                   "is suspended to its checkpoint and the broker stops.")
@click.option("--slurm-api", type=click.Choice(SLURM_APIS), default="auto", show_default=True,
              envvar="MARBLE_SLURM_API",
              help="Under Slurm, how the allocation is read: 'pyslurm' through Slurm's C API "
                   "(a pyslurm of the running Slurm's version; fails saying why without "
                   "one), 'cli' through scontrol/squeue, 'auto' pyslurm when it can, else "
                   "cli. The log says which and why. [env: MARBLE_SLURM_API]")
@click.option("--allocation-poll", type=click.FloatRange(min=0.1), default=30.0,
              show_default=True,
              help="Under Slurm: seconds between reads of the allocation's end time and its "
                   "nodes' states: a limit moved by 'scontrol update TimeLimit=' moves the "
                   "drain with it; a node DOWN or DRAIN gets no new runs until it is back.")
@click.option("--step-arg", "step_args", multiple=True, metavar="ARG",
              help="Extra srun/jsrun option for every run (repeatable), e.g. "
                   "--step-arg=--mem-per-gpu=16G.")
@click.option("--sample-interval", type=click.FloatRange(min=0), default=10.0,
              show_default=True,
              help="Seconds between NVML samples of the GPUs (utilization, memory, the job on "
                   "each), stored in the gpu_samples table; 0 turns them off. Real GPUs on "
                   "this host only (pip install 'marbled[nvml]').")
@click.option("--retry-delay", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds before a failed job with retries left starts again; doubles "
                   "after each failure of the same job.")
@click.option("--listen", metavar="[HOST:]PORT", callback=lambda _c, _p, v: _host_port(v),
              help="Also answer on TCP (for 'marble --url' on other nodes), only to requests "
                   "with the token written to STATE_DIR/token (0600); PORT 0 picks a free "
                   "port, written with the URL to STATE_DIR/endpoint.")
@click.option("--detach", is_flag=True,
              help="Start in the background; print the pid once the API answers.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning"]), default="info",
              show_default=True)
def main(state_dir, emulated_gpus, emulated_nodes, policy, profile, learn, start_gpus,
         learn_interval, time_scale, suspend_timeout, kill_timeout, monitor_interval, prestart,
         launcher, drain_before, slurm_api, allocation_poll, step_args, sample_interval,
         retry_delay, listen, detach, log_level, **settings):
    """Run the MARBLE broker on the GPUs of this allocation.

    marbled keeps a FIFO of training jobs, runs each on the GPU count its
    throughput profile says is fastest, fills leftover GPUs with secondary
    jobs, and promotes a secondary (suspend to checkpoint, resume on more GPUs)
    when GPUs free up. Feed it with 'marble submit'; watch with 'marble status'.

    \b
    Examples:
      marbled --detach                      # in a batch script, on the allocation's GPUs
      marbled --gpus 6 --time-scale 0.02    # 6 emulated GPUs, emulated jobs 50x faster
      marbled --policy rigid --gpus 6       # the LSF baseline, for comparison

    SIGTERM, SIGUSR2 (the allocation's end warning), 'marble shutdown' or the
    allocation's end time minus --drain-before suspends every running job to
    its checkpoint and stops; a new marbled on the same state directory, in
    this allocation or a later one, carries on.

    Exit status: 0 when no job is left, 75 when jobs are left for the next
    broker (the allocation ended or it was shut down), 1 on a start-up error.
    """
    state_dir = (state_dir or default_state_dir()).absolute()
    try:
        profile_path = find_profile(profile)
        book = load_profile(str(profile_path))
        system = choose(launcher, emulated_gpus, emulated_nodes=emulated_nodes)
        if system.launcher_name == "slurm":
            system.api = slurm_api
        elif slurm_api == "pyslurm":
            raise AllocationError("--slurm-api pyslurm needs the Slurm launcher (inside a "
                                  f"Slurm allocation); this broker runs {system.name}")
        allocation = system.allocation()
    except (ProfileError, AllocationError) as exc:
        raise click.ClickException(str(exc)) from None
    if detach:
        _detach(state_dir)
        return
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s marbled %(levelname)s %(message)s")
    log = logging.getLogger("marbled")
    if os.geteuid() == 0:
        log.warning("running as root: jobs will run as root too")
    for note in system.notes():
        log.info("%s", note)
    for warning in system.warnings(allocation):
        log.warning("%s", warning)
    config = BrokerConfig(
        state_dir=state_dir, nodes=allocation.gpu_nodes, book=book,
        profile_ref=str(profile_path.absolute()), time_scale=time_scale,
        suspend_timeout=suspend_timeout, kill_timeout=kill_timeout,
        monitor_interval=monitor_interval, prestart=prestart if system.prestart else "off",
        broker_node=system.broker_node(allocation, os.environ), end_time=allocation.end_time,
        drain_before=drain_before, watch=system.watch(allocation),
        allocation_poll=allocation_poll, retry_delay=retry_delay, sample_interval=sample_interval,
        learning=Learning(start_gpus=start_gpus) if learn else None,
        learn_interval=learn_interval,
    )
    runner = system.launcher(allocation, tuple(step_args))
    # the broker's own imports (aiohttp, SQLAlchemy) here, not for `marbled --help` or the
    # parent of --detach
    with without_collections():
        from marbled.daemon.ledger import StorageLost
        from marbled.daemon.main import StartupError, serve
    try:
        chosen = make_policy(policy, settings)
        left = asyncio.run(serve(config, chosen, system.gpu_source(allocation), runner,
                               listen))
    except (StartupError, StorageLost) as exc:  # StorageLost: the log said what to free
        raise click.ClickException(str(exc)) from None
    sys.exit(EX_TEMPFAIL if left else 0)


def _detach(state_dir: Path) -> None:
    """Re-run this command without --detach in its own session, logging to the state dir."""
    from marbled.cli.client import BrokerClient, wait_until_serving

    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    problem = state_dir_problem(state_dir)  # before the log is written there
    if problem:
        raise click.ClickException(problem)
    argv = [a for a in sys.argv[1:] if a != "--detach"]
    if "--state-dir" not in argv:
        argv += ["--state-dir", str(state_dir)]
    log_fd = os.open(state_dir / "marbled.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(log_fd, 0o600)  # the log of an older marbled may be 0644
    with open(log_fd, "ab") as logf:
        began = logf.tell()  # the log holds earlier brokers' lines: this attempt's start here
        proc = subprocess.Popen([sys.executable, "-m", "marbled.cli.daemon_cmd", *argv],
                                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                start_new_session=True)
    try:
        wait_until_serving(BrokerClient(socket_path(state_dir), timeout=2), proc)
    except RuntimeError as exc:
        with open(state_dir / "marbled.log", "rb") as logf:
            logf.seek(began)
            said = logf.read().decode(errors="replace").strip().splitlines()
        # the reason first: this attempt's error (click's "Error: ..."), else its last lines
        reason = [line.removeprefix("Error: ") for line in said if line.startswith("Error: ")]
        raise click.ClickException("\n".join(
            [*(reason or said[-5:]), f"({exc}; its log: {state_dir / 'marbled.log'})"])) from None
    click.echo(f"marbled {proc.pid} ready; state directory {state_dir}")

if __name__ == "__main__":
    main()
