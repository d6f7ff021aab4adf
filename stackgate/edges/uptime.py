"""How long this process has run, start-up included (the interpreter, the imports, the command line's
parsing), read from the kernel: the time a person waited for a command, which a clock started inside
the command leaves out."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["process_elapsed_s"]


def process_elapsed_s(pid: int | str = "self") -> float | None:
    """Seconds since the process started (Linux's /proc, 10 ms steps), or None where /proc cannot tell.

    >>> 0 <= (process_elapsed_s() or 0) < 3600
    True
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        since_boot = float(Path("/proc/uptime").read_text().split()[0])
        started_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks since boot
        elapsed = since_boot - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return max(elapsed, 0.0)
