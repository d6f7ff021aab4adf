"""The terminal: on an 80-column terminal every command to paste comes out whole on one line."""

from __future__ import annotations

import io
import re

import pytest

from stackgate.models.finding import Fix
from stackgate.models.result import Result, Status
from stackgate.models.verdict import judge
from stackgate.render.ui import UI
from stackgate.scan import Scanner

URL = "https://github.com/sgl-project/whl/releases/download/v0.3.21/sgl_kernel-0.3.21+cu130-cp310-abi3-manylinux2014_x86_64.whl"
LONG = f"curl -fsSL '{URL}' | sha256sum"
SHORT = "invoke provision --only python"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal(io.StringIO):
    """A stream that says it is a terminal, as a real one does."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> tuple[UI, Terminal]:
    """A UI on an 80-column colour terminal (rich reads COLUMNS and isatty, as on a real one)."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("NO_COLOR", raising=False)
    stream = Terminal()
    ui = UI(stream=stream)
    assert not ui.plain and ui.console.is_terminal and ui.console.width == 80
    return ui, stream


def shown(stream: Terminal) -> list[str]:
    return [ANSI.sub("", line).rstrip() for line in stream.getvalue().splitlines()]


def assert_whole(lines: list[str], command: str) -> None:
    assert any(
        line.lstrip(" │").startswith(f"$ {command}") and line.rstrip(" │").endswith(command) for line in lines
    ), "\n".join(lines)


def test_a_command_line_is_never_wrapped(terminal: tuple[UI, Terminal]) -> None:
    ui, stream = terminal
    ui.line(f"  $ {LONG}")
    ui.line("a sentence that is long enough to be wrapped by the terminal at eighty columns, as prose may be")
    lines = shown(stream)
    assert lines[0] == f"  $ {LONG}"
    assert len(lines) == 3  # the prose wraps; the command does not


def test_a_fix_command_too_wide_for_the_results_table_is_printed_whole_below_it(terminal: tuple[UI, Terminal]) -> None:
    ui, stream = terminal
    results = [
        Result(
            "python.url_wheels",
            Status.FAIL,
            "sgl-kernel has a url but no sha256",
            fix=Fix("Compute the wheel's sha256 and add it to the lock.", (LONG, SHORT)),
        ),
        Result("gpu.driver", Status.FAIL, "driver too old", fix=Fix("Upgrade the driver.", ("nvidia-smi",))),
    ]
    ui.results("stackgate verify: t", results, judge(results), 1.0)
    lines = shown(stream)
    assert_whole(lines, LONG)
    assert_whole(lines, SHORT)
    assert_whole(lines, "nvidia-smi")
    assert not any(line.strip(" │") == "$ curl -fsSL" for line in lines)
    table_end = next(i for i, line in enumerate(lines) if line.startswith("└"))
    assert "(command too wide for the table: see below)" in "\n".join(lines[:table_end])
    assert lines[table_end + 1 : table_end + 4] == ["python.url_wheels: fix", f"  $ {LONG}", f"  $ {SHORT}"]
    assert "│ $ nvidia-smi" in "\n".join(lines[:table_end])  # a command that fits stays in its row


def test_diagnose_commands_are_never_wrapped(terminal: tuple[UI, Terminal]) -> None:
    ui, stream = terminal
    scanner = Scanner(
        context={
            "lock_flag": " --lock /a/very/long/path/to/the/lockfiles/of/this/deployment/blackwell-sm120-cu130.toml"
        },
        source="server.log",
    )
    scanner.feed("ImportError: libcudart.so.12: cannot open shared object file: No such file or directory\n")
    scanner.finish()
    (finding,) = scanner.findings
    ui.findings("stackgate diagnose", [finding], "1 finding")
    lines = shown(stream)
    for command in finding.fix.commands:
        assert len(f"  $ {command}") > 80
        assert f"  $ {command}" in lines


PLANTED = "\x1b]0;pwned\x07\x1b[2J\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\\rback\u009b2J\x7f"
#: What a planted sequence does on a terminal; rich's own colour codes (ESC [ ... m) are allowed.
ACTING = re.compile("\x1b\\]|\x1b\\[2J|[\x07\r\u009b\x7f]|\x1b(?!\\[[0-9;]*m)")


