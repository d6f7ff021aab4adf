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
"""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from stackgate.models.fleet import Node

__all__ = ["CommandTimeout", "Completed", "Session", "SshTransport", "Stopped", "Transport", "TransportError"]

_CHUNK = 1 << 16
_POLL_S = 0.02  # select() wakes on output, not on the exit status: this bounds the wait for the latter


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


class Session(Protocol):
    def run(self, command: str, *, timeout_s: float, stdin: bytes | None = None, stop: threading.Event | None = None) -> Completed:
        """Run a shell command line on the node; its exit status and output."""
        ...

    def close(self) -> None: ...


class Transport(Protocol):
    def connect(self, node: Node) -> Session:
        """A session on the node, or :class:`TransportError`."""
        ...


class SshTransport:
    """Sessions over SSH (paramiko): one client per node, opened per call of :meth:`connect`."""

    def connect(self, node: Node) -> Session:
        import paramiko  # type: ignore[import-untyped]  # imported on first use: a single-node command never pays for it

        client = paramiko.SSHClient()
        try:
            if node.known_hosts is not None:
                client.load_host_keys(str(node.known_hosts))
            else:
                client.load_system_host_keys()  # ~/.ssh/known_hosts, where there is one
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
            client.connect(
                node.host, port=node.port, username=node.user, key_filename=str(node.identity) if node.identity else None,
                timeout=node.connect_timeout_s, banner_timeout=node.connect_timeout_s, auth_timeout=node.connect_timeout_s,
                channel_timeout=node.connect_timeout_s, allow_agent=node.identity is None, look_for_keys=node.identity is None,
            )  # fmt: skip
        except (paramiko.SSHException, OSError, EOFError, ValueError) as exc:
            client.close()
            raise TransportError(_why(exc, node)) from exc
        return SshSession(client, node)


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

    def run(self, command: str, *, timeout_s: float, stdin: bytes | None = None, stop: threading.Event | None = None) -> Completed:
        import paramiko

        try:
            channel = self._client.get_transport().open_session(timeout=self._node.connect_timeout_s)
            channel.exec_command(command)
            if stdin is not None:
                channel.sendall(stdin)
            channel.shutdown_write()
            return _drain(channel, time.monotonic() + timeout_s, timeout_s, stop)
        except (paramiko.SSHException, OSError, EOFError, AttributeError) as exc:
            raise TransportError(_why(exc, self._node)) from exc

    def close(self) -> None:
        self._client.close()


def _rest(receive: Callable[[int], bytes]) -> bytes:
    """Everything left in a stream of a channel whose command has exited (up to its end)."""
    found = bytearray()
    while chunk := receive(_CHUNK):
        found += chunk
    return bytes(found)


def _drain(channel: Any, deadline: float, timeout_s: float, stop: threading.Event | None) -> Completed:
    """Read both streams until the command exits; a timeout or a stop leaves it running."""
    out, err = bytearray(), bytearray()
    try:
        while True:
            if channel.recv_ready():
                out += channel.recv(_CHUNK)
            elif channel.recv_stderr_ready():
                err += channel.recv_stderr(_CHUNK)
            elif channel.exit_status_ready():
                break
            elif stop is not None and stop.is_set():
                raise Stopped("stopped")
            elif time.monotonic() > deadline:
                raise CommandTimeout(f"no end within {timeout_s:g} s")
            else:
                select.select([channel], [], [], _POLL_S)
        out += _rest(channel.recv)  # what arrived between the checks above
        err += _rest(channel.recv_stderr)
        code = channel.recv_exit_status()
    finally:
        channel.close()
    return Completed(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
