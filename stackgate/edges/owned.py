"""State on disk that stackgate trusts, and writes, only as this user's own.

Launch records, the verify cache, download part files and the support bundle are opened without
following a symbolic link someone planted in their place, and checked on the open descriptor (so
no rename between the check and the read can swap them): a regular file (or a folder) owned by the
effective user that no one else may write. A file that is replaced is written to a private
temporary file beside it and renamed into place, which replaces a planted link instead of writing
through it. A refusal is an :class:`UntrustedError`, an :class:`OSError` whose ``strerror`` states
the fact and the command that fixes it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import IO, Iterator

__all__ = ["UntrustedError", "open_owned", "private_file", "private_folder", "problem", "read_owned", "replace_owned"]


class UntrustedError(OSError):
    """State on disk that is not this user's own: refused, never followed, read or written."""

    def __init__(self, path: Path | str, message: str) -> None:
        super().__init__(errno.EPERM, message, str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def problem(info: os.stat_result, owners: tuple[int, ...] | None = None) -> str | None:
    """Why a file or folder with this status is not to be trusted by this user; None when it is.

    ``owners`` are the uids allowed to own it (by default only the effective user).

    >>> mine = os.stat_result((0o100600, 0, 0, 1, os.geteuid(), 0, 0, 0, 0, 0))
    >>> problem(mine) is None
    True
    >>> problem(os.stat_result((0o100666, 0, 0, 1, os.geteuid(), 0, 0, 0, 0, 0)))
    'is writable by others (mode 0666)'
    >>> problem(os.stat_result((0o100600, 0, 0, 1, 65534, 0, 0, 0, 0, 0)), (7,))
    'is owned by uid 65534, not by this user (uid 7)'
    """
    owners = (os.geteuid(),) if owners is None else owners
    if info.st_uid not in owners:
        return f"is owned by uid {info.st_uid}, not by this user (uid {owners[0]})"
    if info.st_mode & 0o022:
        who = "others" if info.st_mode & 0o002 else "its group"
        return f"is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def private_folder(path: Path) -> int:
    """A descriptor of the folder ``path`` (made 0700 when missing): this user's own, no one else
    may write it; a folder of this user that others may only read is made private (0700).

    Its last component is never followed: a symbolic link there is refused, so nothing is ever read,
    written or removed in the folder it points to. The caller closes the descriptor.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if os.path.islink(path):
            raise UntrustedError(path, _link(path)) from exc
        raise
    info = os.fstat(fd)
    why = problem(info)
    if why is not None:
        os.close(fd)
        fix = (
            f"`chmod 700 -- {path}` (after a look at what is in it)"
            if info.st_uid == os.geteuid()
            else "run as its owner, or give this user a state folder of its own (sudo without -E, or XDG_STATE_HOME)"
        )
        raise UntrustedError(
            path, f"{why}: refused; stackgate keeps its state only in a folder of its own user (mode 0700): {fix}"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.fchmod(fd, 0o700)
    return fd


def open_owned(path: Path | str, flags: int, mode: int = 0o600, *, dir_fd: int | None = None) -> int:
    """``os.open`` of a regular file of this user that no one else may write, never through a
    symbolic link, and, to be written, with no other name (``path`` relative to ``dir_fd`` when
    given). The caller closes the descriptor."""
    shown = path if dir_fd is None else f"{_folder_of(dir_fd)}/{path}"
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UntrustedError(shown, _link(shown)) from exc
        raise
    info = os.fstat(fd)
    why = None if stat.S_ISREG(info.st_mode) else "is not a regular file"
    if why is None and flags & (os.O_WRONLY | os.O_RDWR) and info.st_nlink > 1:
        why = f"has {info.st_nlink} names (hard links): writing it would change another file"
    why = why or problem(info)
    if why is not None:
        os.close(fd)
        raise UntrustedError(
            shown,
            f"{why}: refused; stackgate trusts only its own user's files here: "
            f"`rm -- {shown}` (after a look at it), or run as its owner",
        )
    os.set_blocking(fd, True)
    return fd


def read_owned(path: Path | str, limit: int, *, dir_fd: int | None = None) -> bytes:
    """The bytes of a regular file of this user that no one else may write, at most ``limit`` of them
    (:class:`UntrustedError` otherwise)."""
    fd = open_owned(path, os.O_RDONLY, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as stream:
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise UntrustedError(path, f"is more than {limit} bytes: refused unread")
    return data


def replace_owned(name: str, data: bytes, *, dir_fd: int) -> None:
    """Write ``name`` in the folder ``dir_fd`` as a private file (0600): a temporary file renamed into
    place, so a reader never sees half of it and a planted link is replaced, not written through."""
    temporary = f".{name}.{os.getpid()}.{os.urandom(4).hex()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise


@contextlib.contextmanager
def private_file(path: Path) -> Iterator[IO[bytes]]:
    """A private (0600) temporary file beside ``path``, renamed to ``path`` when the block ends
    without an error (removed when it fails): whatever was at ``path``, a planted link included, is
    replaced, never written through."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _link(path: Path | str) -> str:
    return (
        f"is a symbolic link (to {os.readlink(path) if os.path.islink(path) else 'somewhere'}), where stackgate keeps "
        f"a file or folder of its own: refused, never followed; `rm -- {path}` (after a look at where it points)"
    )


def _folder_of(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"<folder {fd}>"
