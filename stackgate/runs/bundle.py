"""A support bundle: what a user attaches to an upstream issue about this stack, secrets out.

:func:`write` gathers, each part on its own so that one that cannot be had is a note, not a
failure: verify's JSON report (run as the program itself, ``stackgate verify --json``), ``nvidia-smi
-q``, the kernel log's GPU events with their neighbouring lines, the stack's installed
distributions (asked of the stack's interpreter), the spec and its pylock, the server logs of the
last runs (their ends), the environment (the variables that explain a run; the others by name),
and diagnose's own report of the logs it was given.
Every text goes through :mod:`stackgate.models.redact` before it is written (the environment's
secret-named variables, tokens in URLs, secret flags and token shapes in logs), and the archive
lists its members in ``MANIFEST.txt``. The archive is private to its user (0600, as its members),
written to a temporary file beside it and renamed into place: a symbolic link at its path is
replaced, never written through.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from stackgate.edges import kernellog, owned, runner
from stackgate.facts import Missing, gather
from stackgate.models import kernelevents as kernelmodel
from stackgate.models import pylock, runenv, settings
from stackgate.models.redact import redact, redact_text
from stackgate.models.spec import Spec

__all__ = ["LOG_TAIL_BYTES", "RUNS_KEPT", "Bundle", "BundleError", "write"]

RUNS_KEPT = 3  #: the last runs whose server logs go in
LOG_TAIL_BYTES = 2 << 20  #: of each server log, its end (where a failure is)
KERNEL_CONTEXT = 3  #: lines kept around each GPU event of the kernel log
VERIFY_TIMEOUT_S = 300.0  #: verify without --deep takes seconds; a hung probe must not hang the bundle


class BundleError(Exception):
    """The bundle cannot be written where it was asked."""


@dataclass
class Bundle:
    """The members of a bundle (name -> text) and the notes on parts that could not be had."""

    members: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, name: str, part: Callable[[], str | None]) -> None:
        try:
            text = part()
        except Exception as exc:  # one part that cannot be had is a note in the bundle, not a failure
            self.notes.append(f"{name}: could not be gathered: {type(exc).__name__}: {exc}")
            return
        if text is None:
            return
        self.members[name] = text


def write(
    out: Path, *, spec: Spec | None, diagnose_report: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
) -> Bundle:
    """Gather the parts and write them, redacted, as a .tar.gz at ``out``; return what went in."""
    env = dict(os.environ if environ is None else environ)
    bundle = Bundle()
    if diagnose_report is not None:
        bundle.add("diagnose.json", lambda: json.dumps(diagnose_report, indent=2))
    bundle.add("verify.json", lambda: _verify(spec, env, bundle))
    bundle.add("nvidia-smi-q.txt", lambda: _command(("nvidia-smi", "-q"), bundle))
    bundle.add("kernel-log-gpu-events.txt", lambda: _kernel(bundle))
    bundle.add("environment.txt", lambda: _environment(env, spec))
    if spec is not None:
        bundle.add(f"spec/{spec.path.name}", lambda: spec.path.read_text(encoding="utf-8"))
        locked = pylock.path_for(spec.path)
        bundle.add(f"spec/{locked.name}", lambda: _read(locked, bundle))
        bundle.add("installed-distributions.txt", lambda: _dists(spec, bundle))
    for name, text in _server_logs(env):
        bundle.members[name] = text
    bundle.add("NOTES.txt", lambda: "\n".join(bundle.notes) + "\n" if bundle.notes else None)
    _archive(out, bundle, env)
    return bundle


def _note(bundle: Bundle, text: str) -> str | None:
    """Note a part that could not be had; the part itself is then left out (None)."""
    bundle.notes.append(text)
    return None


def _read(path: Path, bundle: Bundle) -> str | None:
    return path.read_text(encoding="utf-8") if path.exists() else _note(bundle, f"no pylock at {path}")


def _verify(spec: Spec | None, env: Mapping[str, str], bundle: Bundle) -> str | None:
    """verify's JSON report, from the program itself (a crash there cannot take the bundle down)."""
    report = Path(env.get("TMPDIR", "/tmp")) / f"stackgate-bundle-verify-{os.getpid()}-{time.monotonic_ns()}.json"
    argv = [
        sys.executable,
        "-m",
        "stackgate",
        "verify",
        "--json",
        str(report),
        *(["--lock", str(spec.path)] if spec else []),
    ]
    done = runner.run(argv, timeout_s=VERIFY_TIMEOUT_S, env={**env, "NO_COLOR": "1"})
    try:
        return report.read_text(encoding="utf-8")
    except OSError:
        return _note(
            bundle,
            f"verify.json: verify wrote no report (exit {done.returncode}): "
            f"{(done.stderr or done.stdout).strip()[-500:]}",
        )
    finally:
        report.unlink(missing_ok=True)


