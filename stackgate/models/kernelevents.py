"""The kernel log's GPU events: NVIDIA Xid events, PCIe AER errors and NVRM messages, decoded.

:func:`parse` reads kernel log text as ``dmesg`` or ``journalctl -k`` print it (any timestamp
prefix) into :class:`KernelEvent` values; :func:`findings` turns them into findings of the one
shape, each naming the GPU by its index when the bus id is known (:func:`normalize_bus`).

Each Xid's meaning and the action it asks of an operator are summarised from NVIDIA's public Xid
catalog (docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Errors with the Xid Catalog": the
mnemonic, the description and the resolution buckets, immediate action first); the severity says
whether the GPU itself is suspect (``fail``: reset, reboot, service) or the application that used
it (``warn``: restart the application, check its code).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from stackgate.models.finding import Evidence, Finding, Fix

__all__ = ["CATALOG", "CATALOG_URL", "KernelEvent", "Xid", "event", "findings", "normalize_bus", "parse"]

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


@dataclass(frozen=True)
class Xid:
    """One Xid of the catalog: what it is and what to do."""

    mnemonic: str
    meaning: str
    action: str  #: the catalog's immediate resolution bucket (RESTART_APP, RESET_GPU, RESTART_BM, ...)
    todo: str  #: that action, said for an operator
    severity: str  #: "fail": the GPU is suspect; "warn": the application that used it


_APP = (
    "Restart the application; if it repeats, check its code and the CUDA/driver versions (compute-sanitizer names "
    "the faulting kernel)."
)
_RESET = "Drain the GPU and reset it (nvidia-smi -r -i INDEX, or reboot); if it repeats, contact your hardware vendor."
_REBOOT = (
    "Drain the node and reboot it; check the GPU's seating, power and cooling; if it repeats, contact your hardware "
    "vendor."
)

#: Xids of Ampere and newer GPUs (the catalog's table), the frequent ones of serving nodes.
CATALOG: Mapping[int, Xid] = {
    8: Xid("ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", "RESTART_APP", _APP, "warn"),
    11: Xid(
        "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", "invalid or corrupted push buffer stream", "RESTART_APP", _APP, "warn"
    ),
    13: Xid(
        "ROBUST_CHANNEL_GR_EXCEPTION",
        "graphics engine exception (an out-of-range access or an illegal instruction in a kernel)",
        "RESTART_APP",
        _APP,
        "warn",
    ),
    31: Xid(
        "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR",
        "GPU memory page fault (a kernel accessed an address it does not own)",
        "RESTART_APP",
        _APP,
        "warn",
    ),
    32: Xid(
        "ROBUST_CHANNEL_PBDMA_ERROR",
        "invalid or corrupted push buffer stream (PBDMA error)",
        "RESTART_APP",
        _APP,
        "warn",
    ),
    43: Xid(
        "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR",
        "GPU stopped processing (the application's channel was reset)",
        "RESTART_APP",
        _APP,
        "warn",
    ),
    45: Xid(
        "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL",
        "preemptive cleanup after earlier errors (the process was killed or faulted)",
        "IGNORE",
        "Look at the Xid before it: this one follows it.",
        "warn",
    ),
    48: Xid("ROBUST_CHANNEL_DBE", "double-bit ECC error in GPU memory", "RESET_GPU", _RESET, "fail"),
    61: Xid("PMU_BREAKPOINT", "internal micro-controller breakpoint/warning", "RESET_GPU", _RESET, "fail"),
    62: Xid("PMU_HALT_ERROR", "internal micro-controller halt", "RESET_GPU", _RESET, "fail"),
    63: Xid(
        "INFOROM_DRAM_RETIREMENT_EVENT",
        "a memory row was marked for remapping (ECC page retirement or row remapping recorded)",
        "RESET_GPU",
        "Reset the GPU when convenient to activate the remapping (nvidia-smi -q -d ROW_REMAPPER shows pending remaps).",
        "warn",
    ),
    64: Xid(
        "INFOROM_DRAM_RETIREMENT_FAILURE",
        "recording a memory row remapping or page retirement failed",
        "RESET_GPU",
        _RESET,
        "fail",
    ),
    68: Xid("NVDEC0_EXCEPTION", "video decoder exception", "RESTART_APP", _APP, "warn"),
    69: Xid("GR_CLASS_ERROR", "graphics engine class error", "RESTART_APP", _APP, "warn"),
    74: Xid("NVLINK_ERROR", "NVLink error (a link between GPUs failed)", "RESET_GPU", _RESET, "fail"),
    79: Xid(
        "GPU_HAS_FALLEN_OFF_THE_BUS",
        "GPU has fallen off the bus: it stopped answering on PCIe",
        "RESTART_BM",
        _REBOOT,
        "fail",
    ),
    92: Xid(
        "EXCESSIVE_SBE_INTERRUPTS",
        "high single-bit ECC error rate",
        "NONE",
        "Watch the ECC counters (nvidia-smi -q -d ECC); if the rate stays high, contact your hardware vendor.",
        "warn",
    ),
    94: Xid(
        "ROBUST_CHANNEL_CONTAINED_ERROR",
        "contained memory error: an uncorrectable ECC error was contained to the applications that used the memory",
        "RESTART_APP",
        "Restart the affected application; reset the GPU when convenient so that the failing row is remapped.",
        "warn",
    ),
    95: Xid(
        "ROBUST_CHANNEL_UNCONTAINED_ERROR",
        "uncontained memory error: an uncorrectable ECC error the GPU could not contain",
        "RESET_GPU",
        _RESET,
        "fail",
    ),
    109: Xid("ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "context switch timeout", "RESTART_APP", _APP, "warn"),
    119: Xid("GSP_RPC_TIMEOUT", "timeout waiting for the GPU's system processor (GSP)", "RESET_GPU", _RESET, "fail"),
    120: Xid("GSP_ERROR", "error in code running on the GPU's system processor (GSP)", "RESET_GPU", _RESET, "fail"),
    121: Xid("C2C_ERROR", "chip-to-chip link error", "RESET_GPU", _RESET, "fail"),
    154: Xid(
        "GPU_RECOVERY_ACTION_CHANGED",
        "the driver changed the GPU's recovery action (the message names it: GPU reset or node reboot required)",
        "AS_STATED",
        "Do what the message names (reset the GPU, or reboot the node), after draining it.",
        "fail",
    ),
}

_BUS = r"(?:PCI:)?(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
_XID = re.compile(r"NVRM: Xid \(" + _BUS + r"\): (?P<xid>\d+), (?P<rest>.*)")
_AER_DEVICE = re.compile(
    r"(?P<driver>[\w\-]+) " + _BUS + r": (?:AER: )?PCIe Bus Error: severity=(?P<severity>[^,]+), type=(?P<type>[^,]+)"
)
_AER_RECEIVED = re.compile(
    r"AER: (?P<severity>Corrected|Uncorrected \(Non-Fatal\)|Uncorrected \(Fatal\)|Multiple \w+) error (?:message "
    r")?received(?: from|:) " + _BUS
)
_AER_STATUS = re.compile(r"aer_(?P<which>uncor|cor)_status: (?P<status>0x[0-9a-fA-F]+)")
_NVRM = re.compile(
    r"NVRM: (?P<message>.*(?:fallen off the bus|failed|error|Error|mismatch|not supported|RmInitAdapter|timeout|Timeout"
    r"|No NVIDIA (?:graphics adapter|GPU) (?:probed|found)|probe routine was not called|not responding).*)"
)
_NVRM_BUS = re.compile(r"(?:GPU at |GPU |device )" + _BUS)


@dataclass(frozen=True)
class KernelEvent:
    """One GPU event of the kernel log."""

    kind: str  #: "xid", "aer", "nvrm"
    line: int  #: 1-based line number in the log
    text: str  #: the line as it was
    bus: str | None  #: the normalised PCI bus id (0000:2b:00), when the line names one
    severity: str  #: "fail" or "warn"
    code: int | None = None  #: the Xid
    detail: str = ""  #: the rest of the message (an Xid's own words, an AER's type)


def normalize_bus(text: str) -> str:
    """A PCI bus id in one form, ``domain:bus:device`` in lower case, whatever its writer.

    >>> normalize_bus("PCI:0000:2B:00"), normalize_bus("00000000:2B:00.0"), normalize_bus("0000:2b:00.0")
    ('0000:2b:00', '0000:2b:00', '0000:2b:00')
    """
    raw = text.removeprefix("PCI:").split(".")[0].lower()
    domain, bus, device = raw.split(":")[-3:]
    return f"{int(domain, 16):04x}:{bus}:{device}"


def parse(text: str) -> list[KernelEvent]:
    """The GPU events of a kernel log, in order."""
    events = []
    for number, line in enumerate(text.splitlines(), 1):
        found = event(line.rstrip(), number)
        if found is not None:
            events.append(found)
    return events


def event(line: str, number: int) -> KernelEvent | None:
    """The GPU event one kernel log line reports (line ``number``), or None."""
    xid = _XID.search(line)
    if xid:
        code = int(xid["xid"])
        known = CATALOG.get(code)
        return KernelEvent(
            "xid",
            number,
            line,
            normalize_bus(xid["bus"]),
            known.severity if known else "fail",
            code,
            xid["rest"].strip(),
        )
    aer = _AER_DEVICE.search(line) or _AER_RECEIVED.search(line)
    if aer:
        severity = aer["severity"].strip()
        detail = f"{severity}" + (
            f", {aer['type'].strip()}" if "type" in aer.groupdict() and aer.groupdict().get("type") else ""
        )
        return KernelEvent(
            "aer",
            number,
            line,
            normalize_bus(aer["bus"]),
            "warn" if severity.startswith("Corrected") else "fail",
            None,
            detail,
        )
    status = _AER_STATUS.search(line)
    if status and int(status["status"], 16):
        bus = _NVRM_BUS.search(line)
        which = "Uncorrected" if status["which"] == "uncor" else "Corrected"
        severity = "warn" if which == "Corrected" else "fail"
        return KernelEvent(
            "aer",
            number,
            line,
            normalize_bus(bus["bus"]) if bus else None,
            severity,
            None,
            f"{which}, status {status['status']}",
        )
    nvrm = _NVRM.search(line)
    if nvrm:
        bus = _NVRM_BUS.search(line)
        severe = "fallen off the bus" in line or "RmInitAdapter failed" in line
        return KernelEvent(
            "nvrm",
            number,
            line,
            normalize_bus(bus["bus"]) if bus else None,
            "fail" if severe else "warn",
            None,
            nvrm["message"].strip(),
        )
    return None


def _where(bus: str | None, gpus: Mapping[str, int]) -> str:
    if bus is None:
        return "a GPU (the line names no bus id)"
    index = gpus.get(bus)
    return f"GPU {index} (PCI {bus})" if index is not None else f"the device at PCI {bus} (no GPU index known for it)"


def findings(events: Iterable[KernelEvent], gpus: Mapping[str, int], source: str = "kernel log") -> list[Finding]:
    """One finding per kind of event and device (Xid code, AER severity, NVRM message), with a count.

    ``gpus`` maps normalised bus ids to GPU indexes (from NVML or nvidia-smi).
    """
    events = list(events)
    fallen = {e.bus for e in events if e.kind == "xid" and e.code == 79}
    grouped: dict[tuple[str, str | None, str], list[KernelEvent]] = {}
    for event in events:
        if event.kind == "nvrm" and event.bus in fallen and "fallen off the bus" in event.text:
            continue  # the driver's own words for the Xid 79 already reported
        key = (
            event.kind,
            event.bus,
            str(event.code)
            if event.kind == "xid"
            else event.detail.split(",")[0]
            if event.kind == "aer"
            else event.detail[:80],
        )
        grouped.setdefault(key, []).append(event)
    out = [_finding(group, gpus, source) for group in grouped.values()]
    return sorted(out, key=lambda f: (f.severity != "fail", f.evidence.line))


def _finding(group: list[KernelEvent], gpus: Mapping[str, int], source: str) -> Finding:
    first = group[0]
    where = _where(first.bus, gpus)
    evidence = Evidence(source, first.line, (first.text,), 0, len(group))
    values = {"bus": first.bus or "", "gpu": str(gpus.get(first.bus, "")) if first.bus else "", "kind": first.kind}
    severity = first.severity
    if first.kind == "xid":
        assert first.code is not None
        known = CATALOG.get(first.code)
        meaning = known.meaning if known else "an Xid this catalog summary does not list"
        action = (
            known.todo
            if known
            else f"Look it up in NVIDIA's Xid catalog ({CATALOG_URL}); treat it as a GPU fault until then: {_RESET}"
        )
        title = f"Xid {first.code} on {where}: {meaning}"
        cause = (
            f"The NVIDIA driver reported Xid {first.code}"
            + (f" ({known.mnemonic}, action {known.action})" if known else "")
            + f" on {where}: {meaning}. Its words: {first.detail}"
        )
        command = f"nvidia-smi -q -i {values['gpu']}" if values["gpu"] else "nvidia-smi -q"
        more = {"xid": str(first.code), "action": known.action if known else "UNKNOWN"}
        return Finding(
            f"xid-{first.code}",
            title,
            severity,
            "driver",
            cause,
            Fix(action, (command,)),
            CATALOG_URL,
            evidence,
            (),
            {**values, **more},
        )
    if first.kind == "aer":
        fatal = first.severity == "fail"
        title = f"PCIe AER {first.detail.split(',')[0]} error on {where}"
        details = ", ".join(dict.fromkeys(e.detail for e in group))
        cause = (
            f"The PCIe link of {where} reported {'an uncorrected' if fatal else 'a corrected'} error ({details}). "
            + (
                "Uncorrected errors lose transactions: the GPU may fall off the bus."
                if fatal
                else "Corrected errors cost retries; many of them point at a marginal link (riser, slot, signal "
                "integrity)."
            )
        )
        todo = (
            "Check the slot, riser and cabling of that GPU; `lspci -vvv -s BUS` shows the link's error status; a "
            "link that keeps erring should be serviced."
        )
        command = f"sudo lspci -vvv -s {first.bus}" if first.bus else "sudo lspci -vvv"
        return Finding(
            "pcie-aer",
            title,
            severity,
            "driver",
            cause,
            Fix(todo, (command,)),
            "https://docs.kernel.org/PCI/pcieaer-howto.html",
            evidence,
            (),
            values,
        )
    title = f"NVRM on {where}: {first.detail[:120]}"
    cause = f"The NVIDIA kernel driver logged: {first.detail}"
    todo = (
        _REBOOT
        if first.severity == "fail"
        else "Read the message; `nvidia-smi` and `stackgate verify --check 'gpu.*'` show whether the GPU still answers."
    )
    return Finding(
        "nvrm-message", title, severity, "driver", cause, Fix(todo, ("nvidia-smi",)), CATALOG_URL, evidence, (), values
    )
