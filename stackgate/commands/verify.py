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

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Mapping, Sequence

from stackgate.checks.all import REGISTRY
from stackgate.checks.core import Check, run_checks
from stackgate.edges.files import unwritable, write_json, write_text
from stackgate.facts import Facts, Missing, gather, stamp
from stackgate.flows.verify import VerifyRun, plan, verify
from stackgate.models import pylock, settings
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.result import NO_DRIVER, Result, Status
from stackgate.models.spec import DEFAULT_LOCK, Spec, load_spec
from stackgate.models.verdict import document as report_document
from stackgate.models.verdict import judge
from stackgate.render import report, summaries
from stackgate.render.ui import UI
from stackgate.runs import verifycache

__all__ = [
    "VerifyRequest", "VerifyRun", "default_profile_note", "list_checks", "phases_line", "plan", "run", "verify",
    "verify_cached",
]  # fmt: skip

#: The checks whose failure means this machine is not the one a spec describes.
_MACHINE_CHECKS = ("gpu.driver", "gpu.count", "gpu.capability")


@dataclass(frozen=True, kw_only=True)
class VerifyRequest:
    lock_path: Path | None = None
    checks: tuple[str, ...] = ()
    deep: bool = False
    json_path: Path | None = None
    junit_path: Path | None = None
    strict: bool = False
    list_only: bool = False
    cached: bool = False
    prom_path: Path | None = None

    @property
    def outputs(self) -> dict[str, Path]:
        chosen = {"--json": self.json_path, "--junit": self.junit_path, "--prom": self.prom_path}
        return {option: path for option, path in chosen.items() if path is not None}


def run(request: VerifyRequest, ui: UI) -> ExitCode:
    """The verify command: load, check, render, write the reports."""
    ui.settings(settings.report(flags={settings.LOCK: ("--lock", request.lock_path)}))
    problem = unwritable(request.outputs)
    if problem is not None:
        raise UsageError(problem)
    lock = load_spec(request.lock_path)
    if request.list_only:
        list_checks(ui)
        return ExitCode.PASSED
    pylock.check_beside(lock)
    if request.cached and request.deep:
        raise UsageError(
            "--cached reuses the static checks' results; --deep measures the GPUs every time: give one of them"
        )
    static, deep = plan(request.checks, deep=request.deep)
    if request.cached:
        done = verify_cached(lock, static, ui, strict=request.strict)
    else:
        done = verify(lock, static, ui, strict=request.strict, deep=deep)
    title = f"stackgate verify{' --deep' if request.deep else ' --cached' if request.cached else ''}: {lock.name} ({lock.path})"
    for line in default_profile_note(lock, done.results):
        ui.line(line, "warning")
    ui.results(title, report.redacted(done.results), done.verdict, done.duration_s)
    if deep:
        ui.line(phases_line(done.phases, done.duration_s))
    if done.cache is not None:
        ui.line(cache_line(done.cache))
    write_reports(done, request)
    return done.verdict.exit_code


def default_profile_note(lock: Spec, results: Sequence[Result]) -> list[str]:
    """When the shipped default profile judged a machine it does not describe: the lines that say
    so and how to describe this one (else nothing)."""
    if lock.path.resolve() != DEFAULT_LOCK.resolve():
        return []
    # Without a driver nothing says which machine this is (the report's first line says there is none).
    wrong = [r for r in results if r.check in _MACHINE_CHECKS and r.status >= Status.FAIL and NO_DRIVER not in r.data]
    if not wrong:
        return []
    return [
        f"this machine is not the one the shipped default profile {lock.name} describes ({lock.stack.description}): "
        f"{wrong[0].check}: {wrong[0].summary}",
        "describe this machine with `stackgate init` (it writes ./stackgate.toml, which every command then uses), "
        "or copy a shipped profile: `stackgate init --list`",
    ]


