"""The command line's rules, shared by every task: one short flag per long flag, the same in every
task (``SHORT_FLAGS``, through :func:`task`); domain errors into invoke exits with the documented
codes (:func:`run_command`); and a reader that stops reading (``stackgate provision | head -1``)
is not turned into a traceback."""

from __future__ import annotations

from typing import Any, Callable, Mapping

import invoke
from invoke.exceptions import Exit

from stackgate.express import outcome
from stackgate.models.exitcodes import ExitCode
from stackgate.streams import quiet_closed_output

__all__ = ["SHORT_FLAGS", "Task", "quiet_closed_output", "run_command", "task"]

#: Every short flag of every task, by long flag: a letter means the same in every task that has
#: it, and a flag not named here has none (invoke would give a flag its first free letter, in
#: order of the signature, and a --hosts flag would take -h, which stays --help's). -v counts
#: (-vv) wherever --verbose is.
SHORT_FLAGS: Mapping[str, str] = {
    "lock": "l",
    "model": "m",
    "json": "j",
    "verbose": "v",
    "strict": "s",
    "check": "c",
    "deep": "d",
    "dry_run": "n",
    "yes": "y",
    "only": "o",
    "wait": "w",
    "force": "f",
    "benchmark": "b",
    "tp": "t",
    "run": "r",
    "path": "p",
}


class Task(invoke.Task):
    """An invoke task whose short flags come from :data:`SHORT_FLAGS`, never from a guess.

    ``rest`` names the argument that gathers a task's bare words (``stackgate diagnose a.log
    b.log``): invoke gives a positional argument one word, so the program (stackgate.program) turns
    each bare word after such a task into that flag.
    """

    def __init__(self, *args: Any, rest: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "auto_shortflags": False})
        self.rest = rest

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[invoke.parser.Argument]:
        # invoke pops each flag's help text off self.help as it builds the arguments: a second
        # parse of the same task (the program reads its flags before parsing) would lose them all.
        kept = dict(self.help)
        try:
            return super().get_arguments(ignore_unknown_help)
        finally:
            self.help = kept

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        if name in SHORT_FLAGS:
            opts["names"] = [*opts["names"], SHORT_FLAGS[name]]
        return opts


def task(*args: Any, **kwargs: Any) -> Any:
    """``invoke.task`` making a :class:`Task`: ``@task(help={...})``, ``@task(rest="path")``."""
    return invoke.task(*args, klass=Task, **kwargs)


def run_command(command: Callable[[], ExitCode]) -> None:
    """Run a command; exit with its code, 2 for a usage error, 130 when interrupted."""
    code, message = outcome(command)
    if message is not None or code != ExitCode.PASSED:
        raise Exit(message, code=int(code))
