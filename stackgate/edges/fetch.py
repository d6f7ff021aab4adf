"""Downloads checked against a sha256 before anything uses them, and file hashes.

One place for both: the URL wheel provision installs (sgl-kernel's cu130 build) and the CUDA
runfile it runs (4 GB) go through the same path: stream into ``.<name>.part`` beside the target,
hash while writing, keep the file only when the hash is the lock's.

A dropped connection, a timeout or a 5xx answer is tried again, a bounded number of times with a
doubling wait, and the next try asks only for the bytes still missing (an HTTP ``Range`` request);
a server that ignores the range (200 instead of 206) is read again from the start. The part file
survives a failed or killed run, so the next run resumes it too; an flock on it keeps two
processes from writing the same part. Whatever was resumed, the whole file's sha256 decides. The
part is opened without following a symbolic link and only as a regular file of this user that no
one else may write and that has no other name (:mod:`stackgate.edges.owned`): a link or a file
planted there is refused (:class:`PartRefused`), never written through.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import http.client
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

from stackgate.edges import owned

__all__ = [
    "RETRY",
    "FetchError",
    "HashMismatch",
    "PartRefused",
    "Retry",
    "amount",
    "check_file",
    "fetch_checked",
    "sha256_file",
    "unreachable",
]

Progress = Callable[[int, "int | None"], None]
#: HTTP answers that say "try again later", not "this will never work".
_TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_CHUNK = 1 << 20


class FetchError(Exception):
    """A download that failed, or whose bytes are not the ones the lock names."""


class HashMismatch(FetchError):
    def __init__(self, origin: str, have: str, want: str) -> None:
        self.have, self.want = have, want
        super().__init__(f"{origin} has sha256 {have}, the lock says {want}")


class PartRefused(FetchError):
    """A part file that is not this user's own regular file (a planted link, another user's file): refused."""


class _Transient(Exception):
    """One try failed in a way another try may not (the connection, not the file)."""


@dataclass(frozen=True)
class Retry:
    """How often a download is tried in all, and the wait before each new try (doubling, capped).

    ``sleep`` is what waits: tests pass one that only records.
    """

    attempts: int = 5
    first_wait_s: float = 1.0
    max_wait_s: float = 30.0
    sleep: Callable[[float], None] = time.sleep

    def wait_s(self, failed: int) -> float:
        """Seconds to wait after the ``failed``-th failed try.

        >>> [Retry().wait_s(n) for n in (1, 2, 3, 6, 7)]
        [1.0, 2.0, 4.0, 30.0, 30.0]
        """
        return min(self.first_wait_s * 2 ** (failed - 1), self.max_wait_s)


RETRY = Retry()


def amount(done: int, total: int | None) -> str:
    """How far a download got, for a progress line.

    >>> amount(1_500_000, 4_300_000_000), amount(2_000_000, None)
    ('1.5 MB of 4300.0 MB', '2.0 MB')
    """
    return f"{done / 1e6:.1f} MB" + (f" of {total / 1e6:.1f} MB" if total else "")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_file(path: Path, want: str, origin: str | None = None) -> None:
    """Raise :class:`HashMismatch` unless ``path`` hashes to ``want``."""
    have = sha256_file(path)
    if have != want:
        raise HashMismatch(origin or str(path), have, want)


def fetch_checked(
    url: str,
    target: Path,
    want: str,
    *,
    timeout_s: float = 60.0,
    on_progress: Progress | None = None,
    on_retry: Callable[[str], None] | None = None,
    retry: Retry = RETRY,
) -> bool:
    """Make ``target`` the file at ``url`` with sha256 ``want``; False when it was already there.

    Nothing is ever at ``target`` unless its hash is right. A download that gives up leaves its
    part file for the next run to resume; a wrong hash removes it. ``on_progress(done, total)``
    follows the bytes; ``on_retry(text)`` hears about each new try.
    """
    if target.is_file() and sha256_file(target) == want:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    notify = on_retry or (lambda text: None)
    with _Part.locked(target.with_name(f".{target.name}.part")) as part:
        if target.is_file() and sha256_file(target) == want:
            part.discard()  # another process finished it while this one waited for the part's lock
            return False
        _fill(url, part, timeout_s, on_progress, notify, retry)
        if part.digest.hexdigest() != want and part.carried:
            # The bytes an earlier run left may be what is wrong: one more go from nothing.
            notify(f"{url}: the resumed file has the wrong sha256; downloading it again from the start")
            part.restart()
            _fill(url, part, timeout_s, on_progress, notify, retry)
        have = part.digest.hexdigest()
        if have != want:
            part.discard()
            raise HashMismatch(url, have, want)
        os.replace(part.path, target)
    return True


def _fill(
    url: str, part: _Part, timeout_s: float, on_progress: Progress | None, on_retry: Callable[[str], None], retry: Retry
) -> None:
    """Try until the server has sent the whole file into ``part``, at most ``retry.attempts`` times."""
    for attempt in range(1, retry.attempts + 1):
        try:
            _attempt(url, part, timeout_s, on_progress)
            return
        except _Transient as exc:
            if attempt == retry.attempts:
                raise FetchError(
                    f"cannot download {url}: {exc} (gave up after {attempt} tries; the next run resumes at byte "
                    f"{part.size})"
                ) from exc
            wait = retry.wait_s(attempt)
            at = f", resuming at byte {part.size}" if part.size else ""
            on_retry(f"{url}: {exc}; trying again in {wait:g} s (try {attempt + 1} of {retry.attempts}{at})")
            retry.sleep(wait)


def _attempt(url: str, part: _Part, timeout_s: float, on_progress: Progress | None) -> None:
    headers = {"Range": f"bytes={part.size}-"} if part.size else {}
    if part.size and part.validator:
        headers["If-Range"] = part.validator  # a changed file comes back whole (200), not spliced
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as response:
            total = _accept(response, part)
            _stream(response, part, total, on_progress)
    except urllib.error.HTTPError as exc:
        if exc.code == 416:  # the part is not a prefix of what is there now
            part.restart()
            raise _Transient("the server refused to resume (HTTP 416); starting again") from exc
        if exc.code in _TRANSIENT_STATUS:
            raise _Transient(f"HTTP Error {exc.code}: {exc.reason}") from exc
        raise FetchError(f"cannot download {url}: HTTP Error {exc.code}: {exc.reason}") from exc
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as exc:
        raise _Transient(f"{getattr(exc, 'reason', None) or exc or type(exc).__name__}") from exc
    except ValueError as exc:  # not a URL urllib can open: trying again changes nothing
        raise FetchError(f"cannot download {url}: {exc}") from exc


def _accept(response: http.client.HTTPResponse, part: _Part) -> int | None:
    """Line the part up with what the server sends; the file's whole size when it says."""
    part.validator = response.headers.get("ETag") or response.headers.get("Last-Modified")
    if response.status == 206:
        match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
        if match is None or int(match[1]) != part.size:
            part.restart()
            raise _Transient(
                f"the server answered another range ({response.headers.get('Content-Range')!r}) than bytes={part.size}-"
            )
        return int(match[3]) if match[3] != "*" else None
    if part.size:
        part.restart()  # the range was ignored: this answer is the whole file
    length = response.headers.get("Content-Length")
    return int(length) if length and length.isdigit() else None


