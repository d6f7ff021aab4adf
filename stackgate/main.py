"""The `stackgate` program: invoke's Program over the tasks of stackgate/tasks.py, built as Fabric
builds `fab`, so that every command runs from any directory once the package is installed
(`stackgate verify`, `python -m stackgate verify`); the checkout's `invoke` runs the same tasks."""

from __future__ import annotations

import contextlib
from typing import Iterator, Mapping, Sequence

from invoke import Collection, Program
from invoke.exceptions import Exit, ParseError
from invoke.parser import ParserContext
from invoke.parser.context import to_flag

from stackgate import __version__, cli, tasks
from stackgate.models.exitcodes import ExitCode

__all__ = ["StackgateProgram", "namespace", "program", "run", "spread_bare_words"]

#: The tasks, one collection for the program and for the checkout's tasks.py.
namespace = Collection.from_module(tasks)


class StackgateProgram(Program):
    """invoke's Program, with two rules of stackgate's command line: the bare words after a task
    that gathers them (diagnose's logs, report's runs) are that task's, and a command line that
    cannot be parsed is bad usage, exit 2 (invoke exits 1, which means a failed gate here)."""

    def parse_core(self, argv: list[str] | None) -> None:
        with _parse_errors_are_usage():
            super().parse_core(argv)

    def parse_tasks(self) -> None:
        valued, rest = _word_flags(self.collection, self.initial_context)
        self.core.unparsed = spread_bare_words(self.core.unparsed, valued, rest)
        with _parse_errors_are_usage():
            super().parse_tasks()

    def parse_cleanup(self) -> None:
        with _parse_errors_are_usage():  # `--help NAME` of no task
            super().parse_cleanup()


def spread_bare_words(argv: Sequence[str], valued: Mapping[str, frozenset[str]], rest: Mapping[str, str]) -> list[str]:
    """``argv`` (the task part of a command line) with each bare word of a task that gathers them
    given to that task's flag. invoke gives a positional argument exactly one word, and takes any
    other bare word for the next task's name: `diagnose a.log b.log` would be an error.

    ``valued`` maps each task to the flags that take a value there (their next word is a value,
    not a bare word); ``rest`` maps a task to the flag that gathers its bare words. A bare word
    does not start with ``-``, or is a number from the end (``-1``, ``-2``, as report names runs).
    A word that names a task starts that task, as invoke reads it; nothing after ``--`` changes.

    >>> valued = {"diagnose": frozenset({"--json", "-j"}), "verify": frozenset()}
    >>> spread_bare_words(["diagnose", "a.log", "-j", "r.json", "b.gz", "verify"], valued, {"diagnose": "--path"})
    ['diagnose', '--path', 'a.log', '-j', 'r.json', '--path', 'b.gz', 'verify']
    >>> spread_bare_words(["report", "-2", "-1", "--", "x"], {"report": frozenset()}, {"report": "--run"})
    ['report', '--run', '-2', '--run', '-1', '--', 'x']
    """
    out: list[str] = []
    task, value_next = "", False  # "": no task yet
    for index, word in enumerate(argv):
        if word == "--":
            return out + list(argv[index:])
        if value_next:
            out.append(word)
            value_next = False
        elif word in valued:
            task = word
            out.append(word)
        elif task in rest and (not word.startswith("-") or word[1:].isdigit()):
            out += [rest[task], word]
        else:
            value_next = word in valued.get(task, ())
            out.append(word)
    return out


def _word_flags(collection: Collection, core: ParserContext) -> tuple[dict[str, frozenset[str]], dict[str, str]]:
    """Per task name (aliases too): the flags that take a value there (its own, and the core
    flags it does not shadow), and the flag that gathers its bare words, for those with one."""
    valued: dict[str, frozenset[str]] = {}
    rest: dict[str, str] = {}
    for context in collection.to_contexts(ignore_unknown_help=True):
        own = _flags(context, valued=False)
        flags = frozenset(_flags(context) | (_flags(core) - own))
        names = [name for name in (context.name, *context.aliases) if name]  # a task's context has a name
        gatherer = getattr(collection[names[0]], "rest", None)
        for name in names:
            valued[name] = flags
            if gatherer:
                rest[name] = "--" + gatherer.replace("_", "-")
    return valued, rest


def _flags(context: ParserContext, *, valued: bool = True) -> set[str]:
    """Every spelling (-j, --json) of the context's flags; with ``valued``, of those that always
    take a value (an optional value, as core --help's, is not taken from a bare word)."""
    arguments = [a for a in context.flags.values() if not valued or (a.takes_value and not a.optional)]
    return {to_flag(name) for argument in arguments for name in argument.names}


@contextlib.contextmanager
def _parse_errors_are_usage() -> Iterator[None]:
    try:
        yield
    except ParseError as exc:
        raise Exit(f"stackgate: {exc}", code=ExitCode.USAGE) from None


program = StackgateProgram(name="stackgate", binary="stackgate", version=__version__, namespace=namespace)


def run() -> None:
    """The console script (``[project.scripts] stackgate``) and ``python -m stackgate``."""
    cli.quiet_closed_output()  # before anything is printed: `stackgate ... | head -1` ends quietly
    program.run()
