"""The NVML edge: one snapshot of the driver and every GPU, through nvidia-ml-py.

Nothing else in stackgate talks to NVML. Tests hand :func:`snapshot` a fake library that speaks
pynvml's API (same functions, same return shapes, same NVMLError classes); so can anyone through
``$STACKGATE_NVML_MODULE``, which names the module to use instead of ``pynvml``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from stackgate.models import settings

__all__ = ["GpuInfo", "NvmlError", "NvmlSnapshot", "ProcessInfo", "command_line", "load_library", "snapshot"]


class NvmlError(Exception):
    """NVML could not be loaded or initialised: there is no snapshot, with this reason."""


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    used_memory_bytes: int | None
    command: str | None = None  #: its command line (/proc/PID/cmdline), None where this machine cannot see it


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML sees it. A field NVML cannot give is None, with its reason in ``unknown``."""

    index: int
    name: str
    uuid: str
    bus_id: str | None
    capability: tuple[int, int] | None
    pcie_gen: int | None
    pcie_gen_max: int | None  #: the link's max (device and slot together)
    pcie_gen_gpu_max: int | None  #: what the GPU itself can do
    pcie_width: int | None
    pcie_width_max: int | None
    ecc_uncorrected_volatile: int | None
    ecc_uncorrected_aggregate: int | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    processes: tuple[ProcessInfo, ...]
    unknown: tuple[tuple[str, str], ...] = ()  #: (field, why NVML could not say)
    utilization: int | None = None  #: percent of the last sample period a kernel ran (nvidia-smi's GPU-Util)
    process_utilization: tuple[tuple[int, int], ...] = ()  #: (pid, percent of the SMs it used), NVML's latest samples

    @property
    def memory_free_bytes(self) -> int | None:
        if self.memory_total_bytes is None or self.memory_used_bytes is None:
            return None
        return self.memory_total_bytes - self.memory_used_bytes

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.name})"


@dataclass(frozen=True)
class NvmlSnapshot:
    driver_version: str
    cuda_driver_version: tuple[int, int] | None  #: the newest CUDA the driver supports
    gpus: tuple[GpuInfo, ...]


def load_library() -> ModuleType:
    """pynvml, or the module ``$STACKGATE_NVML_MODULE`` names."""
    name = settings.NVML_MODULE.value()
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise NvmlError(f"cannot import {name}: {exc} (pip install nvidia-ml-py)") from None


def snapshot(lib: ModuleType | None = None) -> NvmlSnapshot:
    """Read the driver and every GPU once; raise :class:`NvmlError` when NVML is unusable."""
    lib = load_library() if lib is None else lib
    try:
        lib.nvmlInit()
    except lib.NVMLError as exc:
        raise NvmlError(f"NVML not usable: {_reason(exc)}") from None
    try:
        count = lib.nvmlDeviceGetCount()
        gpus = tuple(_gpu(lib, index) for index in range(count))
        return NvmlSnapshot(_text(lib.nvmlSystemGetDriverVersion()), _cuda_version(lib), gpus)
    except lib.NVMLError as exc:
        raise NvmlError(f"NVML failed: {_reason(exc)}") from None
    finally:
        try:
            lib.nvmlShutdown()
        except lib.NVMLError:
            pass


def _gpu(lib: ModuleType, index: int) -> GpuInfo:
    handle = lib.nvmlDeviceGetHandleByIndex(index)
    unknown: list[tuple[str, str]] = []

    def ask(name: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except lib.NVMLError as exc:
            unknown.append((name, _reason(exc)))
            return None

    memory = ask("memory", lambda: lib.nvmlDeviceGetMemoryInfo(handle))
    pci = ask("bus_id", lambda: lib.nvmlDeviceGetPciInfo(handle))
    capability = ask("capability", lambda: lib.nvmlDeviceGetCudaComputeCapability(handle))
    processes = ask("processes", lambda: lib.nvmlDeviceGetComputeRunningProcesses(handle)) or ()
    rates = ask("utilization", lambda: lib.nvmlDeviceGetUtilizationRates(handle))
    return GpuInfo(
        index=index,
        name=_text(lib.nvmlDeviceGetName(handle)),
        uuid=_text(lib.nvmlDeviceGetUUID(handle)),
        bus_id=_text(pci.busId) if pci is not None else None,
        capability=tuple(capability) if capability is not None else None,
        pcie_gen=ask("pcie_gen", lambda: lib.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
        pcie_gen_max=ask("pcie_gen_max", lambda: lib.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
        pcie_gen_gpu_max=ask("pcie_gen_gpu_max", lambda: lib.nvmlDeviceGetGpuMaxPcieLinkGeneration(handle)),
        pcie_width=ask("pcie_width", lambda: lib.nvmlDeviceGetCurrPcieLinkWidth(handle)),
        pcie_width_max=ask("pcie_width_max", lambda: lib.nvmlDeviceGetMaxPcieLinkWidth(handle)),
        ecc_uncorrected_volatile=ask("ecc", lambda: _ecc(lib, handle, lib.NVML_VOLATILE_ECC)),
        ecc_uncorrected_aggregate=ask("ecc_aggregate", lambda: _ecc(lib, handle, lib.NVML_AGGREGATE_ECC)),
        memory_total_bytes=memory.total if memory is not None else None,
        memory_used_bytes=memory.used if memory is not None else None,
        processes=tuple(ProcessInfo(p.pid, _memory(p.usedGpuMemory), command_line(p.pid)) for p in processes),
        unknown=tuple(unknown),
        utilization=int(rates.gpu) if rates is not None else None,
        process_utilization=_process_utilization(lib, handle),
    )


def _process_utilization(lib: ModuleType, handle: Any) -> tuple[tuple[int, int], ...]:
    """Each process's latest SM utilisation sample; none where NVML keeps none (no process ran a kernel lately)."""
    try:
        samples = lib.nvmlDeviceGetProcessUtilization(handle, 0)
    except lib.NVMLError:
        return ()
    latest: dict[int, Any] = {}
    for sample in samples:
        if sample.pid not in latest or sample.timeStamp > latest[sample.pid].timeStamp:
            latest[sample.pid] = sample
    return tuple(sorted((pid, int(s.smUtil)) for pid, s in latest.items()))


def command_line(pid: int) -> str | None:
    """A process's command line as ps shows it (at most 200 characters), None where /proc does not show it.

    >>> import os; command_line(os.getpid()) is not None
    True
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as stream:
            raw = stream.read(4096)
    except OSError:
        return None
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    return (text[:197] + "...") if len(text) > 200 else text or None


def _ecc(lib: ModuleType, handle: Any, counter: int) -> int:
    return int(lib.nvmlDeviceGetTotalEccErrors(handle, lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter))


def _cuda_version(lib: ModuleType) -> tuple[int, int] | None:
    try:
        version = int(lib.nvmlSystemGetCudaDriverVersion_v2())
    except lib.NVMLError:
        return None
    return version // 1000, (version % 1000) // 10


def _memory(value: Any) -> int | None:
    # NVML reports "not available" (inside containers, for example) as None or a sentinel.
    return None if value is None or value >= 2**63 else int(value)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
