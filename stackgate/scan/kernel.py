"""Kernel lines in any input: NVIDIA Xid events, NVRM messages and PCIe AER errors.

People paste dmesg lines into the same place as server logs and tracebacks, so the scanner
looks for them in every input, in its one pass: :data:`KERNEL_KEYS` join the prefilter, and
each line that holds one is decoded by :func:`stackgate.models.kernelevents.event` (the Xid catalog,
the bus id). The events become findings once the input is read (:func:`findings`), naming each
GPU by its index where the caller knows the bus ids (NVML).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from stackgate.models import kernelevents
from stackgate.models.finding import Finding

__all__ = ["KERNEL_KEYS", "MAX_EVENTS", "KernelLines"]

#: The literals that mark a kernel line worth decoding (each decoder's pattern holds one).
KERNEL_KEYS = (b"NVRM: ", b"PCIe Bus Error", b"AER: ", b"aer_uncor_status", b"aer_cor_status")
MAX_EVENTS = 20_000  #: events kept per input (a storm of corrected AER errors is counted in its first ones)


@dataclass
class KernelLines:
    """The kernel events of one input, in order."""

    events: list[kernelevents.KernelEvent] = field(default_factory=list)
    dropped: int = 0

    def see(self, line: str, number: int) -> bool:
        """Decode a line that holds a kernel key; True when it is a GPU event."""
        found = kernelevents.event(line.rstrip(), number)
        if found is None:
            return False
        if len(self.events) >= MAX_EVENTS:
            self.dropped += 1
        else:
            self.events.append(found)
        return True

    @property
    def xid_lines(self) -> frozenset[int]:
        """The line numbers of Xid events (the catalog explains them better than any signature)."""
        return frozenset(e.line for e in self.events if e.kind == "xid")

    def findings(self, gpus: Mapping[str, int], source: str) -> list[Finding]:
        return kernelevents.findings(self.events, gpus, source)
