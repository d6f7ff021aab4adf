"""Read the kernel log of this boot: ``/dev/kmsg``, else ``dmesg``, else ``journalctl -k -b``.

The one place stackgate reads the kernel's ring buffer. Reading it may need privileges
(``kernel.dmesg_restrict``): when the record device cannot be read, ``dmesg`` is tried (it may
read it another way), then the systemd journal's copy; when none answers, :class:`KernelLogError`
says why for each. The record device is read here, in this process, because starting ``dmesg``
took 86 ms in a profiled run on an H200 host, and a cached verify waits for the kernel log; what it gives is the text
``dmesg`` prints (:func:`dmesg_lines`).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from stackgate.edges import runner
from stackgate.models import settings

__all__ = ["COMMANDS", "KernelLog", "KernelLogError", "dmesg_lines", "read"]

#: The readers tried after the record device, in order: this boot's kernel messages, with their timestamps.
#: ``--quiet``: a journal without kernel lines prints nothing, not ``-- No entries --`` (exit 0 both ways).
COMMANDS = (("dmesg",), ("journalctl", "-k", "-b", "--no-pager", "-o", "short-precise", "--quiet"))
#: One read(2) of the record device returns one record; the kernel's are far smaller than this.
_RECORD_BYTES = 16384
#: A buffer that keeps filling as it is read (a flood of messages) is read this far.
_MAX_BYTES = 64 << 20
_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


class KernelLogError(Exception):
    """No reader of the kernel log answered."""


@dataclass(frozen=True)
class KernelLog:
    source: str  #: what printed it: the record device's path, or the command
    text: str


def read(timeout_s: float = 20.0, kmsg: Path | None = None) -> KernelLog:
    """This boot's kernel log from the first reader that answers: the record device (``kmsg``,
    default $STACKGATE_KMSG), then each of :data:`COMMANDS`."""
    device = settings.KMSG.value() if kmsg is None else kmsg
    text, why = _read_records(device)
    if text:
        return KernelLog(str(device), text)
    reasons = [f"{device}: {why}"]
    for argv in COMMANDS:
        done = runner.run(argv, timeout_s=timeout_s)
        if done.returncode == 0 and done.stdout.strip():
            return KernelLog(" ".join(argv), done.stdout)
        lines = (done.stderr or done.stdout).strip().splitlines()
        reasons.append(f"{' '.join(argv)}: {lines[-1] if lines else f'exit {done.returncode}, no output'}")
    raise KernelLogError(
        "cannot read the kernel log ("
        + "; ".join(reasons)
        + "); run as root or allow it (sysctl kernel.dmesg_restrict=0)"
    )


def _read_records(device: Path) -> tuple[str, str]:
    """(the text ``dmesg`` would print from every record the device holds, why it is empty)."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return "", exc.strerror or str(exc)
    lines: list[str] = []
    try:
        if not stat.S_ISCHR(os.fstat(fd).st_mode):
            return "", "not a character device"
        total = 0
        while total < _MAX_BYTES:
            try:
                record = os.read(fd, _RECORD_BYTES)
            except BlockingIOError:
                break  # every record read
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # overwritten while read: the next read resumes at the oldest left
                return "", exc.strerror or str(exc)
            if not record:
                break
            total += len(record)
            lines += dmesg_lines(record)
    finally:
        os.close(fd)
    return "".join(lines), "no records"


def dmesg_lines(record: bytes) -> list[str]:
    """One record of the kernel's record device as ``dmesg`` prints it: ``[seconds.micros] message``,
    the ``\\xNN`` escapes undone, a message of several lines indented under its first, the record's
    dictionary lines (`` KEY=value``) left out.

    >>> dmesg_lines(b"6,90,249129,-;rcu: \\\\x09RCU restricting CPUs\\n SUBSYSTEM=acpi\\n")
    ['[    0.249129] rcu: \\tRCU restricting CPUs\\n']
    >>> dmesg_lines(b"4,7,1279336020,-;first\\\\x0asecond\\n")
    ['[ 1279.336020] first\\n', '               second\\n']
    >>> dmesg_lines(b"not a record")
    []
    """
    head, found, rest = record.partition(b";")
    fields = head.split(b",")
    if not found or len(fields) < 3 or not fields[2].isdigit():
        return []
    micros = int(fields[2])
    message = _ESCAPE.sub(lambda m: bytes([int(m[1], 16)]), rest.split(b"\n", 1)[0]).decode("utf-8", "replace")
    prefix = f"[{micros // 1_000_000:5d}.{micros % 1_000_000:06d}] "
    first, *more = message.split("\n")
    return [f"{prefix}{first}\n", *(f"{' ' * len(prefix)}{line}\n" for line in more)]
