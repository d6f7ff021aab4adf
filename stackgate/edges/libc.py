"""The C library this machine runs: the floor a wheel's manylinux tag is measured against."""

from __future__ import annotations

import os
import re

__all__ = ["glibc_version"]


def glibc_version() -> tuple[int, int] | None:
    """The running glibc as (major, minor), or None on another C library (musl) or where it cannot tell.

    >>> isinstance(glibc_version(), (tuple, type(None)))
    True
    """
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        return None
    found = re.fullmatch(r"glibc (\d+)\.(\d+)", text.strip())
    return (int(found.group(1)), int(found.group(2))) if found else None
