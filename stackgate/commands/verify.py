"""`stackgate verify`: gather the facts once, run the checks, report, return one exit code.

With ``--cached`` the static checks' results are reused while the stamp of what they judged is
unchanged (:mod:`stackgate.runs.verifycache`), and only the live checks (the GPUs' state, the
kernel's events) run: a check a minute from a systemd timer. ``--prom FILE`` writes the verdict
for node_exporter's textfile collector.

With ``--deep`` the static checks run first (in parallel), then the deep ones (real work on the
GPUs), one after another so that they never share the GPUs, and each only when the static
checks it stands on passed (stackgate.checks.deep.PREREQUISITES); otherwise it is reported as
not run, with the reason. The wall time is split into those phases, in the report and the JSON.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from stackgate.checks.all import REGISTRY
from stackgate.flows.verify import VerifyRun, plan, verify, verify_cached
from stackgate.models import pylock, settings
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.result import NO_DRIVER, Result, Status
from stackgate.models.spec import DEFAULT_SPEC, LOCAL_SPEC, SYSTEM_SPEC, Spec, load_spec
from stackgate.models.verdict import document as report_document
from stackgate.render import reporting, summaries
from stackgate.render.outputs import JSON, Output, check_outputs, write_reports
from stackgate.render.ui import UI

__all__ = ["VerifyRequest", "default_profile_note", "list_checks", "phases_line", "run"]


#: The checks whose failure means this machine is not the one a spec describes.
_MACHINE_CHECKS = ("gpu.driver", "gpu.count", "gpu.capability")


@dataclass(frozen=True, kw_only=True)
class VerifyRequest:
    spec_path: Path | None = None
    checks: tuple[str, ...] = ()
    deep: bool = False
    json_path: Path | None = None
    junit_path: Path | None = None
    strict: bool = False
    list_only: bool = False
    cached: bool = False
    prom_path: Path | None = None

    @classmethod
    def from_flags(
        cls,
        *,
        lock: str | None = None,
        deep: bool = False,
        check: Sequence[str] | None = None,
        list: bool = False,  # noqa: A002  (the task's flag, --list)
        json: str | None = None,
        junit: str | None = None,
        strict: bool = False,
        cached: bool = False,
        prom: str | None = None,
    ) -> VerifyRequest:
        """The request the verify task's flags make (the program's, and the express lane's)."""
        return cls(
            spec_path=Path(lock) if lock else None,
            checks=tuple(check or ()),
            deep=deep,
            json_path=Path(json) if json else None,
            junit_path=Path(junit) if junit else None,
            strict=strict,
            list_only=list,
            cached=cached,
            prom_path=Path(prom) if prom else None,
        )

    @property
    def outputs(self) -> dict[str, Path]:
        chosen = {"--json": self.json_path, "--junit": self.junit_path, "--prom": self.prom_path}
        return {option: path for option, path in chosen.items() if path is not None}

    @property
    def reports(self) -> dict[str, Output]:
        """The JSON and Prometheus reports asked for (JUnit XML is written from the results)."""
        return {"--json": Output(self.json_path, JSON), "--prom": Output(self.prom_path, summaries.verify_prometheus)}


def run(request: VerifyRequest, ui: UI) -> ExitCode:
    """The verify command: load, check, render, write the reports."""
    ui.settings(settings.report(flags={settings.LOCK: ("--lock", request.spec_path)}))
    problem = check_outputs({option: Output(path, JSON) for option, path in request.outputs.items()})
    if problem is not None:
        raise UsageError(problem)
    spec = load_spec(request.spec_path)
    if request.list_only:
        list_checks(ui)
        return ExitCode.PASSED
    pylock.check_beside(spec)
    if request.cached and request.deep:
        raise UsageError(
            "--cached reuses the static checks' results; --deep measures the GPUs every time: give one of them"
        )
    static, deep = plan(request.checks, deep=request.deep)
    if request.cached:
        done = verify_cached(spec, static, ui, strict=request.strict)
    else:
        done = verify(spec, static, ui, strict=request.strict, deep=deep)
    mode = " --deep" if request.deep else " --cached" if request.cached else ""
    title = f"stackgate verify{mode}: {spec.name} ({spec.path})"
    named = request.spec_path is not None or settings.LOCK.value() is not None
    for line in default_profile_note(spec, done.results, named=named):
        ui.line(line, "warning")
    ui.results(title, reporting.redacted(done.results), done.verdict, ui.waited_s(done.duration_s))
    if deep:
        ui.line(phases_line(done.phases, done.duration_s))
    if done.cache is not None:
        ui.line(cache_line(done.cache))
    write_all(done, request)
    return done.verdict.exit_code