def _stream(response: http.client.HTTPResponse, part: _Part, total: int | None, on_progress: Progress | None) -> None:
    while True:
        try:
            chunk = response.read(_CHUNK)
        except OSError as exc:  # reset, timed out, TLS torn down: the connection, not the file
            raise _Transient(f"{type(exc).__name__}: {exc}") from exc
        if not chunk:
            break
        part.append(chunk)
        if on_progress is not None:
            on_progress(part.size, total)
    if total is not None and part.size < total:
        raise _Transient(f"the connection closed at byte {part.size} of {total}")


class _Part:
    """The part file of one download, locked, with the sha256 of what it holds so far."""

    def __init__(self, path: Path, file: IO[bytes]) -> None:
        self.path, self.file = path, file
        self.digest = hashlib.sha256()
        self.size = 0
        self.carried = 0  #: bytes an earlier run left (resumed, not fetched by this one)
        self.validator: str | None = None  #: the ETag or Last-Modified of the answer being resumed

    @classmethod
    def locked(cls, path: Path) -> _Part:
        """Open and lock the part at ``path``, waiting while another process downloads it."""
        while True:
            try:  # never through a planted link, never another user's file or one linked elsewhere too
                fd = owned.open_owned(path, os.O_RDWR | os.O_CREAT, 0o644)
            except owned.UntrustedError as exc:
                raise PartRefused(f"cannot download into {path}: {exc.strerror}") from exc
            file = os.fdopen(fd, "r+b")
            fcntl.flock(file.fileno(), fcntl.LOCK_EX)
            if _same_file(file, path):
                part = cls(path, file)
                part._take_over()
                return part
            file.close()  # the holder renamed or removed it while this one waited: open the new one

    def __enter__(self) -> _Part:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()  # closing drops the lock

    def _take_over(self) -> None:
        self.file.seek(0)
        while chunk := self.file.read(_CHUNK):
            self.digest.update(chunk)
            self.size += len(chunk)
        self.carried = self.size

    def append(self, chunk: bytes) -> None:
        try:
            self.file.seek(self.size)
            self.file.truncate()  # a write that failed half-way left bytes the digest does not cover
            self.file.write(chunk)
            self.file.flush()
        except OSError as exc:  # a full disk: no new try helps
            raise FetchError(f"cannot write {self.path}: {exc.strerror or exc}") from exc
        self.digest.update(chunk)
        self.size += len(chunk)

    def restart(self) -> None:
        self.file.truncate(0)
        self.digest, self.size, self.carried, self.validator = hashlib.sha256(), 0, 0, None

    def discard(self) -> None:
        self.restart()
        self.path.unlink(missing_ok=True)


def _same_file(file: IO[bytes], path: Path) -> bool:
    try:
        return os.lstat(path).st_ino == os.fstat(file.fileno()).st_ino
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return False
        raise


def unreachable(url: str, timeout_s: float = 10.0) -> str | None:
    """Why nothing answers at ``url``; None when a server answers, whatever its status (an
    index root may well say 404 or 405 to a HEAD request)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s):
            return None
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        return str(getattr(exc, "reason", None) or exc)
