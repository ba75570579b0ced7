"""The batch systems marbled runs under, and which one `marbled --launcher` picks.

Each system is a module implementing marbled.batch.base.BatchSystem (detect it,
read its allocation, start runs in it, name the broker's node) and one line in
SYSTEMS below. `--launcher auto` picks the first batch system that detects
itself (inside one of its allocations, with its step command on PATH), else local
processes; `--gpus N` (emulated GPUs) always runs local.

A new batch system such as PBS or Flux touches: one new module
(marbled/batch/pbs.py: its allocation reader, its launcher and a PbsSystem), one
line in SYSTEMS, and its tests (tests/core/test_batch_systems.py for detection,
plus a tier of its own for the allocation and launcher). The --launcher choices,
auto detection, the state directory's default name (marbled.paths) and the
broker's start-up (marbled.cli.daemon_cmd) follow from the registry.

Standard library only, and the systems are imported when one is asked for:
marbled.paths reads ALLOCATION_VARS on every `marble` command, and the system
modules import asyncio.
"""

from __future__ import annotations

import importlib
import os

TYPE_CHECKING = False  # typing's, without importing typing (3 ms of `marble submit`)
if TYPE_CHECKING:
    from collections.abc import Mapping

    from marbled.batch.base import BatchSystem

# --launcher NAME: (the environment variable naming its allocation, its BatchSystem class).
# Auto detection tries the batch systems in this order; local is the fallback.
SYSTEMS: dict[str, tuple[str | None, str]] = {
    "local": (None, "marbled.batch.local:LocalSystem"),
    "slurm": ("SLURM_JOB_ID", "marbled.batch.slurm:SlurmSystem"),
    "jsrun": ("LSB_JOBID", "marbled.batch.lsf:LsfSystem"),
}
FALLBACK = "local"
LAUNCHERS = ("auto", *SYSTEMS)  # the choices of --launcher
# --launcher NAME -> the variable naming its allocation (the systems declare theirs from here)
ALLOCATION_VARS = {name: var for name, (var, _) in SYSTEMS.items() if var}


def system_class(launcher_name: str) -> type[BatchSystem]:
    module, _, name = SYSTEMS[launcher_name][1].partition(":")
    return getattr(importlib.import_module(module), name)


def detect(env: Mapping[str, str] | None = None) -> type[BatchSystem]:
    """The system `--launcher auto` means in `env` (default: this process's environment)."""
    env = os.environ if env is None else env
    for name in SYSTEMS:
        if name != FALLBACK and system_class(name).detect(env):
            return system_class(name)
    return system_class(FALLBACK)


def choose(launcher_name: str, emulated_gpus: int | None = None,
           env: Mapping[str, str] | None = None, emulated_nodes: int = 1) -> BatchSystem:
    """The system of `marbled --launcher NAME [--gpus N [--nodes K]]`; AllocationError for a
    batch system with emulated GPUs, or emulated nodes without emulated GPUs."""
    if emulated_nodes > 1 and emulated_gpus is None:
        from marbled.batch.base import AllocationError
        raise AllocationError("--nodes (emulated nodes) needs --gpus (emulated GPUs)")
    if launcher_name == "auto":
        launcher_name = (FALLBACK if emulated_gpus is not None
                         else detect(env).launcher_name)
    if launcher_name == FALLBACK:
        return system_class(FALLBACK)(emulated_gpus, emulated_nodes)
    if emulated_gpus is not None:
        from marbled.batch.base import AllocationError
        raise AllocationError("--gpus (emulated GPUs) needs --launcher local")
    return system_class(launcher_name)()
