"""A stand-in for pynvml (nvidia-ml-py) on a machine without a GPU: the functions stackgate's NVML
edge calls, with pynvml's names, argument order, return shapes and constants.

Select it with ``STACKGATE_NVML_MODULE=fake_pynvml`` (this folder on PYTHONPATH). It describes a
healthy box of ``$FAKE_NVML_GPUS`` (default 1) x ``$FAKE_NVML_NAME`` (default "NVIDIA H200") of
compute capability ``$FAKE_NVML_CC`` (default 9.0), driver 580.95.05, CUDA 13.0.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1  # pynvml's values
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1


class NVMLError(Exception):
    def __init__(self, value: int = 999) -> None:
        self.value = value
        super().__init__(f"NVML error {value}")


def nvmlInit() -> None:
    pass


def nvmlShutdown() -> None:
    pass


def nvmlSystemGetDriverVersion() -> str:
    return "580.95.05"


def nvmlSystemGetCudaDriverVersion_v2() -> int:
    return 13000  # pynvml returns major * 1000 + minor * 10


def nvmlDeviceGetCount() -> int:
    return int(os.environ.get("FAKE_NVML_GPUS", "1"))


def nvmlDeviceGetHandleByIndex(index: int) -> SimpleNamespace:
    if not 0 <= index < nvmlDeviceGetCount():
        raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
    return SimpleNamespace(index=index)


def nvmlDeviceGetName(handle: SimpleNamespace) -> str:
    return os.environ.get("FAKE_NVML_NAME", "NVIDIA H200")


def nvmlDeviceGetUUID(handle: SimpleNamespace) -> str:
    return f"GPU-00000000-0000-0000-0000-{handle.index:012d}"


def nvmlDeviceGetPciInfo(handle: SimpleNamespace) -> SimpleNamespace:
    return SimpleNamespace(busId=f"00000000:{0x18 + handle.index:02X}:00.0")


def nvmlDeviceGetCudaComputeCapability(handle: SimpleNamespace) -> tuple[int, int]:
    major, minor = os.environ.get("FAKE_NVML_CC", "9.0").split(".")
    return int(major), int(minor)


def nvmlDeviceGetMemoryInfo(handle: SimpleNamespace) -> SimpleNamespace:
    total = 143771 * 2**20
    return SimpleNamespace(total=total, free=total - 2**29, used=2**29)


def nvmlDeviceGetComputeRunningProcesses(handle: SimpleNamespace) -> list[SimpleNamespace]:
    return []


def nvmlDeviceGetCurrPcieLinkGeneration(handle: SimpleNamespace) -> int:
    return 5


def nvmlDeviceGetMaxPcieLinkGeneration(handle: SimpleNamespace) -> int:
    return 5


def nvmlDeviceGetGpuMaxPcieLinkGeneration(handle: SimpleNamespace) -> int:
    return 5


def nvmlDeviceGetCurrPcieLinkWidth(handle: SimpleNamespace) -> int:
    return 16


def nvmlDeviceGetMaxPcieLinkWidth(handle: SimpleNamespace) -> int:
    return 16


def nvmlDeviceGetTotalEccErrors(handle: SimpleNamespace, error_type: int, counter_type: int) -> int:
    return 0
