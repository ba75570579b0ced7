"""GPU samples through NVML: utilization and memory of the broker's own GPUs, for the record.

Only GPUs on the broker's host can be read (NVML is local), so only the local
launcher samples; emulated GPUs are never sampled (there is nothing to read, and
made-up numbers would mislead whoever reviews the record).
"""

from __future__ import annotations

from dataclasses import dataclass

from marbled.core.model import State


class NoNvml(RuntimeError):
    pass


@dataclass(frozen=True)
class GpuSample:
    device: str
    util_gpu: int  # percent of the last sample period the GPU was busy
    util_mem: int  # percent of it the memory was read or written
    mem_used: int  # bytes
    mem_total: int


class NvmlSampler:
    """Reads the devices named like CUDA_VISIBLE_DEVICES entries (indices or UUIDs)."""

    def __init__(self, devices: tuple[str, ...]):
        try:
            import pynvml  # the optional 'nvml' extra (nvidia-ml-py)
        except ImportError:
            raise NoNvml("pynvml is not installed (pip install 'marbled[nvml]')") from None
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
            self._handles = {d: (pynvml.nvmlDeviceGetHandleByIndex(int(d)) if d.isdigit()
                                 else pynvml.nvmlDeviceGetHandleByUUID(d)) for d in devices}
        except pynvml.NVMLError as exc:
            raise NoNvml(f"NVML cannot read the GPUs: {exc}") from None

    def sample(self) -> list[GpuSample]:
        nvml, out = self._nvml, []
        for device, handle in self._handles.items():
            try:
                util = nvml.nvmlDeviceGetUtilizationRates(handle)
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            except nvml.NVMLError:
                continue  # a GPU that fell off the bus is not worth a crash of the broker
            out.append(GpuSample(device, util.gpu, util.memory, mem.used, mem.total))
        return out

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def holders(state: State, node: str, devices: tuple[str, ...]) -> dict[str, int]:
    """device -> the job holding it, for the GPUs of `node`."""
    return {devices[g]: job.id for job in state.engaged() if job.placement
            for n, gpus in job.placement.parts() if n == node for g in gpus}
