"""The one module that owns the terminal: consoles, theme, verbosity, progress, the results table.

On a terminal, results are a rich table (in colour unless NO_COLOR or --color never); without one
they are plain lines that read the same in a CI log. Nothing else in stackgate imports rich.

Every text shown goes through one door, :func:`shown` (:func:`stackgate.models.printable.printable`:
control characters as ``?``, a line break and a tab kept), with or without colour: a log line,
a node's reason or a run copied in from elsewhere cannot move the cursor, retitle the window or
plant a hyperlink. Text is handed to rich as :class:`~rich.text.Text`, never as markup.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field, replace
from itertools import groupby
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Collection, Iterator, Sequence

from rich.console import Console
from rich.markup import escape
from rich.text import Text
from rich.theme import Theme

from stackgate.models.exitcodes import ExitCode
from stackgate.models.finding import Finding, Fix
from stackgate.models.printable import printable
from stackgate.models.redact import redact, redact_text
from stackgate.models.result import NEEDS_GPU, Result, Status
from stackgate.models.settings import Value
from stackgate.models.verdict import Verdict
from stackgate.render.reporting import counts_line

if TYPE_CHECKING:  # rich's tables, progress bars and prompts are imported where they are drawn (plain output never)
    from rich.progress import Progress, TaskID
    from rich.table import Table

__all__ = [
    "UI",
    "Activity",
    "finding_lines",
    "fold_needs_gpu",
    "fold_same_skips",
    "no_driver_line",
    "render_findings",
    "render_plain",
    "render_rows",
    "render_settings",
    "render_table",
    "shown",
]

THEME = Theme(
    {
        "success": "green",
        "warning": "yellow",
        "error": "bold red",
        "skip": "dim",
        "muted": "dim",
        "heading": "bold",
        "info": "cyan",
    }
)
STYLES = {
    Status.PASS: "success",
    Status.SKIP: "skip",
    Status.WARN: "warning",
    Status.FAIL: "error",
    Status.ERROR: "error",
}

#: A finding's severity (models/finding.py) as the theme's style, as its status would be shown.
SEVERITY_STYLES = {"fail": "error", "warn": "warning", "info": "info"}


def shown(text: str) -> str:
    r"""``text`` as the console shows it: every control character but a line break and a tab as ``?``.

    >>> shown("ok\x1b]0;owned\x07\x1b[2J\ttab\nline")
    'ok?]0;owned??[2J\ttab\nline'
    """
    return str(printable(text, keep="\n\t"))


def _shown_result(result: Result) -> Result:
    """A result with every text of it as the console shows it."""
    fix = result.fix
    return replace(
        result,
        check=shown(result.check),
        summary=shown(result.summary),
        details=tuple(shown(d) for d in result.details),
        fix=Fix(shown(fix.text), tuple(shown(c) for c in fix.commands)) if fix is not None else None,
    )


#: The values of the program's ``--color``: colour on a terminal without NO_COLOR, always, never.
COLORS = ("auto", "always", "never")


@dataclass
class UI:
    """How a command talks to a person: where, how loud, with or without colour.

    The layout follows the stream: a terminal gets the rich table, anything else plain lines. Colour is
    apart (``color``): NO_COLOR or ``--color never`` takes the colour away and keeps the layout;
    ``--color always`` colours a pipe too, laid out as on a terminal. ``quiet`` drops the progress and context
    lines on standard error; warnings, errors and the report stay."""

    verbose: int = 0
    stream: IO[str] | None = None
    force_plain: bool | None = None
    color: str = "auto"
    quiet: bool = False
    #: The program's console: how long the process has run (stackgate.edges.uptime), for a command's last line.
    since_start: Callable[[], float | None] | None = None

    def __post_init__(self) -> None:
        stream = self.stream or sys.stdout
        terminal = self.color == "always" or stream.isatty()
        plain = self.force_plain if self.force_plain is not None else not terminal
        no_color = self.color == "never" or (self.color == "auto" and (bool(os.environ.get("NO_COLOR")) or plain))
        self.plain = plain
        self.console = Console(
            file=stream,
            theme=THEME,
            no_color=no_color,
            highlight=False,
            soft_wrap=plain,
            force_terminal=False if plain else (True if self.color == "always" else None),
        )
        self.err = Console(
            file=sys.stderr,
            theme=THEME,
            no_color=no_color,
            highlight=False,
            stderr=True,
            soft_wrap=plain,
            force_terminal=True if self.color == "always" else None,
        )

    def waited_s(self, duration_s: float) -> float:
        """A command's wall time for its last line: on the program's console, since the process started (the
        imports and the parsing a person waited for too); else ``duration_s``."""
        elapsed = self.since_start() if self.since_start is not None else None
        return max(duration_s, elapsed or 0.0)

    def line(self, text: str = "", style: str | None = None) -> None:
        """One line of the report; a command (``$ ...``) is never wrapped, so that it pastes whole."""
        text = shown(text)
        if self.plain:
            self.console.file.write(text + "\n")
        else:
            self.console.print(Text(text, style=style or ""), soft_wrap=_is_command(text))

    def info(self, text: str) -> None:
        """A progress or context line on stderr, so stdout stays the report (none with ``quiet``)."""
        if self.quiet:
            return
        self.err.print(Text(shown(text), style="muted"))

    def debug(self, text: str) -> None:
        if self.verbose:
            self.info(text)

    def error(self, text: str) -> None:
        self.err.print(Text(shown(text), style="error"))

    def warn(self, text: str) -> None:
        """A warning on stderr: something was skipped or not kept, the command goes on."""
        self.err.print(Text(shown(text), style="warning"))

    @property
    def unicode(self) -> bool:
        """Whether the report's stream takes characters beyond ASCII (a sparkline's bars)."""
        return self.console.encoding.lower().replace("-", "").startswith("utf")

    @contextlib.contextmanager
    def progress(self, message: str) -> Iterator[None]:
        """A spinner with elapsed time on a terminal; a start line otherwise."""
        started = time.monotonic()
        if self.quiet or self.plain or not self.err.is_terminal:
            self.info(f"{message} ...")
            yield
            return
        with self.err.status(Text(shown(message), style="muted")):
            yield
        self.debug(f"{message}: {time.monotonic() - started:.1f} s")

    @contextlib.contextmanager
    def activity(self, message: str) -> Iterator[Activity]:
        """A long step: on a terminal a spinner, the elapsed time and the latest output line (a
        bar for downloads); otherwise a start line, a heartbeat line every so often, an end line."""
        activity = Activity(self, message)
        live = not (self.quiet or self.plain or not self.err.is_terminal)
        try:
            if not live:
                self.info(f"{message} ...")
                activity.start()
                yield activity
            else:
                from rich.progress import (
                    BarColumn,
                    DownloadColumn,
                    Progress,
                    SpinnerColumn,
                    TextColumn,
                    TimeElapsedColumn,
                )

                columns = (
                    SpinnerColumn(),
                    TextColumn("{task.description}"),
                    TimeElapsedColumn(),
                    BarColumn(bar_width=20),
                    DownloadColumn(),
                    TextColumn("[muted]{task.fields[detail]}"),
                )
                with Progress(*columns, console=self.err, transient=True) as progress:
                    activity.start(progress, progress.add_task(escape(shown(message)), total=None, detail=""))
                    yield activity
        except BaseException:
            self.error(f"failed after {activity.elapsed_s:.1f} s: {message}")
            raise
        if not self.quiet:
            self.err.print(
                Text(shown(f"done in {activity.elapsed_s:.1f} s: {message}"), style="success" if live else "muted")
            )

    def tail(self, headline: str, log: Path | None, lines: Sequence[str], findings: Sequence[Finding] = ()) -> None:
        """A failure: what failed, where the full log is, its last lines, and the known failures
        the log shows (with their causes and fixes)."""
        self.error(headline)
        if log is not None:
            self.info(f"full log: {log}")
        lines_shown, (findings,) = redact([*lines]), _redacted(findings)
        for line in lines_shown:
            self.err.print(Text(shown(f"  | {line}"), style="muted"))
        if findings:
            self.err.print(Text(f"known failure(s) in the log ({len(findings)}):", style="heading"))
        for finding in findings:
            for text, style in finding_lines(finding, self.verbose):
                self.err.print(Text(shown(text), style=style or ""))

    def confirm(self, question: str) -> bool | None:
        """Ask a yes/no question on a terminal; None when there is no one to ask."""
        if not (sys.stdin.isatty() and self.err.is_terminal):
            return None
        from rich.prompt import Confirm

        return Confirm.ask(Text(shown(question)), console=self.err, default=False)

    def table(
        self, title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None
    ) -> None:
        """A small table of figures (right-aligned columns after the first, unless ``align``
        says otherwise: one "l" or "r" per column)."""
        title, rows = shown(title), [[shown(str(cell)) for cell in row] for row in rows]
        if self.plain:
            self.console.file.write(render_rows(title, headers, rows, align))
            return
        from rich.table import Table

        table = Table(title=Text(title), title_justify="left", pad_edge=False)
        for i, header in enumerate(headers):
            table.add_column(header, justify="left" if _left(align, i) else "right", no_wrap=True)
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        self.console.print(table)

    def results(self, title: str, results: Sequence[Result], verdict: Verdict, duration_s: float) -> None:
        title, results = shown(title), [_shown_result(r) for r in results]
        if self.plain:
            self.console.file.write(render_plain(title, results, verdict, duration_s, verbose=self.verbose))
            return
        note = no_driver_line(results)
        if note is not None:
            self.console.print(Text(note, style="warning"))
        results = fold_same_skips(fold_needs_gpu(results))
        table = render_table(title, results, verbose=self.verbose)
        wide = self._cut_commands(table, results)
        if wide:
            # A folded command pastes as several commands (a bare `curl -fsSL` first): the table
            # points below itself, where each one is printed whole on its own line.
            self.console.print(render_table(title, results, verbose=self.verbose, elsewhere=wide))
            for result in results:
                commands = result.fix.commands if result.fix is not None else ()
                if wide.intersection(commands):
                    self.line(f"{result.check}: fix", "muted")
                    for command in commands:
                        self.line(f"  $ {command}")
        else:
            self.console.print(table)
        self.console.print(_summary_text(verdict, duration_s))

    def _cut_commands(self, table: Table, results: Sequence[Result]) -> set[str]:
        """The fix commands that the table, laid out at this console's width, would not show on one line."""
        # A command row's status and check cells are blank: stripped of them and the borders, a
        # command the table shows whole is the row's whole text.
        lines = {
            "".join(segment.text for segment in line).strip(" │")
            for line in self.console.render_lines(table, pad=False)
        }
        commands = {c for r in results if r.fix is not None and r.status >= Status.WARN for c in r.fix.commands}
        return {c for c in commands if f"$ {c}" not in lines}

    def settings(self, values: Sequence[Value[Any]]) -> None:
        """With -v, the settings not at their defaults and where each came from; with -vv, all (on stderr)."""
        for text in render_settings(values, verbose=self.verbose):
            self.info(text)

    def findings(
        self, title: str, findings: Sequence[Finding], verdict: str, unrecognized: Sequence[Finding] = ()
    ) -> None:
        """diagnose's report: each finding with its lines, cause and fix, most severe first; the
        failures no entry explains after them, apart. Their secrets are hidden, as in the JSON."""
        findings, unrecognized = _redacted(findings, unrecognized)
        for text, style in render_findings(title, findings, verdict, verbose=self.verbose, unrecognized=unrecognized):
            self.line(text, style)


