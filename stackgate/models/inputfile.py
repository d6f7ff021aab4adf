"""Reading an input file that may be hostile (a spec, a pylock, an inventory): a regular file only,
and only up to a size, so that no FIFO hangs a command and no ``/dev/zero`` or 50 MB file is read
whole. A refusal is an :class:`InputFileError`, an :class:`OSError` whose ``strerror`` says why:
every reader already turns ``OSError`` into its own "cannot read" error with the path (exit 2)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = ["InputFileError", "MAX_INVENTORY_BYTES", "MAX_PYLOCK_BYTES", "MAX_SPEC_BYTES", "read_capped"]

MAX_SPEC_BYTES = 1 << 20  #: a spec is a few KB
MAX_PYLOCK_BYTES = 16 << 20  #: sglang's whole stack locks into 112 KB (169 distributions)
MAX_INVENTORY_BYTES = 4 << 20  #: 10,000 hosts fit in well under 1 MB

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class InputFileError(OSError):
    """An input file refused unread (not a regular file, or too large)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EINVAL, message)


def read_capped(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, a regular file (after symlinks) of at most ``limit`` bytes.

    Raises :class:`FileNotFoundError`, :class:`IsADirectoryError`, :class:`InputFileError` or
    another :class:`OSError`. A FIFO is opened without blocking, so it is refused, not waited on.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a file")
            shown = f" ({os.path.realpath(path)})" if os.path.islink(path) else ""
            raise InputFileError(f"is {kind}{shown}, not a regular file: refused unread")
        if info.st_size > limit:
            raise InputFileError(_too_large(info.st_size, limit))
        os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # it grew while being read
            raise InputFileError(_too_large(size, limit))
        return b"".join(chunks)
    finally:
        os.close(fd)


def _too_large(size: int, limit: int) -> str:
    """
    >>> _too_large(52_428_800, 16 << 20)
    'is 52428800 bytes, more than the 16 MiB such a file may be: refused unread'
    """
    return f"is {size} bytes, more than the {limit >> 20} MiB such a file may be: refused unread"