def _environment(env: Mapping[str, str], spec: Spec | None) -> str:
    """The variables that explain a run with their values (:mod:`stackgate.models.runenv`), the
    others by name only."""
    named = [*spec.env, *spec.smoke.env] if spec is not None else []
    kept, others = runenv.recorded(env, named)
    names = f"# set, value not recorded: {', '.join(others)}\n" if others else ""
    return "".join(f"{k}={v}\n" for k, v in kept.items()) + names


def _command(argv: Sequence[str], bundle: Bundle) -> str | None:
    done = runner.run(argv, timeout_s=60)
    if done.returncode != 0:
        return _note(bundle, f"{' '.join(argv)}: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}")
    return done.stdout


def _kernel(bundle: Bundle) -> str | None:
    """The kernel log's GPU events, each with the lines around it."""
    try:
        log = kernellog.read()
    except kernellog.KernelLogError as exc:
        return _note(bundle, f"kernel log: {exc}")
    events = kernelmodel.parse(log.text)
    lines = log.text.splitlines()
    keep = sorted(
        {
            n
            for e in events
            for n in range(max(1, e.line - KERNEL_CONTEXT), min(len(lines), e.line + KERNEL_CONTEXT) + 1)
        }
    )
    head = (
        f"# {len(events)} GPU event(s) in {len(lines)} lines of `{log.source}`; "
        f"each with {KERNEL_CONTEXT} lines around it\n"
    )
    return head + "".join(f"{n:>7}: {lines[n - 1]}\n" for n in keep)


def _dists(spec: Spec, bundle: Bundle) -> str | None:
    facts = gather(spec, ["dists"])
    try:
        found = facts.get("dists")
    finally:
        facts.close()
    if isinstance(found, Missing):
        return _note(bundle, f"installed distributions: {found.reason}")
    listed = sorted(found.distributions.values(), key=lambda d: d.name.lower())
    head = f"# {len(listed)} distribution(s) in {found.executable} (Python {found.python_version})\n"
    return head + "".join(f"{d.name}=={d.version}  {d.location}\n" for d in listed)


def _server_logs(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """The ends of the server logs of the last runs of smoke and gate."""
    root = settings.LOG_DIR.value(env)
    if root is None or not Path(root).is_dir():
        return []
    runs = sorted(
        (p for kind in ("smoke", "gate") for p in (Path(root) / kind).glob("*") if p.is_dir()),
        key=lambda p: p.stat().st_mtime,
    )
    out = []
    for run in runs[-RUNS_KEPT:]:
        for log in sorted(run.rglob("*.log")):
            with open(log, "rb") as stream:
                stream.seek(max(0, log.stat().st_size - LOG_TAIL_BYTES))
                text = stream.read().decode("utf-8", "replace")
            out.append((f"server-logs/{run.parent.name}/{run.name}/{log.relative_to(run)}", text))
    return out


def _archive(out: Path, bundle: Bundle, env: Mapping[str, str]) -> None:
    members = {name: redact_text(text, environ=env) for name, text in bundle.members.items()}
    if "diagnose.json" in members:  # a document: redacted by key too
        members["diagnose.json"] = json.dumps(
            redact(json.loads(bundle.members["diagnose.json"]), environ=env), indent=2
        )
    manifest = "".join(f"{name}\t{len(text.encode())} bytes\n" for name, text in members.items())
    members = {"MANIFEST.txt": manifest, **members}
    try:  # private (0600) like its members; a link at ``out`` is replaced, never written through
        with owned.private_file(out) as file, tarfile.open(fileobj=file, mode="w:gz") as archive:
            for name, text in members.items():
                data = text.encode("utf-8")
                info = tarfile.TarInfo(f"stackgate-bundle/{name}")
                info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
                archive.addfile(info, io.BytesIO(data))
    except OSError as exc:
        raise BundleError(f"{out}: cannot write the bundle: {exc.strerror or exc}") from exc