def _redacted(*groups: Sequence[Finding]) -> list[list[Finding]]:
    """Findings as a console may show them: their secrets hidden as a JSON report hides them (all
    in one document, so a secret found in one is hidden in every other)."""
    shown = redact([[finding.to_dict() for finding in group] for group in groups])
    return [[Finding.from_dict(raw) for raw in group] for group in shown]


#: How many lines of one event are shown, and how long a line may be, without -v.
EVENT_LINES = 8
LINE_WIDTH = 240


def render_findings(
    title: str, findings: Sequence[Finding], verdict: str, *, verbose: int = 0, unrecognized: Sequence[Finding] = ()
) -> list[tuple[str, str | None]]:
    """diagnose's report as (line, style) pairs: the same words with or without colour."""
    lines: list[tuple[str, str | None]] = [(title, "heading"), ("", None)]
    for finding in findings:
        lines.extend(finding_lines(finding, verbose))
        lines.append(("", None))
    if unrecognized:
        lines.extend([(f"Not recognised by any entry ({len(unrecognized)}):", "heading"), ("", None)])
        for finding in unrecognized:
            lines.extend(finding_lines(finding, verbose))
            lines.append(("", None))
    failed = any(f.severity == "fail" for f in [*findings, *unrecognized])
    lines.append((verdict, "error" if failed else "success"))
    return lines


