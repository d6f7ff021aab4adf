"""The `stackgate` program: invoke's Program over the tasks of stackgate/tasks.py, built as Fabric
builds `fab`, so that every command runs from any directory once the package is installed
(`stackgate verify`, `python -m stackgate verify`); the checkout's `invoke` runs the same tasks.
Its entry is stackgate.main, which sends the express lane's commands (stackgate.express) past it."""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
from typing import Iterator, Mapping, Sequence

from invoke import Collection, Program
from invoke.exceptions import Exit, ParseError
from invoke.parser import Argument, ParserContext
from invoke.parser.context import to_flag

from stackgate import __version__, express, tasks
from stackgate.models.exitcodes import ExitCode

__all__ = ["GLOBAL_FLAGS", "StackgateProgram", "flag_tuples", "namespace", "program", "spread_bare_words"]

#: The tasks, one collection for the program and for the checkout's tasks.py.
namespace = Collection.from_module(tasks)

#: invoke's core options that stackgate's program offers; the others (shell-command settings,
#: --dry, --debug, --list ...) drive invoke's task runner, which stackgate's commands never use.
GLOBAL_FLAGS: Mapping[str, str] = {
    "help": "show this help, or a command's (stackgate --help verify)",
    "version": "print stackgate's version",
    "complete": "print tab-completion candidates (the completion script calls it)",
    "print-completion-script": "print the tab-completion script for bash, zsh or fish",
    "color": "colour: auto (on a terminal, unless NO_COLOR is set), always or never; the layout stays",
    "quiet": "no progress or context lines on standard error (warnings, errors and the report stay)",
}
#: The values --color takes (stackgate.render.ui.COLORS; the program does not import the console to parse).
COLORS = ("auto", "always", "never")


class StackgateProgram(Program):
    """invoke's Program, with the rules of stackgate's command line: only stackgate's global flags
    (:data:`GLOBAL_FLAGS`); help that shows each flag as it is given (``-v, -vv``); the bare words
    after a task that gathers them (diagnose's logs, report's runs) are that task's; and a command
    line that cannot be parsed is bad usage, exit 2 (invoke exits 1, which means a failed gate)."""

    def core_args(self) -> list[Argument]:
        kept = [argument for argument in super().core_args() if argument.name in GLOBAL_FLAGS]
        kept += [
            Argument(names=("color",), kind=str, default="auto"),
            Argument(names=("quiet", "q"), kind=bool, default=False),
        ]
        for argument in kept:
            argument.help = GLOBAL_FLAGS[str(argument.name)]
        return kept

    def parse_core_args(self) -> None:
        super().parse_core_args()
        given = self.core[0].args
        for argument in super().core_args():  # invoke reads its own options: they keep their defaults
            if argument.name not in given:
                given[argument.name] = argument

    def parse_core(self, argv: list[str] | None) -> None:
        try:
            with _parse_errors_are_usage():
                super().parse_core(argv)
        finally:
            # invoke turns off writing bytecode unless given its --write-pyc (not a stackgate flag): every
            # module imported after this would be compiled again on each run. Python's own setting
            # (-B, $PYTHONDONTWRITEBYTECODE) decides.
            sys.dont_write_bytecode = bool(sys.flags.dont_write_bytecode)

    def parse_tasks(self) -> None:
        valued, rest = _word_flags(self.collection, self.initial_context)
        self.core.unparsed = spread_bare_words(self.core.unparsed, valued, rest)
        with _parse_errors_are_usage():
            super().parse_tasks()

    def parse_cleanup(self) -> None:
        with _parse_errors_are_usage():  # `--help NAME` of no task
            super().parse_cleanup()
        color = self.args["color"].value
        if color not in COLORS:
            raise Exit(f"stackgate: --color {color!r}: give one of {', '.join(COLORS)}", code=ExitCode.USAGE)
        express.terminal_options(color=color, quiet=bool(self.args["quiet"].value))

    def print_help(self) -> None:
        print(f"Usage: {self.binary} [--help | --version] <command> [--options]")
        print(f"       {self.binary} <command> --help     (a command's options)")
        print("")
        print("Commands:")
        print("")
        names = sorted(self.collection.task_names)
        self.print_columns([(name, _first_line(inspect.getdoc(self.collection[name]))) for name in names])
        print("Global options:")
        print("")
        self.print_columns(flag_tuples(self.initial_context))

    def print_task_help(self, name: str) -> None:
        context = self.parser.contexts[name]
        print(f"Usage: {self.binary} {name} [--options]")
        print("")
        print(self.leading_indent + _first_line(inspect.getdoc(self.collection[name])))
        print("")
        print("Options:")
        print("")
        self.print_columns([*flag_tuples(context), ("-h, --help", "show this help")])


def flag_tuples(context: ParserContext) -> list[tuple[str, str]]:
    """(flags, help) of each flag of ``context``, as it is typed: ``-v, -vv, --verbose`` for a
    counted flag (invoke writes ``-v INT``, which it refuses), ``-c STRING, --check=STRING`` for a
    repeatable one (invoke writes no value)."""
    rows = []
    for flags, text in context.help_tuples():
        argument = context.flags[flags.split(",")[-1].split("=")[0].split("[")[0].strip()]
        if argument.incrementable:
            short = [f"-{n}, -{n}{n}" for n in argument.names if len(n) == 1]
            flags = ", ".join([*short, f"--{argument.name.replace('_', '-')}"])
        elif argument.kind is list:
            spelled = sorted(argument.names, key=len)
            flags = ", ".join(f"-{n} STRING" if len(n) == 1 else f"--{n.replace('_', '-')}=STRING" for n in spelled)
        elif argument.optional:  # --help's value is a command's name
            flags = flags.replace("STRING", "COMMAND")
        rows.append((flags, text or ""))
    return rows


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


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
        raise Exit(f"stackgate: {_usage_text(exc)}", code=ExitCode.USAGE) from None


#: invoke's words for a flag given last without its value: ``Flag <Argument: json (j)> needed ...``.
_NEEDED_VALUE = re.compile(r"Flag <Argument: ([\w-]+)[^>]*> needed value")
#: Where the commands and their options are listed.
_LISTS = "`stackgate --help` lists the commands, `stackgate COMMAND --help` its options"
#: invoke's words for a word that is no flag and no task here.
_UNKNOWN = re.compile(r"No idea what '(.*)' is!")


def _usage_text(error: ParseError) -> str:
    """invoke's parse error in the words of the command line: a flag given without its value says
    which value it needs (``--json needs a value: write the JSON report here``)."""
    unknown = _UNKNOWN.fullmatch(str(error))
    if unknown is not None:
        return f"no option or command {unknown[1]!r} here ({_LISTS})"
    found = _NEEDED_VALUE.match(str(error))
    if found is None:
        return str(error)
    context = error.context
    argument = context.args.get(found[1]) if context is not None else None
    flag = "--" + found[1].replace("_", "-")
    where = f"{context.name} " if context is not None and context.name else ""
    needs = "a number" if argument is not None and argument.kind is int else "a value"
    text = f": {argument.help}" if argument is not None and argument.help else ""
    return f"{where}{flag} needs {needs}{text}"


program = StackgateProgram(name="stackgate", binary="stackgate", version=__version__, namespace=namespace)
