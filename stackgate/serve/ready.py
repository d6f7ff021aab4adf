"""Wait for a launched server to be ready, and stop waiting the moment it cannot be.

Ready means ``/health`` answers 200 from the server smoke launched: the socket listening on its
port belongs to one of the server's processes (read from /proc/net/tcp{,6} and the processes'
open files), or, where /proc shows no such socket, the server's own log says that it listens. A
200 from a socket that another process holds is another server, never readiness. Before that,
SGLang 0.5.9 refuses connections while it loads (the port opens only after the weights are in:
"still loading", not "dead") and answers 503 until its warm-up request has run. /health polls
run on a thread of their own, because a healthy /health takes a second or more (it runs a
one-token generation); the waiting loop itself looks at the process and the log every few tens
of milliseconds, so that an exit or a fatal log line ends the wait at once, and so does a log
silent for longer than its phase allows (a hang while loading is named by the phase it hung in,
long before ``ready_timeout_s``).
"""

from __future__ import annotations

import ipaddress
import pwd
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from stackgate.edges import httpclient
from stackgate.facts.serverlog import LogWatcher
from stackgate.models.finding import Finding
from stackgate.serve.launch import Config, Server
from stackgate.serve.procs import Listener, describe, listeners, socket_holder, socket_inodes

__all__ = [
    "COMPILING",
    "HealthPoller",
    "Monitor",
    "PortOwner",
    "Readiness",
    "port_owner",
    "silence_limit",
    "wait_ready",
]

TICK_S = 0.05
HEALTH_INTERVAL_S = 0.5
#: SGLang's /health waits for a one-token generation (up to its own 20 s health timeout).
HEALTH_TIMEOUT_S = 30.0
#: How often the server's processes are listed while waiting (they are remembered for teardown).
SCAN_INTERVAL_S = 1.0
#: The phases in which SGLang compiles kernels without writing a line (CUDA graph capture, the
#: warm-up request's first kernels): they may stay silent twice as long as the others.
COMPILING = frozenset({"graphs", "listening"})


def silence_limit(silence_s: float, phase_key: str) -> float:
    """The longest silence accepted in a phase: ``silence_s``, twice that while compiling.

    >>> silence_limit(300.0, "weights"), silence_limit(300.0, "graphs")
    (300.0, 600.0)
    """
    return silence_s * 2 if phase_key in COMPILING else silence_s


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str  #: "ready", "exited", "fatal", "timeout", "silent" (a hang), "not ours" (another server answered)
    seconds: float
    phase: str  #: the last phase the log revealed
    exit_code: int | None = None
    finding: Finding | None = None
    failed_at: float | None = None  #: time.time() when the failure was seen (for detection-latency figures)
    detail: str = ""  #: "silent": how long and the phase's limit; "not ours": who holds the port
    proof: str = ""  #: "ready": how the answering server was known to be ours


@dataclass(frozen=True)
class PortOwner:
    """Whose socket listens on the server's port: ``ours`` True, False, or None (cannot be told)."""

    ours: bool | None
    text: str


def port_owner(server: Server, host: str, port: int) -> PortOwner:
    """Whether the socket that answers on ``host:port`` belongs to one of the server's processes;
    when it does not, who holds it (a pid and command line, or the socket's uid)."""
    answering = _answering(listeners(port), host)
    if not answering:
        return PortOwner(None, f"no socket listening on port {port} is visible in /proc/net/tcp")
    mine: dict[int, int] = {}
    for pid in {server.pid, *server.tree.alive()}:
        mine.update(dict.fromkeys(socket_inodes(pid), pid))
    strangers = [s for s in answering if s.inode not in mine]
    if not strangers:
        return PortOwner(
            True, f"its listening socket belongs to pid {mine[answering[0].inode]}, a process of the server"
        )
    stranger = strangers[0]
    holder = socket_holder(stranger.inode)
    if holder is not None:
        return PortOwner(False, f"pid {describe(holder)}")
    return PortOwner(False, f"a process of {_user(stranger.uid)} that this user cannot inspect")


def _answering(found: Sequence[Listener], host: str) -> list[Listener]:
    """The sockets a connection to ``host`` reaches: those bound to one of its addresses, else the
    wildcard ones.

    >>> found = [Listener("127.0.0.1", 1, 0, 1), Listener("::", 1, 0, 2), Listener("10.0.0.1", 1, 0, 3)]
    >>> [[s.inode for s in _answering(found, h)] for h in ("127.0.0.1", "10.0.0.2", "0.0.0.0")]
    [[1], [2], [1, 2, 3]]
    """
    try:
        wanted = {ipaddress.ip_address(host)}
    except ValueError:
        try:
            wanted = {ipaddress.ip_address(info[4][0]) for info in socket.getaddrinfo(host, None)}
        except (OSError, ValueError):
            return list(found)
    if any(address.is_unspecified for address in wanted):
        return list(found)
    exact = [s for s in found if ipaddress.ip_address(s.address) in wanted]
    return exact or [s for s in found if ipaddress.ip_address(s.address).is_unspecified]


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


