"""The one HTTP edge: JSON requests and Server-Sent Event streams over the stdlib's http.client.

Nothing else in stackgate opens an HTTP connection. Every failure is an :class:`HttpError` whose
``kind`` says what happened, because callers act on it: a refused connection while an engine
loads means "still loading", a stream closed mid-way means the server went away.

Extra request headers (``Authorization: Bearer <key>`` for a server started with --api-key) are
sent as given and never appear in an error's text: an error names the URL, never the headers.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

__all__ = ["EventStream", "HttpError", "Response", "bearer", "get_json", "reachable", "request"]

#: How much a stream reads per system call at most; SSE events of a long generation stay far below.
_READ_SIZE = 65536


class HttpError(Exception):
    """An HTTP exchange that failed.

    ``kind`` is one of: ``refused`` (nothing listens), ``timeout``, ``closed`` (the peer went away
    mid-exchange), ``status`` (an unexpected HTTP status, in ``status``), ``protocol`` (not HTTP or
    not the expected content), ``aborted`` (this side cut the stream on purpose).
    """

    def __init__(self, kind: str, message: str, status: int | None = None, body: bytes = b"") -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError as exc:
            raise HttpError("protocol", f"not JSON ({exc}): {self.body[:120]!r}") from None


def bearer(key: str | None) -> dict[str, str]:
    """The header a server started with ``--api-key KEY`` requires (none without a key).

    >>> bearer("k1"), bearer(None)
    ({'Authorization': 'Bearer k1'}, {})
    """
    return {"Authorization": f"Bearer {key}"} if key else {}


def _split(url: str) -> tuple[str, int, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise HttpError("protocol", f"only http:// URLs are supported, not {url!r}")
    path = parts.path or "/"
    return parts.hostname, parts.port or 80, path + (f"?{parts.query}" if parts.query else "")


def _failure(exc: BaseException, url: str, timeout_s: float) -> HttpError:
    """Name what went wrong in the words a caller acts on."""
    if isinstance(exc, ConnectionRefusedError):
        return HttpError("refused", f"{url}: connection refused")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return HttpError("timeout", f"{url}: no answer within {timeout_s:g} s")
    if isinstance(
        exc, (http.client.RemoteDisconnected, http.client.IncompleteRead, ConnectionResetError, BrokenPipeError)
    ):
        return HttpError("closed", f"{url}: the server closed the connection ({type(exc).__name__})")
    if isinstance(exc, http.client.HTTPException):
        return HttpError("protocol", f"{url}: {type(exc).__name__}: {exc}")
    return HttpError("closed", f"{url}: {type(exc).__name__}: {exc}")


def request(
    method: str, url: str, *, body: Any = None, timeout_s: float = 10.0, headers: Mapping[str, str] | None = None
) -> Response:
    """One request on a fresh connection; a JSON ``body`` is sent as application/json."""
    host, port, path = _split(url)
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    payload = None if body is None else json.dumps(body).encode()
    sent = {**({"Content-Type": "application/json"} if payload is not None else {}), **(headers or {})}
    try:
        connection.request(method, path, body=payload, headers=sent)
        answer = connection.getresponse()
        data = answer.read()
        return Response(answer.status, data, answer.getheader("Content-Type", "") or "")
    except (OSError, http.client.HTTPException) as exc:
        raise _failure(exc, url, timeout_s) from exc
    finally:
        connection.close()


def reachable(url: str, *, timeout_s: float = 3.0) -> str | None:
    """None when a TCP connection to ``url``'s host and port (http or https) opens within
    ``timeout_s``; otherwise why not. Nothing is sent."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"not an http(s) URL: {url!r}"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            return None
    except (OSError, ValueError) as exc:
        return str(exc) or type(exc).__name__


def get_json(url: str, *, timeout_s: float = 10.0, headers: Mapping[str, str] | None = None) -> Any:
    """GET a JSON document; any status but 200 is an error."""
    answer = request("GET", url, timeout_s=timeout_s, headers=headers)
    if answer.status != 200:
        raise HttpError("status", f"{url}: HTTP {answer.status}", answer.status, answer.body)
    return answer.json()


class EventStream:
    """A POST answered with ``text/event-stream``: iterate its events' data as they arrive.

    Each item is ``(arrival, data)``: the ``time.perf_counter()`` at which the bytes that ended the
    event were read, and the event's ``data:`` payload (bytes). Another thread may call
    :meth:`abort` to cut the stream at once, e.g. when the server was seen to die.
    """

    def __init__(
        self, url: str, body: Any, *, timeout_s: float = 120.0, headers: Mapping[str, str] | None = None
    ) -> None:
        self.url = url
        self.body = body
        self._headers = dict(headers or {})
        self.timeout_s = timeout_s  #: the longest silence accepted while reading
        self._connection: http.client.HTTPConnection | None = None
        self._aborted = threading.Event()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def abort(self) -> None:
        """Cut the stream from another thread; the reader sees an ``aborted`` HttpError."""
        self._aborted.set()
        sock = self._connection.sock if self._connection is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()

    def events(self) -> Iterator[tuple[float, bytes]]:
        host, port, path = _split(self.url)
        self._connection = http.client.HTTPConnection(host, port, timeout=self.timeout_s)
        answer = self._open(path)
        buffer = b""
        while True:
            chunk = self._read(answer)
            if not chunk:
                break
            arrival = time.perf_counter()
            buffer += chunk
            *complete, buffer = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
            for event in complete:
                data = _data(event)
                if data is not None:
                    yield arrival, data
        if self._aborted.is_set():
            raise HttpError("aborted", f"{self.url}: the stream was cut on purpose")
        if buffer.strip():
            data = _data(buffer)
            if data is not None:
                yield time.perf_counter(), data

    def _open(self, path: str) -> http.client.HTTPResponse:
        assert self._connection is not None
        payload = json.dumps(self.body).encode()
        try:
            headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **self._headers}
            self._connection.request("POST", path, body=payload, headers=headers)
            answer = self._connection.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise self._error(exc) from exc
        if answer.status != 200:
            body = answer.read()
            raise HttpError("status", f"{self.url}: HTTP {answer.status}: {body[:200]!r}", answer.status, body)
        kind = answer.getheader("Content-Type", "") or ""
        if not kind.startswith("text/event-stream"):
            raise HttpError("protocol", f"{self.url}: expected text/event-stream, got {kind or 'no content type'}")
        return answer

    def _read(self, answer: http.client.HTTPResponse) -> bytes:
        try:
            return answer.read1(_READ_SIZE)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            # ValueError: the socket was shut down under a read by abort().
            raise self._error(exc) from exc

    def _error(self, exc: BaseException) -> HttpError:
        if self._aborted.is_set():
            return HttpError("aborted", f"{self.url}: the stream was cut on purpose")
        return _failure(exc, self.url, self.timeout_s)


def _data(event: bytes) -> bytes | None:
    """The ``data:`` payload of one SSE event (several data lines join with a newline)."""
    lines = [line[5:].lstrip(b" ") if line.startswith(b"data:") else None for line in event.split(b"\n")]
    data = [line for line in lines if line is not None]
    return b"\n".join(data) if data else None
