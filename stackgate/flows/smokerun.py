"""What a smoke run is: its request, each launched configuration's session, the finished run.

:class:`SmokeRequest` is what a command asks of :func:`stackgate.flows.smoke.run_smoke`; a
:class:`Session` holds everything learned about one launched configuration; :class:`SmokeRun` is the
finished smoke with its versioned report document (``stackgate.smoke/2``).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stackgate.facts import serverlog
from stackgate.flows.smokereports import EngineReport
from stackgate.models import runenv, secretargs
from stackgate.models.finding import Finding
from stackgate.models.redact import redact
from stackgate.models.result import Result
from stackgate.models.spec import Spec
from stackgate.models.verdict import Verdict
from stackgate.models.verdict import document as report_document
from stackgate.serve import bench, fastmode, launch
from stackgate.serve.launch import Config
from stackgate.serve.ready import Readiness
from stackgate.serve.sweep import SweepRun

__all__ = [
    "SCHEMA",
    "Session",
    "SmokeInterrupted",
    "SmokeRequest",
    "SmokeRun",
]

#: The smoke part's version: each finding in its one form (models.finding).
SCHEMA = "stackgate.smoke/2"


@dataclass(frozen=True, kw_only=True)
class SmokeRequest:
    spec_path: Path | None = None
    model: str | None = None
    tp: int | None = None
    port: int | None = None
    benchmark: bool = False
    compare: bool = False
    concurrency: tuple[int, ...] = ()
    rates: tuple[float, ...] = ()  #: request rates to sweep (requests per second); [smoke.sweep] rates otherwise
    fast: bool = False
    keep_server: bool = False
    json_path: Path | None = None
    strict: bool = False
    run_dir: Path | None = None  #: where the server logs go (default: reports/smoke/<time>-<pid>)
    dry_run: bool = False  #: say the command, environment and checks; launch nothing

    @property
    def measures(self) -> bool:
        """Single-stream runs are measured (--benchmark, or --compare, which compares them)."""
        return self.benchmark or self.compare


@dataclass
class Session:
    """One launched configuration, and everything learned about it."""

    config: Config
    results: list[Result] = field(default_factory=list)
    argv: tuple[str, ...] = ()  #: the command line as shown: a secret option's literal value hidden
    launch_argv: tuple[str, ...] = field(default=(), repr=False)  #: as launched: references resolved
    api_key: str | None = field(default=None, repr=False)  #: the server's --api-key, sent by the client
    environment: dict[str, str] = field(default_factory=dict)
    set_by_stackgate: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    pid: int | None = None
    shrink: fastmode.Shrink | None = None
    readiness: Readiness | None = None
    server_info: dict[str, Any] | None = None
    info_endpoint: str | None = None
    findings: list[Finding] = field(default_factory=list)
    evidence: list[serverlog.FlagSighting] = field(default_factory=list)
    figures: bench.BenchFigures | None = None
    levels: list[bench.Level] = field(default_factory=list)
    sweep: SweepRun | None = None
    engine_report: EngineReport = field(default_factory=EngineReport)
    teardown: launch.Teardown | None = None
    kept: bool = False
    failure: str | None = None
    failure_seen_at: float | None = None  #: time.time() when smoke knew the server had failed

    def add(self, name: str, result: Result | None) -> None:
        if result is not None:
            self.results.append(dataclasses.replace(result, check=self.config.check(name)) if name else result)

    def failed(self, reason: str, at: float | None) -> None:
        if self.failure is None:
            self.failure, self.failure_seen_at = reason, at or time.time()

    def to_dict(self) -> dict[str, Any]:
        """The session for a report, its secrets hidden (the server's key wherever it appears)."""
        ready = self.readiness
        explaining, others = runenv.recorded(self.environment, self.set_by_stackgate)
        shown = {
            "label": self.config.title,
            "command": list(self.argv),
            "command_line": secretargs.command_line(self.argv) if self.argv else None,
            "environment": explaining,
            "environment_names_only": others,
            "set_by_stackgate": dict(sorted(self.set_by_stackgate.items())),
            "log_path": str(self.log_path) if self.log_path else None,
            "pid": self.pid,
            "fast_mode": {
                "layers": self.shrink.layers,
                "of": self.shrink.total,
                "key": self.shrink.key,
                "override": dict(self.shrink.override),
            }
            if self.shrink
            else None,
            "readiness": {
                "ready": ready.ready,
                "reason": ready.reason,
                "seconds": round(ready.seconds, 3),
                "phase": ready.phase,
                "exit_code": ready.exit_code,
                "detail": ready.detail or None,  #: a hang's silence, or who holds the port
                "proof": ready.proof or None,  #: how the answering server was known to be ours
            }
            if ready
            else None,
            "server_info_endpoint": self.info_endpoint,
            "server_info": self.server_info,
            "findings": [f.to_dict() for f in self.findings],
            "evidence": [dataclasses.asdict(e) for e in self.evidence],
            "benchmark": self.figures.to_dict() if self.figures else None,
            "concurrency": [level.to_dict() for level in self.levels],
            "sweep": self.sweep.to_dict() if self.sweep else None,
            **self.engine_report.to_dict(),
            "teardown": dataclasses.asdict(self.teardown) if self.teardown else None,
            "kept_running": self.kept,
            "failure": self.failure,
            "failure_seen_at": self.failure_seen_at,
        }
        return redact(shown, known=[self.api_key] if self.api_key else ())


@dataclass(frozen=True)
class SmokeRun:
    """A finished smoke: what the gate and the report need of it."""

    spec: Spec
    request: SmokeRequest
    sessions: tuple[Session, ...]
    results: list[Result]
    verdict: Verdict
    started: float
    duration_s: float
    interrupted: bool = False

    @property
    def log_paths(self) -> list[Path]:
        return [s.log_path for s in self.sessions if s.log_path is not None]

    @property
    def figures(self) -> bench.BenchFigures | None:
        """The lock's configuration's benchmark."""
        return self.sessions[-1].figures if self.sessions else None

    @property
    def server_info(self) -> dict[str, Any] | None:
        return self.sessions[-1].server_info if self.sessions else None

    def document(self) -> dict[str, Any]:
        request = {
            k: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
            for k, v in dataclasses.asdict(self.request).items()
        }
        smoke = {
            "schema": SCHEMA,
            "request": request,
            "interrupted": self.interrupted,
            "sessions": [s.to_dict() for s in self.sessions],
        }
        doc = report_document(
            "smoke",
            self.results,
            self.verdict,
            spec=self.spec,
            started=self.started,
            duration_s=self.duration_s,
            extra={"smoke": smoke},
        )
        return redact(doc, known=self.secrets())

    def secrets(self) -> set[str]:
        """The API keys the servers were launched with: the document shows them hidden, so a
        log line that repeats one could not be recognised from the document alone."""
        return {s.api_key for s in self.sessions if s.api_key}


class SmokeInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM ended smoke; every server was torn down. ``run`` holds what was learned."""

    def __init__(self, run: SmokeRun) -> None:
        super().__init__("interrupted")
        self.run = run
