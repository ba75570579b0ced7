"""What a run is started with: its command and directory, the worker protocol's environment,
its logs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from marbled.batch.base import LaunchRequest
from marbled.batch.step import PER_GPU_VAR
from marbled.core.spec import RUN_VAR, JobSpec, expand_run_vars
from marbled.daemon.config import BrokerConfig
from marbled.daemon.workfiles import LOG_STREAMS, JobFiles
from marbled.paths import LOCK_NAME
from marbled.worker.protocol import STANDBY_BROKER_VAR, STANDBY_VAR


def _job_env(config: BrokerConfig, files: JobFiles, job_id: int, spec: JobSpec,
             node: str) -> dict[str, str]:
    """The worker protocol's variables every run of the job on `node` has, whichever run."""
    env = {"MARBLE_JOB_ID": str(job_id), "MARBLE_RUN_DIR": str(files.dir(job_id)),
           "MARBLE_CHECKPOINT_DIR": str(files.checkpoints(job_id))}
    if node == config.broker_node:  # a signal cannot reach the broker from elsewhere
        env["MARBLE_BROKER_PID"] = str(os.getpid())
    if spec.steps:
        env["MARBLE_TARGET_STEPS"] = str(spec.steps)
    if spec.model:
        env["MARBLE_MODEL"] = spec.model
    if spec.emulate:
        env["MARBLE_PROFILE"] = config.profile_ref
        env["MARBLE_TIME_SCALE"] = repr(config.time_scale)
    if spec.per_gpu:
        env[PER_GPU_VAR] = "1"
    return env


def launch_request(config: BrokerConfig, files: JobFiles, job_id: int, spec: JobSpec, node: str,
                   devices: tuple[str, ...], run_env: dict[str, str]) -> LaunchRequest:
    """A run of `job_id` on `devices` of `node`; `run_env` says which run (and its GPUs)."""
    jdir = files.dir(job_id)
    env = {**_job_env(config, files, job_id, spec, node), **run_env}
    # no shell runs the command: its $MARBLE_GPUS (torchrun --nproc-per-node) is read here
    argv = expand_run_vars(spec.command, env) or (sys.executable, "-m", "marbled.worker.emulate")
    run_id = run_env.get("MARBLE_RUN_ID")  # none yet for a prestarted process
    out, err = (files.log(job_id, int(run_id), s) if run_id else files.standby_log(job_id, s)
                for s in LOG_STREAMS)
    # it runs where it was submitted from (a job of an older broker: in its own directory)
    return LaunchRequest(tuple(argv), env, node, devices, jdir, out,
                         err, cwd=Path(spec.chdir) if spec.chdir else None, per_gpu=spec.per_gpu,
                         base_env=None if spec.environment.is_default
                         else spec.environment.overlay(os.environ))


def standby_env(config: BrokerConfig, go: Path, at: float) -> dict[str, str]:
    """A prestarted process's variables: its go file, and its broker as its state
    directory's lock file and the pid there (a process on another node learns from it that
    a new broker took over, and that no go will come)."""
    return {STANDBY_VAR: str(go), "MARBLE_LAUNCH_TIME": repr(at),
            STANDBY_BROKER_VAR: f"{config.state_dir / LOCK_NAME}:{os.getpid()}"}


def not_prestartable(config: BrokerConfig, files: JobFiles, job_id: int, spec: JobSpec,
                     node: str) -> str | None:
    """Why the job's next run cannot be prestarted, or None. Its command is filled in when
    its process is exec'd, and a prestarted process is exec'd before its go: a command that
    names a $MARBLE_ variable only a run's launch gives (its GPU count, run id, role, share,
    launch time; torchrun --nproc-per-node='$MARBLE_GPUS') would run with it unfilled, or
    with a guess the go may contradict. Such a job is launched when its GPUs are free."""
    known = _job_env(config, files, job_id, spec, node)
    late = sorted({m.group(1) or m.group(2) for word in spec.command if "$" in word
                   for m in RUN_VAR.finditer(word)} - known.keys())
    if not late:
        return None
    return (f"job {job_id} is not prestarted: its command names "
            f"{', '.join('$' + name for name in late)}, known only when its run is launched")


def start_failure(request: LaunchRequest, exc: OSError) -> str:
    """Why a run's process could not be started: its program, or its directory (gone since
    the job was submitted)."""
    why = exc.strerror or str(exc)
    if exc.filename is not None and str(exc.filename) == str(request.workdir):
        return f"could not start {request.argv[0]!r} in {request.workdir}: {why} (the job's " \
               "directory)"
    return f"could not start {request.argv[0]!r}: {why}"
