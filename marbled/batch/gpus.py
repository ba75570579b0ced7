"""Which GPUs this broker owns: an explicit emulated count, CUDA_VISIBLE_DEVICES, or NVML."""

from __future__ import annotations

import os


class GpuDiscoveryError(RuntimeError):
    pass


def discover_gpus(emulated: int | None) -> tuple[tuple[str, ...], str]:
    """Device names for CUDA_VISIBLE_DEVICES and where they came from.

    An explicit `--gpus N` wins (emulated GPUs 0..N-1, for machines without
    GPUs and for tests); then CUDA_VISIBLE_DEVICES, which Slurm and LSF set to
    the allocation's GPUs; then every device NVML reports.
    """
    if emulated is not None:
        if emulated < 1:
            raise GpuDiscoveryError("--gpus must be at least 1")
        return tuple(str(i) for i in range(emulated)), f"emulated ({emulated})"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        devices = tuple(d.strip() for d in visible.split(",") if d.strip())
        if devices and not any(d.startswith("-") for d in devices):
            return devices, "CUDA_VISIBLE_DEVICES"
    count = _nvml_count()
    if count:
        return tuple(str(i) for i in range(count)), "NVML"
    raise GpuDiscoveryError(
        "no GPUs found (no CUDA_VISIBLE_DEVICES, no NVML devices); "
        "pass --gpus N to run on N emulated GPUs"
    )


def _nvml_count() -> int:
    try:
        import pynvml  # from the optional 'nvml' extra (nvidia-ml-py)
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return 0
