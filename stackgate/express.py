"""How a command ends (:func:`outcome`), and the express lane of `stackgate verify --cached`.

A node's health check runs `stackgate verify --cached [--prom FILE]` every minute. Importing the
command-line framework (invoke) took 78 ms of a 0.14 s `stackgate --version` on an H200 host, and
that start was 0.14 s of a 0.34 s cached verify, so a well-formed `verify --cached` that uses only
the lane's flags (:data:`VALUED`, :data:`SWITCHES`) runs here without it: the same request, the
same console, the same exit codes and messages. Anything else (another flag, a flag given twice,
a flag without its value, --help) goes to the program (stackgate.program), which parses it as
always; tests/test_express.py holds the lane to the program's parser, argv by argv.

Free of the framework: the program's entry (stackgate.main) reads this first.
"""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from stackgate.edges import runner
from stackgate.edges.files import STDOUT
from stackgate.models import settings
from stackgate.models.exitcodes import ExitCode, UsageError
from stackgate.models.printable import printable
from stackgate.models.redact import redact_text

if TYPE_CHECKING:  # the console (rich) is made when a command runs
    from stackgate.render.ui import UI

__all__ = ["SWITCHES", "VALUED", "console", "flags", "health", "outcome", "terminal_options", "usage_text"]

#: The lane's flags that take a value, and the verify task's argument each sets (its short flags are
#: stackgate.cli.SHORT_FLAGS'); ``--check`` may be given again.
VALUED: Mapping[str, str] = {
    "--lock": "lock",
    "-l": "lock",
    "--json": "json",
    "-j": "json",
    "--junit": "junit",
    "--prom": "prom",
    "--check": "check",
    "-c": "check",
}
#: The lane's flags that take none.
SWITCHES: Mapping[str, str] = {"--cached": "cached", "--strict": "strict", "-s": "strict"}


def outcome(command: Callable[[], ExitCode]) -> tuple[int, str | None]:
    """Run a command: (its exit code, the message to print on standard error): 2 and the message for
    bad usage, 130 when interrupted (Ctrl-C, or SIGTERM, which tears down the same way)."""
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        settings.report()  # every STACKGATE_* variable parses, or exit 2 before anything is touched
        return int(command()), None
    except UsageError as exc:  # every command's bad usage, bad lockfile or unreadable input
        return int(ExitCode.USAGE), f"stackgate: {usage_text(exc)}"
    except KeyboardInterrupt:
        runner.terminate_all()
        return int(ExitCode.INTERRUPTED), "stackgate: interrupted"
    finally:
        signal.signal(signal.SIGTERM, previous)


def usage_text(error: UsageError) -> str:
    """A usage error as the program shows it: its message, then its hint (the fix to paste) on a line
    of its own, both redacted and made printable (a bad file's text may be quoted in them).

    >>> print(usage_text(UsageError("--tp must be 1 or more, not 0", hint="stackgate smoke --tp 1")))
    --tp must be 1 or more, not 0
      fix: stackgate smoke --tp 1
    """
    said = str(error) + (f"\n  fix: {error.hint}" if error.hint else "")
    return printable(redact_text(said), keep="\n")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


#: The program's global --color and --quiet, as it parsed them (:func:`terminal_options`).
_TERMINAL: dict[str, Any] = {"color": "auto", "quiet": False}


def terminal_options(*, color: str, quiet: bool) -> None:
    """Set the program's global --color and --quiet for every console made after (stackgate.program calls it)."""
    _TERMINAL.update(color=color, quiet=quiet)


def console(verbose: int = 0, *reports: str | None) -> UI:
    """The console; on standard error when a report goes to standard output (``--json -``)."""
    from stackgate.edges.uptime import process_elapsed_s
    from stackgate.render.ui import UI

    stream = sys.stderr if STDOUT in reports else None
    return UI(verbose=verbose, stream=stream, since_start=process_elapsed_s, **_TERMINAL)


def flags(argv: Sequence[str]) -> dict[str, Any] | None:
    """The verify task's arguments for ``argv`` (the words after the program's name) when they are a
    well-formed `verify --cached` of the lane's flags, as the program would parse them; else None.

    >>> flags(["verify", "--cached", "--prom", "n.prom", "-l", "a.toml", "--check=gpu.*", "-c", "cuda.*"])
    {'cached': True, 'prom': 'n.prom', 'lock': 'a.toml', 'check': ['gpu.*', 'cuda.*']}
    >>> [flags(a) for a in (["verify"], ["verify", "--cached", "-v"], ["verify", "--cached", "--json"])]
    [None, None, None]
    """
    if not argv or argv[0] != "verify":
        return None
    found: dict[str, Any] = {}
    checks: list[str] = []
    words = list(argv[1:])
    while words:
        word = words.pop(0)
        if word in SWITCHES:
            if SWITCHES[word] in found:
                return None
            found[SWITCHES[word]] = True
            continue
        name, equals, value = word.partition("=")
        if name not in VALUED or (equals and not name.startswith("--")):
            return None
        if not equals:
            if not words:
                return None
            value = words.pop(0)
        if not value or (value.startswith("-") and value != STDOUT):
            return None
        if VALUED[name] == "check":
            checks.append(value)
        elif VALUED[name] in found:
            return None
        else:
            found[VALUED[name]] = value
    return {**found, "check": checks} if found.get("cached") else None


def health(argv: Sequence[str]) -> int | None:
    """Run ``argv`` in the express lane when it is one of its commands: the exit code (the message,
    if any, printed on standard error); None: not the lane's, for the program to parse."""
    given = flags(argv)
    if given is None:
        return None
    from stackgate.commands import verify as command

    request = command.VerifyRequest.from_flags(**given)
    reports = (given.get("json"), given.get("junit"), given.get("prom"))
    code, message = outcome(lambda: command.run(request, console(0, *reports)))
    if message is not None:
        print(message, file=sys.stderr)
    return code
