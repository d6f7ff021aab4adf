"""Downloads checked against a sha256 before anything uses them, and file hashes.

One place for both: the URL wheel provision installs (sgl-kernel's cu130 build) and the CUDA
runfile it runs go through the same path: stream to a .part file, hash while writing, keep the
file only when the hash is the lock's.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

__all__ = ["FetchError", "HashMismatch", "fetch_checked", "sha256_file"]

Progress = Callable[[int, "int | None"], None]


class FetchError(Exception):
    """A download that failed, or whose bytes are not the ones the lock names."""


class HashMismatch(FetchError):
    def __init__(self, origin: str, have: str, want: str) -> None:
        self.have, self.want = have, want
        super().__init__(f"{origin} has sha256 {have}, the lock says {want}")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def check_file(path: Path, want: str, origin: str | None = None) -> None:
    """Raise :class:`HashMismatch` unless ``path`` hashes to ``want``."""
    have = sha256_file(path)
    if have != want:
        raise HashMismatch(origin or str(path), have, want)


def fetch_checked(url: str, target: Path, want: str, *, timeout_s: float = 60.0, on_progress: Progress | None = None) -> bool:
    """Make ``target`` the file at ``url`` with sha256 ``want``; False when it was already there.

    Nothing is left at ``target`` unless its hash is right: a failed or tampered download only
    ever touched a .part file, which is removed.
    """
    if target.is_file() and sha256_file(target) == want:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        have = _download(url, part, timeout_s, on_progress)
        if have != want:
            raise HashMismatch(url, have, want)
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
    return True


def _download(url: str, dest: Path, timeout_s: float, on_progress: Progress | None) -> str:
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response, open(dest, "wb") as out:
            length = response.headers.get("Content-Length")
            total, done = (int(length) if length else None), 0
            while chunk := response.read(1 << 20):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if on_progress is not None:
                    on_progress(done, total)
    except urllib.error.HTTPError as exc:
        raise FetchError(f"cannot download {url}: HTTP Error {exc.code}: {exc.reason}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise FetchError(f"cannot download {url}: {getattr(exc, 'reason', None) or exc}") from exc
    return digest.hexdigest()