def finding_lines(finding: Finding, verbose: int = 0) -> list[tuple[str, str | None]]:
    """One finding as (line, style) pairs: what, where, the lines that matched, cause, fix, source."""
    evidence = finding.evidence
    seen = f", seen {evidence.count} times" if evidence.count > 1 else ""
    out: list[tuple[str, str | None]] = [
        (f"{finding.severity.upper():<8} {finding.id}: {finding.title}", SEVERITY_STYLES.get(finding.severity)),
        (f"  at {evidence.where}{seen}  [{finding.component}]", "muted"),
    ]
    out.extend((f"  | {text}", "muted") for text in _event_lines(finding, verbose))
    out.append((f"  cause: {finding.cause}", None))
    out.append((f"  fix: {finding.fix.text}", None))
    out.extend((f"  $ {command}", None) for command in finding.fix.commands)
    out.append((f"  learned from: {finding.learned_from}", "muted"))
    if verbose:
        out.extend((f"  see also: {ref}", "muted") for ref in finding.references)
        out.extend((f"  {name} = {value}", "muted") for name, value in sorted(finding.values.items()))
    return out


def _event_lines(finding: Finding, verbose: int) -> list[str]:
    evidence = finding.evidence
    first = evidence.start_line or evidence.line
    width = len(str(first + len(evidence.lines)))
    numbered = [f"{first + i:>{width}}  {_clip(text, verbose)}" for i, text in enumerate(evidence.lines)]
    if verbose or len(numbered) <= EVENT_LINES:
        return numbered
    keep = EVENT_LINES // 2
    return [
        *numbered[:keep],
        f"{'':>{width}}  ... {len(numbered) - 2 * keep} more lines (-v shows them)",
        *numbered[-keep:],
    ]