@pytest.mark.parametrize("plain", [True, False], ids=["plain", "terminal"])
def test_untrusted_text_reaches_no_console_path_with_a_control_character(
    plain: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("NO_COLOR", raising=False)
    stream = Terminal()
    ui = UI(stream=stream, force_plain=plain)
    hostile = f"node gpu{PLANTED}: [link=http://evil.example]x[/link]"
    ui.line(f"reason {hostile}")
    ui.info(f"stackgate slurm-health {hostile}: failed")
    ui.warn(hostile)
    ui.error(hostile)
    ui.table(hostile, ["run", "host"], [[hostile, hostile]])
    result = Result(f"smoke.{PLANTED}", Status.FAIL, hostile, (f"> {hostile}",), Fix(hostile, (f"echo {hostile}",)))
    ui.results(hostile, [result], judge([result]), 1.0)
    ui.tail(hostile, None, [f"server said {hostile}"])
    with ui.activity(hostile) as activity:
        activity.update(hostile)
    out, err = stream.getvalue(), capsys.readouterr().err
    assert not ACTING.search(out + err), repr(ACTING.search(out + err))
    assert "gpu?]0;pwned??[2J?]8;;http://evil.example?\\click" in out and "[link=http://evil.example]x[/link]" in out
    assert "stackgate slurm-health node gpu?]0;pwned" in err and "| server said node gpu?]0;pwned" in err


def test_at_60_columns_ten_checks_skipped_for_one_reason_are_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.delenv("NO_COLOR", raising=False)
    stream = Terminal()
    ui = UI(stream=stream)
    names = [f"{area}.{n}" for area in ("python", "torch", "abi") for n in ("one", "two", "three")] + ["nccl.version"]
    why = "no probe of the stack's interpreter (see python.interpreter)"
    results = [Result("python.interpreter", Status.FAIL, "no stack environment")]
    results += [Result(name, Status.SKIP, why, details=("no stack environment",)) for name in names]
    ui.results("stackgate verify: t", results, judge(results), 1.0)
    skip_rows = [line for line in shown(stream) if "SKIP" in line]
    assert len(skip_rows) == 1 and skip_rows[0].split("│")[2].strip() == "python.one"
    flat = " ".join(" ".join(line.strip(" │┃") for line in shown(stream)).split())
    assert f"{' '.join(why.split())}; 9 more skipped for it: python.two, python.three, torch.one," in flat
    assert "abi.three, nccl.version" in flat
    plain = io.StringIO()
    UI(stream=plain).results("stackgate verify: t", results, judge(results), 1.0)  # the same rows without a terminal
    assert [line for line in plain.getvalue().splitlines() if "SKIP" in line] == [
        f"  SKIP  python.one          {why}; 9 more skipped for it: {', '.join(names[1:])}"
    ]


def _colours(text: str) -> list[str]:
    """The colour codes (foreground or background) among the SGR sequences of ``text``; bold and dim are no colour."""
    codes = [code for sgr in re.findall(r"\x1b\[([0-9;]*)m", text) for code in sgr.split(";") if code]
    return [code for code in codes if code.isdigit() and (30 <= int(code) <= 49 or 90 <= int(code) <= 107)]


def _report(ui: UI) -> None:
    results = [Result("gpu.driver", Status.FAIL, "driver too old", fix=Fix("Upgrade the driver.", ("nvidia-smi",)))]
    with ui.progress("gathering facts"):
        ui.info("context")
    ui.results("stackgate verify: t", results, judge(results), 1.0)


def test_no_color_takes_the_colour_away_and_keeps_the_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("NO_COLOR", raising=False)
    coloured = Terminal()
    _report(UI(stream=coloured))
    monkeypatch.setenv("NO_COLOR", "1")
    for ui in (UI(stream=Terminal()), UI(stream=Terminal(), color="never")):
        _report(ui)
        stream = ui.console.file
        assert isinstance(stream, Terminal) and not ui.plain and _colours(stream.getvalue()) == []
        assert shown(stream) == shown(coloured)  # the same table, box and all
    assert "┏" in coloured.getvalue() and _colours(coloured.getvalue())


def test_color_always_colours_a_pipe_as_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("NO_COLOR", "1")  # --color always is asked for by name: it wins over the variable
    piped = io.StringIO()
    _report(UI(stream=piped, color="always"))
    assert _colours(piped.getvalue()) and "┏" in piped.getvalue()


def test_quiet_drops_the_progress_and_context_lines_only(capsys: pytest.CaptureFixture[str]) -> None:
    _report(UI(stream=io.StringIO()))
    assert capsys.readouterr().err == "gathering facts ...\ncontext\n"
    quiet = io.StringIO()
    _report(UI(stream=quiet, quiet=True))
    ui = UI(stream=io.StringIO(), quiet=True)
    ui.warn("a warning")
    ui.error("an error")
    assert capsys.readouterr().err == "a warning\nan error\n"
    assert "  FAIL  gpu.driver  driver too old" in quiet.getvalue()  # the report stays
