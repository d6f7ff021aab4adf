"""Wait for a launched server to be ready, and stop waiting the moment it cannot be.

Ready means ``/health`` answers 200. Before that, SGLang 0.5.9 refuses connections while it
loads (the port opens only after the weights are in: "still loading", not "dead") and answers
503 until its warm-up request has run. /health polls run on a thread of their own, because a
healthy /health takes a second or more (it runs a one-token generation); the waiting loop itself
looks at the process and the log every few tens of milliseconds, so that an exit or a fatal
log line ends the wait at once.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from stackgate.edges import httpclient
from stackgate.facts.serverlog import LogWatcher
from stackgate.models.finding import Finding
from stackgate.serve.launch import Server

__all__ = ["HealthPoller", "Monitor", "Readiness", "wait_ready"]

TICK_S = 0.05
HEALTH_INTERVAL_S = 0.5
#: SGLang's /health waits for a one-token generation (up to its own 20 s health timeout).
HEALTH_TIMEOUT_S = 30.0
#: How often the server's processes are listed while waiting (they are remembered for teardown).
SCAN_INTERVAL_S = 1.0


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str  #: "ready", "exited", "fatal", "timeout"
    seconds: float
    phase: str  #: the last phase the log revealed
    exit_code: int | None = None
    finding: Finding | None = None
    failed_at: float | None = None  #: time.time() when the failure was seen (for detection-latency figures)


class HealthPoller:
    """Polls ``<url>/health`` on a daemon thread; ``last`` is the latest answer."""

    def __init__(self, base_url: str, interval_s: float = HEALTH_INTERVAL_S) -> None:
        self.url = f"{base_url}/health"
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


def wait_ready(
    server: Server,
    watcher: LogWatcher,
    base_url: str,
    timeout_s: float,
    show: Callable[[str, float], None] | None = None,
) -> Readiness:
    """Wait up to ``timeout_s`` for /health 200; stop at the server's exit or a fatal log line."""
    begun = time.monotonic()
    next_scan = begun
    with HealthPoller(base_url) as health:
        while True:
            watcher.poll()
            elapsed = time.monotonic() - begun
            if time.monotonic() >= next_scan:
                server.tree.scan()
                next_scan = time.monotonic() + SCAN_INTERVAL_S
            ended = _ended(server, watcher, health, elapsed, timeout_s)
            if ended is not None:
                return ended
            if show is not None:
                show(watcher.phase, elapsed)
            time.sleep(TICK_S)


def _ended(
    server: Server, watcher: LogWatcher, health: HealthPoller, elapsed: float, timeout_s: float
) -> Readiness | None:
    code = server.exit_code()
    if code is not None:
        watcher.poll()  # the last words it wrote before dying
        return Readiness(False, "exited", elapsed, watcher.phase, code, watcher.fatal, time.time())
    fatal = watcher.fatal
    if fatal is not None:
        return Readiness(False, "fatal", elapsed, watcher.phase, None, fatal, time.time())
    if health.ok.is_set():
        return Readiness(True, "ready", elapsed, watcher.phase)
    if elapsed >= timeout_s:
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