def _clip(text: str, verbose: int) -> str:
    return text if verbose or len(text) <= LINE_WIDTH else text[: LINE_WIDTH - 3] + "..."


def render_plain(
    title: str, results: Sequence[Result], verdict: Verdict, duration_s: float, *, verbose: int = 0
) -> str:
    """The report as plain lines: grouped by area, failures with their fix under them."""
    note = no_driver_line(results)
    results = fold_same_skips(fold_needs_gpu(results))
    width = max((len(r.check) for r in results), default=0)
    lines = [*([note] if note else []), title, ""]
    for area, group in groupby(results, key=lambda r: r.area):
        lines.append(area)
        for result in group:
            lines.append(f"  {result.status.name:<5} {result.check:<{width}}  {result.summary}")
            lines.extend(f"  {'':<5} {'':<{width}}  {line}" for line in _body(result, verbose))
    lines += ["", _summary(verdict, duration_s), ""]
    return "\n".join(lines)


def _needs_gpu(result: Result) -> bool:
    return result.status == Status.SKIP and bool(result.data.get(NEEDS_GPU))


def no_driver_line(results: Sequence[Result]) -> str | None:
    """The one line that says there is no driver, or None when there is one (or nothing needed it).

    >>> no_driver_line([Result("gpu.count", Status.SKIP, "no driver", data={NEEDS_GPU: True})])
    'no NVIDIA driver on this machine: 1 check that needs a GPU is skipped'
    """
    count = sum(1 for r in results if _needs_gpu(r))
    if not count:
        return None
    words = "check that needs a GPU is" if count == 1 else "checks that need a GPU are"
    return f"no NVIDIA driver on this machine: {count} {words} skipped"


