"""A stand-in for pynvml (nvidia-ml-py) that speaks its API: same function names, same return
shapes, the real NVMLError classes and constants. It describes the GPUs of a spec (a dict, or
the JSON file named by $STACKGATE_FAKE_NVML), so tests can show mixed capabilities, downtrained
links, ECC errors and foreign processes on a machine with no GPU.

Use it in-process by passing the module to stackgate (``Facts(..., nvml_lib=fake_nvml)``) after
``configure(spec)``, or in a subprocess with STACKGATE_NVML_MODULE=fakes.fake_nvml and
PYTHONPATH including tests/.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

import pynvml
from pynvml import (  # noqa: F401  (re-exported: callers use them through this module)
    NVML_AGGREGATE_ECC,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
    NVML_VOLATILE_ECC,
    NVMLError,
)

_SPEC: dict[str, Any] | None = None


def gpu(
    name: str = "NVIDIA RTX PRO 6000 Blackwell Server Edition", cc: tuple[int, int] = (12, 0), **fields: Any
) -> dict[str, Any]:
    """One GPU of a spec, with healthy defaults."""
    spec = {
        "name": name,
        "cc": list(cc),
        "pcie": [5, 5, 5, 16, 16],
        "ecc": [0, 0],
        "memory": [96 * 2**30, 512 * 2**20],
        "processes": [],
        "unsupported": [],
    }
    spec.update(fields)
    return spec


def machine(gpus: list[dict[str, Any]], driver: str = "580.82.07", cuda: int = 13000) -> dict[str, Any]:
    return {"driver": driver, "cuda": cuda, "gpus": gpus}


def configure(spec: dict[str, Any] | None) -> None:
    global _SPEC
    _SPEC = spec


def _spec() -> dict[str, Any]:
    if _SPEC is not None:
        return _SPEC
    path = os.environ.get("STACKGATE_FAKE_NVML")
    if not path:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    with open(path) as stream:
        return json.load(stream)


def _device(handle: Any, field: str) -> dict[str, Any]:
    device = _spec()["gpus"][handle]
    if field in device.get("unsupported", ()):
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return device


def nvmlInit() -> None:
    spec = _spec()
    if spec.get("init_error"):
        raise NVMLError(getattr(pynvml, spec["init_error"]))


def nvmlShutdown() -> None:
    pass


def nvmlSystemGetDriverVersion() -> str:
    return _spec()["driver"]


def nvmlSystemGetCudaDriverVersion_v2() -> int:
    return _spec()["cuda"]


def nvmlDeviceGetCount() -> int:
    return len(_spec()["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < nvmlDeviceGetCount():
        raise NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return index


def nvmlDeviceGetName(handle: int) -> str:
    return _device(handle, "name")["name"]


def nvmlDeviceGetUUID(handle: int) -> str:
    return _device(handle, "uuid").get("uuid", f"GPU-00000000-0000-0000-0000-{handle:012d}")


def nvmlDeviceGetPciInfo(handle: int) -> SimpleNamespace:
    return SimpleNamespace(busId=f"00000000:{0x18 + handle:02X}:00.0")


def nvmlDeviceGetCudaComputeCapability(handle: int) -> tuple[int, int]:
    major, minor = _device(handle, "capability")["cc"]
    return major, minor


def nvmlDeviceGetCurrPcieLinkGeneration(handle: int) -> int:
    return _device(handle, "pcie_gen")["pcie"][0]


def nvmlDeviceGetMaxPcieLinkGeneration(handle: int) -> int:
    return _device(handle, "pcie_gen_max")["pcie"][1]


def nvmlDeviceGetGpuMaxPcieLinkGeneration(handle: int) -> int:
    return _device(handle, "pcie_gen_gpu_max")["pcie"][2]


def nvmlDeviceGetCurrPcieLinkWidth(handle: int) -> int:
    return _device(handle, "pcie_width")["pcie"][3]


def nvmlDeviceGetMaxPcieLinkWidth(handle: int) -> int:
    return _device(handle, "pcie_width_max")["pcie"][4]


def nvmlDeviceGetTotalEccErrors(handle: int, error_type: int, counter: int) -> int:
    volatile, aggregate = _device(handle, "ecc")["ecc"]
    return volatile if counter == NVML_VOLATILE_ECC else aggregate


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    total, used = _device(handle, "memory")["memory"]
    used += sum(h["bytes"] for h in _holders(handle))
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[SimpleNamespace]:
    held = [SimpleNamespace(pid=h["pid"], usedGpuMemory=h["bytes"]) for h in _holders(handle)]
    return [
        SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used"]) for p in _device(handle, "processes")["processes"]
    ] + held


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    gpu_util, memory_util = _device(handle, "utilization").get("util", [0, 0])
    return SimpleNamespace(gpu=gpu_util, memory=memory_util)


def nvmlDeviceGetProcessUtilization(handle: int, last_seen: int) -> list[SimpleNamespace]:
    """As the driver: one sample per process that ran kernels lately (spec "process_util": [{"pid", "sm"}]), and
    NVML_ERROR_NOT_FOUND when there is none."""
    samples = _device(handle, "process_utilization").get("process_util", [])
    if not samples:
        raise NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
    return [SimpleNamespace(pid=s["pid"], smUtil=s["sm"], memUtil=s.get("mem", 0), timeStamp=1) for s in samples]


def _holders(handle: int) -> list[dict[str, Any]]:
    """Processes a spec's "holders" file (JSON lines: pid, gpu, bytes) says hold memory on this
    GPU, as a stand-in server writes them. As with the driver, a process's memory is held only
    while it lives: a dead (or zombie) process has released it."""
    path = _spec().get("holders")
    if not path or not os.path.exists(path):
        return []
    with open(path) as stream:
        rows = [json.loads(line) for line in stream if line.strip()]
    return [r for r in rows if r["gpu"] == handle and _alive(r["pid"])]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stream:
            state = stream.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
