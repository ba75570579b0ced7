"""What a run is started with: its command and directory, the worker protocol's environment,
its logs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from marbled.batch.base import LaunchRequest
from marbled.batch.step import PER_GPU_VAR
from marbled.core.spec import JobSpec, expand_run_vars
from marbled.daemon.config import BrokerConfig
from marbled.daemon.workfiles import LOG_STREAMS, JobFiles


def launch_request(config: BrokerConfig, files: JobFiles, job_id: int, spec: JobSpec, node: str,
                   devices: tuple[str, ...], run_env: dict[str, str]) -> LaunchRequest:
    """A run of `job_id` on `devices` of `node`; `run_env` says which run (and its GPUs)."""
    jdir = files.dir(job_id)
    env = {"MARBLE_JOB_ID": str(job_id), "MARBLE_RUN_DIR": str(jdir),
           "MARBLE_CHECKPOINT_DIR": str(files.checkpoints(job_id)), **run_env}
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
    # no shell runs the command: its $MARBLE_GPUS (torchrun --nproc-per-node) is read here
    argv = expand_run_vars(spec.command, env) or (sys.executable, "-m", "marbled.worker.emulate")
    run_id = run_env.get("MARBLE_RUN_ID")  # none yet for a prestarted process
    out, err = (files.log(job_id, int(run_id), s) if run_id else files.standby_log(job_id, s)
                for s in LOG_STREAMS)
    # it runs where it was submitted from (a job of an older broker: in its own directory)
    return LaunchRequest(tuple(argv), env, node, devices, jdir, out,
                         err, cwd=Path(spec.chdir) if spec.chdir else None, per_gpu=spec.per_gpu)


def start_failure(request: LaunchRequest, exc: OSError) -> str:
    """Why a run's process could not be started: its program, or its directory (gone since
    the job was submitted)."""
    why = exc.strerror or str(exc)
    if exc.filename is not None and str(exc.filename) == str(request.workdir):
        return f"could not start {request.argv[0]!r} in {request.workdir}: {why} (the job's " \
               "directory)"
    return f"could not start {request.argv[0]!r}: {why}"