def fold_needs_gpu(results: Sequence[Result]) -> list[Result]:
    """The results with each area's checks skipped for want of a driver in one row, where the
    first of them stood: the same sentence is not repeated on each (the JSON keeps every one).

    >>> rows = fold_needs_gpu([Result(f"gpu.{n}", Status.SKIP, "no driver", data={NEEDS_GPU: True}) for n in "ab"])
    >>> [(r.check, r.summary) for r in rows]
    [('gpu.* (2 checks)', 'skipped, no NVIDIA driver: gpu.a, gpu.b')]
    """
    folded: list[Result] = []
    for area, grouped in groupby(results, key=lambda r: r.area):
        group = list(grouped)
        skips = [r for r in group if _needs_gpu(r)]
        if len(skips) < 2:
            folded += group
            continue
        names = ", ".join(r.check for r in skips)
        row = Result(f"{area}.* ({len(skips)} checks)", Status.SKIP, f"skipped, no NVIDIA driver: {names}")
        first = next(i for i, r in enumerate(group) if _needs_gpu(r))
        folded += [*group[:first], row, *(r for r in group[first:] if not _needs_gpu(r))]
    return folded


#: How many skipped checks with one reason make one row.
FOLD_SKIPS = 3


def fold_same_skips(results: Sequence[Result]) -> list[Result]:
    """The results with the checks skipped for one same reason (FOLD_SKIPS of them or more) in the first one's
    row, which names the others: ten rows repeating a sentence, wrapped at 60 columns, are one (the JSON keeps
    every one).

    >>> rows = [Result(f"{area}.x", Status.SKIP, "no probe") for area in "abc"] + [Result("d.y", Status.PASS, "ok")]
    >>> [(r.check, r.summary) for r in fold_same_skips(rows)]
    [('a.x', 'no probe; 2 more skipped for it: b.x, c.x'), ('d.y', 'ok')]
    """
    reasons: dict[tuple[str, tuple[str, ...]], list[Result]] = {}
    for result in results:
        if result.status == Status.SKIP and result.fix is None:
            reasons.setdefault((result.summary, tuple(result.details)), []).append(result)
    folded: list[Result] = []
    for result in results:
        same = reasons.get((result.summary, tuple(result.details)), []) if result.status == Status.SKIP else []
        if len(same) < FOLD_SKIPS or result.fix is not None:
            folded.append(result)
        elif result is same[0]:
            others = ", ".join(r.check for r in same[1:])
            folded.append(replace(result, summary=f"{result.summary}; {len(same) - 1} more skipped for it: {others}"))
    return folded


def render_settings(values: Sequence[Value[Any]], *, verbose: int) -> list[str]:
    """The settings for -v (those not at their defaults) and -vv (all): variable, value, source.

    >>> from stackgate.models import settings
    >>> values = settings.report({"STACKGATE_DEEP_TIMEOUT_S": "600"})
    >>> print("\\n".join(render_settings(values, verbose=1)))
    settings: 1 of 21 not at its default (-vv lists all)
      STACKGATE_DEEP_TIMEOUT_S  600  (environment $STACKGATE_DEEP_TIMEOUT_S)
    """
    if not verbose:
        return []
    shown = list(values) if verbose > 1 else [v for v in values if not v.is_default]
    if verbose > 1:
        head = f"settings ({len(values)}):"
    elif shown:
        head = (
            f"settings: {len(shown)} of {len(values)} not at {'its' if len(shown) == 1 else 'their'} default (-vv "
            "lists all)"
        )
    else:
        head = f"settings: all {len(values)} at their defaults (-vv lists them)"
    width = max((len(v.setting.env) for v in shown), default=0)
    return [head, *(f"  {v.setting.env:<{width}}  {redact_text(v.text)}  ({v.source})" for v in shown)]