def default_profile_note(spec: Spec, results: Sequence[Result], *, named: bool = False) -> list[str]:
    """When the shipped default profile judged a machine it does not describe (or one with no GPU at all): the
    lines that say so and how to describe this one (else nothing). ``named``: --lock or $STACKGATE_LOCK named it."""
    if spec.path.resolve() != DEFAULT_SPEC.resolve():
        return []
    describe = (
        "describe this machine with `stackgate init` (it writes ./stackgate.toml, which every command then uses), "
        "or copy a shipped profile: `stackgate init --list`"
    )
    if any(NO_DRIVER in r.data for r in results if r.check == "gpu.driver"):
        system = settings.SYSTEM_DIR.value() / SYSTEM_SPEC
        why = (
            f"named by --lock or ${settings.LOCK.env}"
            if named
            else f"no spec was found (--lock, ${settings.LOCK.env}, {LOCAL_SPEC} here or in a folder above, {system})"
        )
        return [
            f"judged against the shipped default profile {spec.name} ({spec.stack.description}): {why}, "
            "and this machine has no GPU (no NVIDIA driver answers)",
            describe,
        ]
    wrong = [r for r in results if r.check in _MACHINE_CHECKS and r.status >= Status.FAIL]
    if not wrong:
        return []
    return [
        f"this machine is not the one the shipped default profile {spec.name} describes ({spec.stack.description}): "
        f"{wrong[0].check}: {wrong[0].summary}",
        describe,
    ]


def cache_line(cache: Mapping[str, Any]) -> str:
    """What the cache did: ``static checks: 21 reused from 12:00:03 UTC; 7 live checks run``."""
    if cache.get("hit"):
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(cache["written"]))
        return (
            f"cache: {cache['reused']} static check result(s) reused from {when} ({cache['path']}); "
            f"{cache['live']} live check(s) run"
        )
    done = "written" if cache.get("written") is not None else str(cache.get("not_written"))
    return f"cache: the static checks ran ({cache['why']}); {done}"


def phases_line(phases: Mapping[str, float], total_s: float) -> str:
    """``wall time 12.3 s: static 1.1 s, deep.gpu_work 4.0 s, deep.collective 7.2 s``."""
    parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items())
    return f"wall time {total_s:.1f} s: {parts}"


def write_all(done: VerifyRun, request: VerifyRequest) -> None:
    """The reports asked for: JSON and Prometheus from the run's document, JUnit XML from its results."""
    if request.json_path or request.prom_path:
        extra = {
            "phases_s": {name: round(seconds, 3) for name, seconds in done.phases.items()},
            **({"cache": dict(done.cache)} if done.cache is not None else {}),
            **({"deep_ahead": dict(done.ahead)} if done.ahead is not None else {}),
        }
        doc = report_document(
            "verify",
            done.results,
            done.verdict,
            spec=done.spec,
            started=done.started,
            duration_s=done.duration_s,
            extra=extra,
        )
        write_reports(doc, request.reports)
    if request.junit_path:
        reporting.write_junit(
            request.junit_path, {f"stackgate.verify.{done.spec.name}": done.results}, strict=request.strict
        )


def list_checks(ui: UI) -> None:
    width = max(len(name) for name in REGISTRY)
    # Deep checks last, as they run, whichever module registered first.
    for check in sorted(REGISTRY.values(), key=lambda c: c.slow):
        when = (
            " (deep: --deep)" if check.slow else " (when named: --check; the gate runs it)" if check.named_only else ""
        )
        ui.line(f"{check.name:<{width}}  {check.title}{when}")
