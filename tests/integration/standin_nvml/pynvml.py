"""STAND-IN for NVIDIA's pynvml (nvidia-ml-py): there is no NVIDIA GPU on these machines.

Four GPUs; GPU i is busy 10*(i+1) % of the time, its memory 5*(i+1) %, with
(i+1) GiB of 16 GiB in use. Only the calls marbled makes exist.
"""

from types import SimpleNamespace

COUNT = 4


class NVMLError(Exception):
    pass


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return COUNT


def nvmlDeviceGetHandleByIndex(index):
    if not 0 <= index < COUNT:
        raise NVMLError("Invalid Argument")
    return index


def nvmlDeviceGetHandleByUUID(uuid):
    raise NVMLError("Not Found")


def nvmlDeviceGetName(handle):
    return f"Stand-in GPU {handle}"


def nvmlDeviceGetUtilizationRates(handle):
    return SimpleNamespace(gpu=10 * (handle + 1), memory=5 * (handle + 1))


def nvmlDeviceGetMemoryInfo(handle):
    return SimpleNamespace(used=(handle + 1) << 30, total=16 << 30, free=(15 - handle) << 30)