def render_rows(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> str:
    """Plain aligned columns.

    >>> print(render_rows("t", ["run", "tok/s"], [["1", "92.50"], ["mean", "92.6"]]), end="")
    t
    run   tok/s
    1     92.50
    mean   92.6
    """
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    lines = [title]
    for row in [headers, *rows]:
        cells = [
            str(c).ljust(w) if _left(align, i) else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=False))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def _left(align: str | None, column: int) -> bool:
    return column == 0 if align is None else align[column : column + 1] != "r"


def render_table(title: str, results: Sequence[Result], *, verbose: int = 0, elsewhere: Collection[str] = ()) -> Table:
    """The results as a rich table; the fix commands in ``elsewhere`` are named as printed below it."""
    from rich.table import Table

    table = Table(title=Text(title), title_justify="left", expand=False)
    table.add_column("status", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("result", overflow="fold")
    for area, group in groupby(results, key=lambda r: r.area):
        table.add_row("", Text(area, style="heading"), "", end_section=False)
        for result in group:
            style = STYLES[result.status]
            table.add_row(
                Text(result.status.name, style=style),
                Text(result.check),
                Text(result.summary, style=style if result.status >= Status.WARN else ""),
            )
            for line in _body(result, verbose):
                if line[2:] in elsewhere and _is_command(line):
                    line = "(command too wide for the table: see below)"
                table.add_row("", "", Text(line, style="muted" if not line.startswith(("fix:", "$ ")) else ""))
    return table


def _is_command(line: str) -> bool:
    """A line that shows a command to paste: ``$ cmd``, indented or not.

    >>> _is_command("  $ stackgate verify"), _is_command("fix: run it")
    (True, False)
    """
    return line.lstrip().startswith("$ ")


def _body(result: Result, verbose: int) -> list[str]:
    """Details of anything not green (all of them with -v), then the fix."""
    lines = list(result.details) if (result.status >= Status.WARN or verbose) else []
    if result.fix is not None and result.status >= Status.WARN:
        lines.append(f"fix: {result.fix.text}")
        lines.extend(f"$ {command}" for command in result.fix.commands)
    return lines


def _summary(verdict: Verdict, duration_s: float) -> str:
    word = "PASSED" if verdict.passed else "INTERRUPTED" if verdict.exit_code == ExitCode.INTERRUPTED else "FAILED"
    reason = "" if verdict.passed else f" ({verdict.reason})"
    return f"{counts_line(verdict.counts, duration_s)}: {word}{reason}"


def _summary_text(verdict: Verdict, duration_s: float) -> Text:
    return Text(_summary(verdict, duration_s), style="success" if verdict.passed else "error")


@dataclass
class Activity:
    """A running step, told what its command prints (``update``) or how far a download got."""

    ui: UI
    message: str
    heartbeat_s: float = 30.0
    started: float = 0.0
    progress: Any = None
    task: TaskID | None = None
    _last_beat: float = 0.0
    _detail: str = field(default="", repr=False)

    def start(self, progress: Progress | None = None, task: TaskID | None = None) -> None:
        self.started = self._last_beat = time.monotonic()
        self.progress, self.task = progress, task

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def update(self, detail: str) -> None:
        detail = detail.strip()
        if not detail:
            return
        self._detail = detail
        if self.progress is not None:
            self.progress.update(self.task, detail=escape(shown(detail[:80])))
        else:
            self._beat()

    def transfer(self, done: int, total: int | None) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=done, total=total)
        else:
            self._detail = f"{done / 1e6:.1f} MB" + (f" of {total / 1e6:.1f} MB" if total else "")
            self._beat()

    def _beat(self) -> None:
        # A CI log needs a sign of life during a long download, not every line of it.
        now = time.monotonic()
        if now - self._last_beat >= self.heartbeat_s:
            self._last_beat = now
            self.ui.info(f"  ... {self.message}: {now - self.started:.0f} s, {self._detail[:100]}")
