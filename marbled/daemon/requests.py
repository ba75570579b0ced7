"""What a run is started with: its command, the worker protocol's environment, its logs."""

from __future__ import annotations

import os
import sys

from marbled.batch.base import LaunchRequest
from marbled.core.spec import JobSpec
from marbled.daemon.config import BrokerConfig
from marbled.daemon.workfiles import JobFiles


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
    argv = spec.command or (sys.executable, "-m", "marbled.worker.emulate")
    return LaunchRequest(tuple(argv), env, node, devices, jdir, files.stdout(job_id),
                         files.stderr(job_id))
