"""The fleet's transport: run a command on a node and read what it printed, over SSH.

The SSH engine is paramiko, the SSH layer Fabric is built on. Fabric itself (3.2.3, its newest
release) requires ``invoke<3.0``, and stackgate requires ``invoke>=3.0`` (``Context.remainder``),
so no Fabric can be installed beside stackgate; this edge does what Fabric's ``Connection.run``
and ``ThreadingGroup`` do for the fleet, on the same paramiko: one client per node, its host key
checked against known_hosts, connect and command timeouts, and each failure a value.

A :class:`Transport` opens a :class:`Session` per node; the fleet controller (commands/fleet.py)
speaks only to these two, so a simulated transport (benchmarks/fleet_scale.py) can stand in for
SSH. Every error of the SSH layer (refused, unreachable, a host key that does not match, no
accepted key, a reset) becomes a :class:`TransportError` carrying paramiko's text, never a hang:
the connection, its handshake and its authentication each wait at most the node's
``connect_timeout_s``, and a command at most its own timeout.

The TCP connection is made here, not by paramiko, and the first bytes of the server are awaited
here: a port that accepts connections but never speaks SSH is named as such (no SSH banner
within the timeout), and a connect begun before the caller's ``stop`` is set (Ctrl-C) ends at
once when it is set, in any phase (the socket is shut down under paramiko). A connect begun
after it (the fresh connection that stops a node's remote group, or reads its last report) runs
to its own timeouts. paramiko's own log goes to a file (:func:`paramiko_log`), never to the
terminal.

What a node prints is kept up to a cap per stream (:data:`OUTPUT_CAP`, or the caller's ``limit``):
its first and its last half, with a line in between that says how much was left out
(:class:`Capped`), so a node answering ``--version`` with 1 GiB costs the controller a MiB.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from stackgate.models.inventory import Node

__all__ = [
    "OUTPUT_CAP",
    "Capped",
    "CommandTimeout",
    "Completed",
    "Session",
    "SshTransport",
    "Stopped",
    "Transport",
    "TransportError",
    "paramiko_log",
]

_CHUNK = 1 << 16
_POLL_S = 0.02  # select() wakes on output, not on the exit status: this bounds the wait for the latter
#: The most bytes of each stream of a remote command kept (its first and last half): what the
#: controller reads is a version, a folder's name, a sha256 sum, a last line (a report: its own cap).
OUTPUT_CAP = 1 << 20


class TransportError(Exception):
    """The node cannot be reached or spoken to (the text says why, as the SSH layer put it)."""


class CommandTimeout(TransportError):
    """A command ran past its timeout (it may still run on the node: the caller stops it)."""


class Stopped(TransportError):
    """The caller asked every node to stop (Ctrl-C): the command was left, still running."""


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str
    cut: int = 0  #: bytes of output left out (over the cap), both streams together

    @property
    def note(self) -> str:
        """``""``, or what the cap left out, in words."""
        return f" (its output was cut: {self.cut} bytes left out, the first and last part kept)" if self.cut else ""


class Capped:
    """One stream's bytes up to ``cap``: the first half and the last half kept, the middle counted.

    >>> kept = Capped(8)
    >>> for chunk in (b"abcd", b"efgh", b"ijkl"):
    ...     kept.add(chunk)
    >>> kept.cut, kept.text()
    (4, 'abcd\\n[stackgate: 4 bytes of output left out here: over the cap of 8 bytes kept]\\nijkl')
    """

    def __init__(self, cap: int = OUTPUT_CAP) -> None:
        self.cap = max(cap, 2)
        self._head, self._tail, self._seen = bytearray(), bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self._seen += len(chunk)
        room = self.cap // 2 - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        self._tail += chunk
        keep = self.cap - self.cap // 2
        if len(self._tail) > 2 * keep:  # trimmed now and then, not on every chunk
            del self._tail[: len(self._tail) - keep]

    @property
    def cut(self) -> int:
        return max(self._seen - self.cap, 0)

    def value(self) -> bytes:
        keep = self.cap - self.cap // 2
        tail = self._tail[-keep:] if self.cut else self._tail
        if not self.cut:
            return bytes(self._head + tail)
        said = f"\n[stackgate: {self.cut} bytes of output left out here: over the cap of {self.cap} bytes kept]\n"
        return bytes(self._head) + said.encode() + bytes(tail)

    def text(self) -> str:
        return self.value().decode("utf-8", "replace")


class Session(Protocol):
    def run(
        self,
        command: str,
        *,
        timeout_s: float,
        stdin: bytes | None = None,
        stop: threading.Event | None = None,
        limit: int = OUTPUT_CAP,
    ) -> Completed:
        """Run a shell command line on the node; its exit status and output (each stream kept up to
        ``limit`` bytes: :class:`Capped`)."""
        ...

    def close(self) -> None: ...


class Transport(Protocol):
    def connect(self, node: Node) -> Session:
        """A session on the node, or :class:`TransportError`."""
        ...


@contextlib.contextmanager
def paramiko_log(path: Path) -> Iterator[None]:
    """paramiko's own log (its ``Exception (client): ...`` lines among them) into ``path`` (made
    only when something is logged) while inside, and nowhere after: never on the terminal."""
    logger = logging.getLogger("paramiko")
    logger.propagate = False
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())  # else Python's last-resort handler prints to stderr
    handler = _LazyFile(path, delay=True, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()


class _LazyFile(logging.FileHandler):
    """A log file made (with its folder) only when something is logged; one that cannot be
    written is dropped (logging's default prints a traceback to stderr)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.stream is None:
                Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
            super().emit(record)
        except OSError:
            pass

    def handleError(self, record: logging.LogRecord) -> None:
        pass


class SshTransport:
    """Sessions over SSH (paramiko): one client per node, opened per call of :meth:`connect`;
    connects begun before ``stop`` is set end when it is (see the module's docstring)."""

    def __init__(self, stop: threading.Event | None = None) -> None:
        self._stop = stop
        self._dialing: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._watching = False

    def connect(self, node: Node) -> Session:
        # imported on first use: a single-node command never pays for it
        import paramiko  # type: ignore[import-untyped]

        # a stop set already: this is a cleanup connect (stopping a node's group), run to its timeouts
        stop = self._stop if self._stop is not None and not self._stop.is_set() else None
        sock = _dial(node, stop)
        client = paramiko.SSHClient()
        try:
            self._cancellable(sock, stop)
            _await_banner(sock, node, stop)
            if node.known_hosts is not None:
                client.load_host_keys(str(node.known_hosts))
            else:
                client.load_system_host_keys()  # ~/.ssh/known_hosts, where there is one
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            client.connect(
                node.host,
                port=node.port,
                username=node.user,
                key_filename=str(node.identity) if node.identity else None,
                sock=sock,
                timeout=node.connect_timeout_s,
                banner_timeout=node.connect_timeout_s,
                auth_timeout=node.connect_timeout_s,
                channel_timeout=node.connect_timeout_s,
                allow_agent=node.identity is None,
                look_for_keys=node.identity is None,
            )
        except Exception as exc:  # a hostile server can make paramiko raise anything (IndexError): each a value
            client.close()
            sock.close()
            if stop is not None and stop.is_set():
                raise Stopped(f"{node.address}: interrupted while connecting") from exc
            if isinstance(exc, TransportError):
                raise
            known = isinstance(exc, (paramiko.SSHException, OSError, EOFError, ValueError))
            failed = f"the SSH handshake failed ({type(exc).__name__}: {exc}; the SSH layer's log has the rest)"
            why = _why(exc, node) if known else f"{node.address}: {failed}"
            raise TransportError(why) from exc
        finally:
            with self._lock:
                self._dialing.discard(sock)
        return SshSession(client, node)

    def _cancellable(self, sock: socket.socket, stop: threading.Event | None) -> None:
        """Shut ``sock`` down when ``stop`` is set, until it is connected (one watcher a transport)."""
        if stop is None:
            return
        with self._lock:
            self._dialing.add(sock)
            if not self._watching:
                self._watching = True
                threading.Thread(target=self._watch, args=(stop,), name="ssh-stop", daemon=True).start()

    def _watch(self, stop: threading.Event) -> None:
        stop.wait()
        with self._lock:
            for sock in self._dialing:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


_SLICE_S = 0.1  #: how often a connect in progress looks at ``stop``
_WAITING = (errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK)


def _dial(node: Node, stop: threading.Event | None) -> socket.socket:
    """A TCP connection to the node within its connect timeout, given up at once on ``stop``."""
    deadline = time.monotonic() + node.connect_timeout_s
    try:
        addresses = socket.getaddrinfo(node.host, node.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise TransportError(f"{node.address}: cannot connect: {exc.strerror or exc}") from exc
    problems: list[str] = []
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            _connect(sock, address, deadline, stop)
            return sock
        except OSError as exc:
            sock.close()
            problems.append(exc.strerror or str(exc))
        except BaseException:
            sock.close()
            raise
    if problems and all(p == "timed out" for p in problems):
        raise TransportError(f"{node.address}: no answer within {node.connect_timeout_s:g} s (timed out)")
    raise TransportError(f"{node.address}: cannot connect: " + "; ".join(sorted(set(problems))))


def _connect(sock: socket.socket, address: Any, deadline: float, stop: threading.Event | None) -> None:
    """``sock.connect(address)`` by the deadline, looking at ``stop`` every slice."""
    sock.setblocking(False)
    code = sock.connect_ex(address)
    while code in _WAITING:
        if stop is not None and stop.is_set():
            raise Stopped("interrupted while connecting")
        left = deadline - time.monotonic()
        if left <= 0:
            raise OSError(errno.ETIMEDOUT, "timed out")
        if select.select([], [sock], [], min(_SLICE_S, left))[1]:
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if code:
        raise OSError(code, os.strerror(code))
    sock.setblocking(True)


def _await_banner(sock: socket.socket, node: Node, stop: threading.Event | None) -> None:
    """Wait for the server's first bytes (its SSH banner) within the connect timeout: a port that
    accepts TCP but never speaks SSH is named, not left to paramiko's "No existing session"."""
    deadline = time.monotonic() + node.connect_timeout_s
    while not select.select([sock], [], [], _SLICE_S)[0]:
        if stop is not None and stop.is_set():
            raise Stopped(f"{node.address}: interrupted while connecting")
        if time.monotonic() > deadline:
            raise TransportError(
                f"{node.address}: no SSH banner within {node.connect_timeout_s:g} s (the banner timeout): "
                "the port accepts TCP connections but does not speak SSH (is it the node's sshd port?)"
            )
    if not sock.recv(1, socket.MSG_PEEK):
        closed = "the connection was closed before the SSH banner (is it the node's sshd port?)"
        raise TransportError(f"{node.address}: {closed}")


def _why(exc: BaseException, node: Node) -> str:
    """The SSH layer's reason, with the address: ``ops@gpu01:22: [Errno 111] Connection refused``."""
    text = str(exc) or type(exc).__name__
    errors = getattr(exc, "errors", None)  # paramiko's NoValidConnectionsError: one OSError per address tried
    if isinstance(errors, dict) and errors:
        text = "cannot connect: " + "; ".join(sorted({e.strerror or str(e) for e in errors.values()}))
    if isinstance(exc, socket.timeout) or "timed out" in text:
        text = f"no answer within {node.connect_timeout_s:g} s ({text})"
    elif type(exc).__name__ == "BadHostKeyException":
        text = f"the host key does not match known_hosts: {text}"
    elif type(exc).__name__ == "SSHException" and "not found in known_hosts" in text:
        text = f"unknown host key ({text}): add the node's key to {node.known_hosts or '~/.ssh/known_hosts'} first"
    return f"{node.address}: {text}"


class SshSession:
    def __init__(self, client: Any, node: Node) -> None:
        self._client = client
        self._node = node

    def run(
        self,
        command: str,
        *,
        timeout_s: float,
        stdin: bytes | None = None,
        stop: threading.Event | None = None,
        limit: int = OUTPUT_CAP,
    ) -> Completed:
        import paramiko

        try:
            channel = self._client.get_transport().open_session(timeout=self._node.connect_timeout_s)
            channel.exec_command(command)
            if stdin is not None:
                channel.sendall(stdin)
            channel.shutdown_write()
            return _drain(channel, time.monotonic() + timeout_s, timeout_s, stop, limit)
        except (paramiko.SSHException, OSError, EOFError, AttributeError) as exc:
            raise TransportError(_why(exc, self._node)) from exc

    def close(self) -> None:
        self._client.close()


def _rest(receive: Callable[[int], bytes], into: Capped) -> None:
    """Everything left in a stream of a channel whose command has exited (up to its end)."""
    while chunk := receive(_CHUNK):
        into.add(chunk)


def _drain(
    channel: Any, deadline: float, timeout_s: float, stop: threading.Event | None, limit: int = OUTPUT_CAP
) -> Completed:
    """Read both streams until the command exits, each kept up to ``limit``; a timeout or a stop
    leaves it running."""
    out, err = Capped(limit), Capped(limit)
    try:
        while True:
            if channel.recv_ready():
                out.add(channel.recv(_CHUNK))
            elif channel.recv_stderr_ready():
                err.add(channel.recv_stderr(_CHUNK))
            elif channel.exit_status_ready():
                break
            elif stop is not None and stop.is_set():
                raise Stopped("stopped")
            elif time.monotonic() > deadline:
                raise CommandTimeout(f"no end within {timeout_s:g} s")
            else:
                select.select([channel], [], [], _POLL_S)
        _rest(channel.recv, out)  # what arrived between the checks above
        _rest(channel.recv_stderr, err)
        code = channel.recv_exit_status()
    finally:
        channel.close()
    return Completed(code, out.text(), err.text(), out.cut + err.cut)