class HealthPoller:
    """Polls ``<url><path>`` (the engine's health endpoint, ``/health``) on a daemon thread; ``last``
    is the latest answer."""

    def __init__(self, base_url: str, interval_s: float = HEALTH_INTERVAL_S, path: str = "/health") -> None:
        self.url = f"{base_url}{path}"
        self.interval_s = interval_s
        self.last = "no answer yet"
        self.ok = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="smoke-health", daemon=True)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status = httpclient.request("GET", self.url, timeout_s=HEALTH_TIMEOUT_S).status
                self.last = f"HTTP {status}"
                if status == 200:
                    self.ok.set()
                    return
            except httpclient.HttpError as exc:
                # Refused: the port is not open yet, which during loading means "still loading".
                self.last = "still loading (connection refused)" if exc.kind == "refused" else exc.kind
            self._stop.wait(self.interval_s)


@dataclass(frozen=True)
class _Limits:
    host: str
    port: int
    timeout_s: float
    silence_s: float


def wait_ready(
    server: Server,
    watcher: LogWatcher,
    config: Config,
    timeout_s: float,
    show: Callable[[str, float], None] | None = None,
    *,
    silence_s: float | None = None,
) -> Readiness:
    """Wait up to ``timeout_s`` for /health 200 from our own server; stop at the server's exit, a
    fatal log line, a log silent for longer than its phase allows (``silence_s``, see
    :func:`silence_limit`), or a 200 from a socket that another process holds."""
    limits = _Limits(config.host, config.port, timeout_s, silence_s if silence_s is not None else timeout_s)
    begun = time.monotonic()
    next_scan = begun
    with HealthPoller(config.base_url, path=config.engine.health_path) as health:
        while True:
            watcher.poll()
            elapsed = time.monotonic() - begun
            if time.monotonic() >= next_scan:
                server.tree.scan()
                next_scan = time.monotonic() + SCAN_INTERVAL_S
            ended = _ended(server, watcher, health, elapsed, limits)
            if ended is not None:
                return ended
            if show is not None:
                show(watcher.phase, elapsed)
            time.sleep(TICK_S)


def _ended(
    server: Server, watcher: LogWatcher, health: HealthPoller, elapsed: float, limits: _Limits
) -> Readiness | None:
    code = server.exit_code()
    if code is not None:
        watcher.poll()  # the last words it wrote before dying
        return Readiness(False, "exited", elapsed, watcher.phase, code, watcher.fatal, time.time())
    fatal = watcher.fatal
    if fatal is not None:
        return Readiness(False, "fatal", elapsed, watcher.phase, None, fatal, time.time())
    if health.ok.is_set():
        owner = port_owner(server, limits.host, limits.port)
        if owner.ours is False:
            return Readiness(False, "not ours", elapsed, watcher.phase, None, None, time.time(), owner.text)
        if owner.ours or "listening" in watcher.reached:
            proof = owner.text if owner.ours else "its log says that it listens (/proc shows no socket to compare)"
            return Readiness(True, "ready", elapsed, watcher.phase, proof=proof)
    silent, limit = watcher.silent_for(), silence_limit(limits.silence_s, watcher.phase_key)
    if silent >= limit and not health.ok.is_set() and watcher.phase_key != "ready":
        detail = f"no output for {silent:.1f} s (this phase's limit: {limit:g} s)"
        return Readiness(False, "silent", elapsed, watcher.phase, None, None, time.time(), detail)
    if elapsed >= limits.timeout_s:
        return Readiness(False, "timeout", elapsed, f"{watcher.phase}; /health: {health.last}", None, None, time.time())
    return None


class Monitor:
    """Watches a ready server on a thread while the benchmark runs: at its exit or a fatal log
    line, records why and cuts every open stream, so the benchmark stops at once."""

    def __init__(self, server: Server, watcher: LogWatcher, on_failure: Callable[[str], None]) -> None:
        self.server = server
        self.watcher = watcher
        self.on_failure = on_failure
        self.failure: str | None = None
        self.failed_at: float | None = None
        self._failed = threading.Event()
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="smoke-monitor", daemon=True)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

    def _run(self) -> None:
        next_scan = time.monotonic()
        while not self._stop.is_set():
            if time.monotonic() >= next_scan:
                self.server.tree.scan()
                next_scan = time.monotonic() + SCAN_INTERVAL_S
            if self._look():
                return
            self._stop.wait(TICK_S)

    def _look(self) -> bool:
        """Read the log, look at the process; on a failure record it once and cut the streams."""
        self.watcher.poll()
        reason = self._reason()
        if reason is None:
            return False
        with self._guard:
            if self._failed.is_set():
                return True
            self.failure, self.failed_at = reason, time.time()
            self._failed.set()
        self.on_failure(reason)
        return True

    def wait_failure(self, timeout_s: float) -> str | None:
        """The failure, if the watcher sees one within ``timeout_s`` (a request just failed).

        The last look is taken here, in the caller's thread, so a busy machine that delays the
        watcher's thread cannot turn a dead server into "the stream was cut".
        """
        if not self._failed.wait(timeout_s):
            self._look()
        return self.failure

    def _reason(self) -> str | None:
        code = self.server.exit_code()
        if code is not None:
            self.watcher.poll()
            return f"the server exited with code {code}"
        fatal = self.watcher.fatal
        if fatal is not None:
            return f"the server logged a fatal error ({fatal.id}, log line {fatal.evidence.line})"
        return None