def verify_cached(
    lock: Spec,
    checks: list[Check],
    ui: UI,
    *,
    strict: bool = False,
    environ: Mapping[str, str] | None = None,
    nvml_lib: ModuleType | None = None,
) -> VerifyRun:
    """The live checks now; the static ones' results from the cache while its stamp holds, else
    a full verify that refreshes the cache."""
    started, clock = time.time(), time.monotonic()
    path = verifycache.path_for(lock, environ)
    live = [c for c in checks if verifycache.is_live(c)]
    static = [c for c in checks if not verifycache.is_live(c)]
    facts = gather(lock, sorted({"nvml", *(p for c in live for p in c.needs)}), environ=environ, nvml_lib=nvml_lib)
    note = None
    try:
        entry = verifycache.load(path)
    except verifycache.CacheError as exc:
        entry, note = None, f"the cache {path} is ignored: {exc}"
    before = stamp.take(lock, facts.nvml, entry.sites if entry else (), facts.base_environ)
    why = verifycache.miss(entry, before, [c.name for c in static], started)
    if entry is None or why is not None:
        return _refresh(lock, checks, static, facts, before, path, ui, strict, note or why or "no cache yet")
    try:
        with ui.progress("live checks"):
            fresh = run_checks(live, lock, facts, verbose=bool(ui.verbose))
    finally:
        facts.close()
    order = {c.name: i for i, c in enumerate(checks)}
    results = sorted([*entry.results, *fresh], key=lambda r: order.get(r.check, len(order)))
    cache = {"hit": True, "path": str(path), "reused": len(entry.results), "live": len(fresh), "written": entry.written}
    return VerifyRun(
        lock,
        results,
        judge(results, strict=strict),
        started,
        time.monotonic() - clock,
        None,
        {"live": time.monotonic() - clock},
        cache,
    )


def _refresh(
    lock: Spec,
    checks: list[Check],
    static: list[Check],
    facts: Facts,
    before: stamp.Stamp,
    path: Path,
    ui: UI,
    strict: bool,
    why: str,
) -> VerifyRun:
    """A full verify, and the cache written from it when nothing it judged moved while it ran."""
    facts.start(sorted({part for c in checks for part in c.needs}))
    done = verify(lock, checks, ui, strict=strict, facts=facts)
    sites = tuple(sorted({d.location for d in _distributions(facts)}))
    after = stamp.take(lock, facts.nvml, _sites_of(before), facts.base_environ)
    if after != before:
        written: str | None = f"not cached: changed while it ran: {'; '.join(stamp.changed(before, after))}"
    else:
        names = {c.name for c in static}
        entry = verifycache.Entry(
            stamp.take(lock, facts.nvml, sites, facts.base_environ),
            tuple(c.name for c in static),
            tuple(r for r in done.results if r.check in names),
            sites,
            done.started,
        )
        written = verifycache.save(path, entry)
    return dataclasses.replace(
        done,
        cache={
            "hit": False,
            "path": str(path),
            "why": why,
            "written": done.started if written is None else None,
            "not_written": written,
        },
    )


def _sites_of(before: stamp.Stamp) -> tuple[str, ...]:
    """The site-packages folders a stamp covers."""
    return tuple(before.get("distributions", {}))


def _distributions(facts: Facts) -> list[Any]:
    """The stack's installed distributions, where the full verify gathered them (the probe)."""
    probe = facts.probe if "probe" in facts.started else facts.dists if "dists" in facts.started else None
    return [] if probe is None or isinstance(probe, Missing) else list(probe.distributions.values())


def cache_line(cache: Mapping[str, Any]) -> str:
    """What the cache did: ``static checks: 21 reused from 12:00:03 UTC; 7 live checks run``."""
    if cache.get("hit"):
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(cache["written"]))
        return f"cache: {cache['reused']} static check result(s) reused from {when} ({cache['path']}); {cache['live']} live check(s) run"
    done = "written" if cache.get("written") is not None else str(cache.get("not_written"))
    return f"cache: the static checks ran ({cache['why']}); {done}"


def phases_line(phases: Mapping[str, float], total_s: float) -> str:
    """``wall time 12.3 s: static 1.1 s, deep.gpu_work 4.0 s, deep.collective 7.2 s``."""
    parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items())
    return f"wall time {total_s:.1f} s: {parts}"


def write_reports(done: VerifyRun, request: VerifyRequest) -> None:
    if request.json_path or request.prom_path:
        extra = {
            "phases_s": {name: round(seconds, 3) for name, seconds in done.phases.items()},
            **({"cache": dict(done.cache)} if done.cache is not None else {}),
        }
        doc = report_document(
            "verify",
            done.results,
            done.verdict,
            lock=done.lock,
            started=done.started,
            duration_s=done.duration_s,
            extra=extra,
        )
        if request.json_path:
            write_json(request.json_path, doc)
        if request.prom_path:
            write_text(request.prom_path, summaries.verify_prometheus(doc))
    if request.junit_path:
        report.write_junit(
            request.junit_path, {f"stackgate.verify.{done.lock.name}": done.results}, strict=request.strict
        )


def list_checks(ui: UI) -> None:
    width = max(len(name) for name in REGISTRY)
    # Deep checks last, as they run, whichever module registered first.
    for check in sorted(REGISTRY.values(), key=lambda c: c.slow):
        when = (
            " (deep: --deep)" if check.slow else " (when named: --check; the gate runs it)" if check.named_only else ""
        )
        ui.line(f"{check.name:<{width}}  {check.title}{when}")
