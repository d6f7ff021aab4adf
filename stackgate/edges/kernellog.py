"""Read the kernel log of this boot: ``dmesg``, else ``journalctl -k -b``.

The one place stackgate reads the kernel's ring buffer. Reading it may need privileges
(``kernel.dmesg_restrict``): when ``dmesg`` is refused, the systemd journal's copy is tried;
when neither answers, :class:`KernelLogError` says why for each.
"""

from __future__ import annotations

from dataclasses import dataclass

from stackgate.edges import runner

__all__ = ["COMMANDS", "KernelLog", "KernelLogError", "read"]

#: The readers tried in order: this boot's kernel messages, with their timestamps.
COMMANDS = (("dmesg",), ("journalctl", "-k", "-b", "--no-pager", "-o", "short-precise"))


class KernelLogError(Exception):
    """No reader of the kernel log answered."""


@dataclass(frozen=True)
class KernelLog:
    source: str  #: the command that printed it
    text: str


def read(timeout_s: float = 20.0) -> KernelLog:
    """This boot's kernel log from the first reader that answers."""
    reasons = []
    for argv in COMMANDS:
        done = runner.run(argv, timeout_s=timeout_s)
        if done.returncode == 0 and done.stdout.strip():
            return KernelLog(" ".join(argv), done.stdout)
        why = (done.stderr or done.stdout).strip().splitlines()
        reasons.append(f"{' '.join(argv)}: {why[-1] if why else f'exit {done.returncode}, no output'}")
    raise KernelLogError(
        "cannot read the kernel log ("
        + "; ".join(reasons)
        + "); run as root or allow it (sysctl kernel.dmesg_restrict=0)"
    )
