"""`stackgate diagnose`: explain logs of this stack (server logs, installer output, tracebacks).

Each input is streamed through a :class:`~stackgate.scan.Scanner` in large blocks, so a
log of hundreds of MB is never held whole; the findings of all inputs are reported most severe
first, with the lines that matched, the cause and the fix. With a spec (--lock, else the one every
command finds: $STACKGATE_LOCK, a stackgate.toml here or above, /etc/stackgate/stack.toml), causes and
fixes quote the stack's own values (its attention backend, its torch build). Exit 1 when a finding is an
error, 0 otherwise, 2 when an input cannot be read. Standard input is read for ``--stdin``, for a
path ``-``, and when no input is named and standard input is a pipe or a file
(``cat x.log | stackgate diagnose``), never from a terminal or /dev/null.
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from stackgate.flows.diagnose import (
    STDIN,
    Diagnosis,
    borrowed,
    diagnose,
    document,
    live_kernel_log,
    opener,
)
from stackgate.models import knowledge, settings
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.render.outputs import JSON, Output, check_outputs, write_reports

if TYPE_CHECKING:  # the spec module loads only when diagnose runs
    from stackgate.models.spec import Spec

__all__ = ["DiagnoseRequest", "inputs_summary", "run", "verdict_line"]


@dataclass(frozen=True, kw_only=True)
class DiagnoseRequest:
    paths: tuple[Path, ...] = ()
    stdin: bool = False
    json_path: Path | None = None
    spec_path: Path | None = None
    kernel: bool = False  #: read this boot's kernel log too
    kernel_path: Path | None = None  #: a saved kernel log to read instead of the live one
    bundle_path: Path | None = None  #: write a support bundle here


def run(request: DiagnoseRequest, ui: Any, stdin: BinaryIO | None = None) -> ExitCode:
    """The diagnose command: check the inputs, scan them, render, write the JSON report."""
    ui.settings(settings.report(flags={settings.LOCK: ("--lock", request.spec_path)}))
    kernel = request.kernel or request.kernel_path is not None
    paths = tuple(path for path in request.paths if path != DASH)
    named = request.stdin or len(paths) < len(request.paths)
    read_stdin = named or (not paths and not kernel and not request.bundle_path and _piped(stdin or sys.stdin))
    if not paths and not read_stdin and not kernel and not request.bundle_path:
        raise UsageError(
            "nothing to diagnose: give one or more log files (- for standard input), --stdin, --kernel or --bundle PATH"
        )
    saved_kernel = (request.kernel_path,) if request.kernel_path is not None else ()  # --kernel-log: one more input
    openers = [opener(path) for path in (*paths, *saved_kernel)]  # every file is checked before any is read
    if request.bundle_path is not None and request.bundle_path.is_dir():
        raise UsageError(f"--bundle: {request.bundle_path} is a directory; name the .tar.gz to write")
    outputs = {"--json": Output(request.json_path, JSON)}
    problem = check_outputs(outputs)
    if problem is not None:
        raise UsageError(problem)
    if read_stdin:
        openers.append((STDIN, lambda: borrowed(stdin or sys.stdin.buffer)))
    spec = _load_spec(request.spec_path)
    context = knowledge.spec_context(spec) if spec else {}
    if request.kernel and request.kernel_path is None:  # a saved kernel log stands for the live one, as before
        openers.append(live_kernel_log())
    with ui.progress(f"scanning {len(openers)} input(s) for {len(knowledge.load())} known failures"):
        done = diagnose(openers, context, spec=spec, never_silent=True, kernel=True)
    ui.findings(
        f"stackgate diagnose: {inputs_summary(done)}", done.findings, verdict_line(done), unrecognized=done.unrecognized
    )
    write_reports(document(done), outputs)
    if request.bundle_path is not None:
        from stackgate.runs import bundle  # gathers facts: loaded only when a bundle is asked for

        with ui.progress(f"writing the support bundle {request.bundle_path}"):
            try:
                made = bundle.write(request.bundle_path, spec=spec, diagnose_report=document(done))
            except bundle.BundleError as exc:
                raise UsageError(str(exc)) from exc
        ui.line(
            f"support bundle: {request.bundle_path} ({len(made.members) + 1} files, secrets redacted; "
            f"{len(made.notes)} part(s) missing, see NOTES.txt)"
        )
    return done.exit_code


#: The path that names standard input (a file called ``-`` is ``./-``).
DASH = Path("-")


def _piped(stream: Any) -> bool:
    """Whether ``stream`` is a pipe or a regular file (``cmd | stackgate diagnose``, ``< x.log``): read
    when no input is named; a terminal, /dev/null or a socket is not."""
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (AttributeError, OSError, ValueError):  # no descriptor (a test's BytesIO, a closed stream)
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def _load_spec(path: Path | None) -> Spec | None:
    """The spec named by --lock, else the one found as every command finds it (never the shipped default: the
    causes and fixes then quote no stack's values rather than a profile this machine may not be)."""
    from stackgate.models.spec import found_spec_path, load_spec

    chosen = path or found_spec_path()
    return load_spec(chosen) if chosen is not None else None


def verdict_line(done: Diagnosis) -> str:
    """``3 finding(s) (2 fail, 1 warn) in 0.41 s: FAILED``; a run with no failing finding passes."""
    counts = {k: v for k, v in done.counts.items() if k != "unrecognized"}
    apart = f"; {len(done.unrecognized)} unrecognized failure(s)" if done.unrecognized else ""
    if not done.findings and not done.unrecognized:
        return f"no known failure found in {done.duration_s:.2f} s: passed"
    parts = ", ".join(f"{n} {word}" for word, n in counts.items() if n) or "none recognised"
    word = "FAILED" if done.exit_code else "passed (no failing finding)"
    return f"{len(done.findings)} finding(s) ({parts}){apart} in {done.duration_s:.2f} s: {word}"


def inputs_summary(done: Diagnosis) -> str:
    """``2 inputs, 1,204 lines, 3.1 MB``; ``1 input, 1 line, 27 B``."""
    lines = sum(i.lines for i in done.inputs)
    size = sum(i.bytes for i in done.inputs)
    return f"{_count(len(done.inputs), 'input')}, {_count(lines, 'line')}, {_size(size)}"


def _count(n: int, noun: str) -> str:
    """
    >>> _count(1, "line"), _count(1204, "line")
    ('1 line', '1,204 lines')
    """
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _size(n: float) -> str:
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("kB", "MB", "GB"):
        n /= 1000
        if n < 1000 or unit == "GB":
            break
    return f"{n:.1f} {unit}"
