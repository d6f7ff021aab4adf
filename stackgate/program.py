"""The `stackgate` program: invoke's Program over the tasks of stackgate/tasks.py, built as Fabric
builds `fab`, so that every command runs from any directory once the package is installed
(`stackgate verify`, `python -m stackgate verify`); the checkout's `invoke` runs the same tasks.
Its entry is stackgate.main, which sends the express lane's commands (stackgate.express) past it."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import inspect
import io
import re
import sys
from typing import Container, Iterator, Mapping, Sequence

from invoke import Collection, Program
from invoke.completion.complete import print_completion_script
from invoke.exceptions import Exit, ParseError
from invoke.parser import Argument, Parser, ParserContext
from invoke.parser.context import to_flag

from stackgate import __version__, express, tasks
from stackgate.cli import value_name
from stackgate.models.exitcodes import ExitCode

__all__ = [
    "GLOBAL_FLAGS",
    "MissingValue",
    "StackgateProgram",
    "Words",
    "completion_script",
    "flag_tuples",
    "namespace",
    "program",
    "spread_bare_words",
    "usage_line",
]

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
    (:data:`GLOBAL_FLAGS`); help that shows each flag as it is given (``-v, -vv``, ``--lock=PATH``);
    the bare words after a task are its positional arguments (fleet's ACTION) and then the words
    of the flag that gathers them (diagnose's logs, report's runs); a flag that takes a value is
    given one; and a command line that cannot be parsed is bad usage, exit 2 (invoke exits 1,
    which means a failed gate), naming the nearest command or flag to a mistyped one."""

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
        shell = given["print-completion-script"].value
        if shell:  # before invoke prints its own, which calls itself "Invoke tab-completion script"
            print(completion_script(shell), end="")
            raise Exit

    def parse_core(self, argv: list[str] | None) -> None:
        try:
            with _parse_errors_are_usage():
                super().parse_core(argv)
        finally:
            # invoke turns off writing bytecode unless given its --write-pyc (not a stackgate flag): every
            # module imported after this would be compiled again on each run. Python's own setting
            # (-B, $PYTHONDONTWRITEBYTECODE) decides.
            sys.dont_write_bytecode = bool(sys.flags.dont_write_bytecode)

    def _make_parser(self) -> Parser:
        # A positional argument is filled by spread_bare_words from a bare word only: to invoke's
        # parser it is one more flag, so `fleet --help` is help and `fleet --bogus` an unknown flag.
        parser = super()._make_parser()
        for context in parser.contexts.values():
            for argument in context.positional_args:
                argument.positional = False
            context.positional_args = []
        return parser

    def parse_tasks(self) -> None:
        with _parse_errors_are_usage():
            self.core.unparsed = spread_bare_words(self.core.unparsed, _words(self.collection, self.initial_context))
            super().parse_tasks()
        if not self.args.help.value:
            _missing_slots(self.tasks, self.collection)
            _other_actions_options(self.tasks, self.collection)

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
        if getattr(self.collection[name], "actions", None):
            self.print_actions_help(name)
            return
        context = self.parser.contexts[name]
        print(f"Usage: {usage_line(self.binary, name, self.collection)}")
        print("")
        print(self.leading_indent + _first_line(inspect.getdoc(self.collection[name])))
        print("")
        task = self.collection[name]
        arguments = [(value_name(slot), context.flags[to_flag(slot)].help or "") for slot in task.positional]
        if arguments:
            print("Arguments:")
            print("")
            self.print_columns(arguments)
        for heading, rows in grouped([*flag_tuples(context), ("-h, --help", "show this help")]).items():
            print(heading)
            print("")
            self.print_columns(rows)

    def print_actions_help(self, name: str) -> None:
        """A task whose first bare word is a sub-command (`stackgate fleet`): its actions and the options they
        all take; after an action's name (`stackgate fleet gate --help`), that action's options only."""
        task = self.collection[name]
        slot = task.positional[0]
        action = next((c.args[slot].value for c in getattr(self, "tasks", ()) if c.name == name), None)
        chosen = task.actions.get(action)
        if chosen is None:
            print(f"Usage: {usage_line(self.binary, name, self.collection)}")
            print("")
            print(self.leading_indent + _first_line(inspect.getdoc(task)))
            print("")
            print("Actions:")
            print("")
            self.print_columns([(each, spec.summary) for each, spec in task.actions.items()])
            print(f"{self.leading_indent}`{self.binary} {name} {value_name(slot)} --help` shows an action's options")
            print("")
        else:
            print(f"Usage: {self.binary} {name} {action} [--options]")
            print("")
            print(self.leading_indent + chosen.summary)
            print("")
        own = set(chosen.options) if chosen is not None else set()
        hidden = {slot} | {option for spec in task.actions.values() for option in spec.options if option not in own}
        rows = flag_tuples(self.parser.contexts[name], hide=hidden)
        for heading, group in grouped([*rows, ("-h, --help", "show this help")]).items():
            print(heading)
            print("")
            self.print_columns(group)


#: How a flag's help names the group it belongs to (``[--engine slurm] the partition ...``).
_GROUP = re.compile(r"^\[(?P<group>[^\]]+)\] ")


def grouped(rows: Sequence[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """A task's (flags, help) rows under their headings: ``Options:``, then one heading per group
    a help text names in its first words (``[--engine ssh] ...``, ``[--engine slurm] ...``), without
    those words.

    >>> grouped([("--a", "one"), ("--p=NAME", "[--engine slurm] a partition"), ("-h", "help")])
    {'Options:': [('--a', 'one'), ('-h', 'help')], 'Options of --engine slurm:': [('--p=NAME', 'a partition')]}
    """
    groups: dict[str, list[tuple[str, str]]] = {"Options:": []}
    for flags, text in rows:
        found = _GROUP.match(text)
        heading = f"Options of {found['group']}:" if found else "Options:"
        groups.setdefault(heading, []).append((flags, text[found.end() :] if found else text))
    # the common options first, then a command's groups, then an engine's (``--engine X``) last
    return dict(sorted(groups.items(), key=lambda item: (item[0] != "Options:", "--" in item[0], item[0])))


def usage_line(binary: str, name: str, collection: Collection) -> str:
    """``stackgate fleet ACTION [--options]``, ``stackgate diagnose [LOG...] [--options]``: a task's
    usage with the bare words it takes, named as help names their flags' values.

    >>> usage_line("stackgate", "report", namespace)
    'stackgate report [RUN...] [--options]'
    """
    task = collection[name]
    rest = getattr(task, "rest", None)
    words = [value_name(slot) for slot in task.positional] + ([f"[{value_name(rest)}...]"] if rest else [])
    return " ".join([binary, name, *words, "[--options]"])


def flag_tuples(context: ParserContext, hide: Container[str] = ()) -> list[tuple[str, str]]:
    """(flags, help) of each flag of ``context`` but those named in ``hide``, as it is typed: ``-v, -vv,
    --verbose`` for a counted flag (invoke writes ``-v INT``, which it refuses), ``-c NAME, --check=NAME``
    for one that takes a value, named by :data:`stackgate.cli.VALUE_NAMES` (invoke writes ``STRING`` for
    every value, and none for a repeatable flag)."""
    rows = []
    for flags, text in context.help_tuples():
        argument = context.flags[flags.split(",")[-1].split("=")[0].split("[")[0].strip()]
        if argument.name in hide:
            continue
        value = value_name(str(argument.name))
        short = [n for n in argument.names if len(n) == 1]
        spelled = [*short, *(n for n in argument.names if len(n) > 1)]  # the name first, then an alias
        if argument.incrementable:
            flags = ", ".join([*(f"-{n}, -{n}{n}" for n in short), to_flag(str(argument.name))])
        elif argument.optional:  # --help's value is a command's name
            flags = flags.replace("STRING", value)
        elif argument.takes_value:
            flags = ", ".join(f"-{n} {value}" if len(n) == 1 else f"{to_flag(n)}={value}" for n in spelled)
        else:
            flags = ", ".join(to_flag(n) for n in spelled)
        rows.append((flags, text or ""))
    return rows


def completion_script(shell: str) -> str:
    """invoke's tab-completion script for ``shell`` (bash, zsh, fish), for the program named ``stackgate``
    however it was started (``python -m stackgate`` too), its header naming stackgate; an unknown shell
    is a ParseError that names the shells."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_completion_script(shell, ["stackgate"])
    return out.getvalue().replace("Invoke tab-completion script", "stackgate's tab-completion script", 1)


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


@dataclasses.dataclass(frozen=True)
class Words:
    """How a task reads the words after its name: the flags that take a value there (its own, and
    the core flags it does not shadow), the flags its first bare words fill, one word each (its
    positional arguments), and the flag that gathers every bare word after those, if any."""

    valued: frozenset[str] = frozenset()
    slots: tuple[str, ...] = ()
    rest: str | None = None


class MissingValue(ParseError):
    """A flag that takes a value given none: last, before ``--``, or before a word that is a flag."""

    def __init__(self, task: str, flag: str) -> None:
        super().__init__(f"{task} {flag} needs a value")
        self.task, self.flag = task, flag


def spread_bare_words(argv: Sequence[str], words: Mapping[str, Words]) -> list[str]:
    """``argv`` (the task part of a command line) with each bare word of a task that takes them
    given to that task's flag, and every flag that takes a value given one (else
    :class:`MissingValue`). invoke gives a positional argument the next word even when that word is
    a flag (`fleet --help` was an action), and takes any other bare word for the next task's name:
    `diagnose a.log b.log` would be an error.

    A bare word does not start with ``-``, or is ``-`` (standard input) or a number from the end
    (``-1``, ``-2``, as report names runs). A value does not look like a flag either. A word that
    names a task starts that task, as invoke reads it; nothing after ``--`` changes.

    >>> words = {"diagnose": Words(frozenset({"--json", "-j"}), rest="--path"), "verify": Words(frozenset({"-c"}))}
    >>> spread_bare_words(["diagnose", "a.log", "-j", "r.json", "b.gz", "verify"], words)
    ['diagnose', '--path', 'a.log', '-j', 'r.json', '--path', 'b.gz', 'verify']
    >>> spread_bare_words(["report", "-2", "-1", "--", "x"], {"report": Words(rest="--run")})
    ['report', '--run', '-2', '--run', '-1', '--', 'x']
    >>> words["fleet"] = Words(slots=("--action",))
    >>> spread_bare_words(["fleet", "--strict", "gate", "verify"], words)
    ['fleet', '--action', 'gate', '--strict', 'verify']
    >>> spread_bare_words(["fleet", "--action", "gate", "verify"], words)
    ['fleet', '--action', 'gate', 'verify']
    >>> spread_bare_words(["verify", "-c", "--strict"], words)
    Traceback (most recent call last):
    ...
    stackgate.program.MissingValue: verify -c needs a value
    """
    out: list[str] = []
    task, valued, at, filled = "", "", 0, 0  # "": no task yet, no flag waiting for its value
    for index, word in enumerate(argv):
        if valued and (word == "--" or _flag_like(word)):
            raise MissingValue(task, valued)
        if word == "--":
            return out + list(argv[index:])
        flag, equals, value = word.partition("=")
        if valued:
            out.append(word)
            valued = ""
        elif task in words and not _flag_like(word) and filled < len(words[task].slots):
            # a positional argument goes first (invoke gives it any word met while it is missing, and
            # a task's name too: `fleet verify`)
            out[at + 1 + 2 * filled : at + 1 + 2 * filled] = [words[task].slots[filled], word]
            filled += 1
        elif word in words:
            task, at, filled = word, len(out), 0
            out.append(word)
        elif task in words and not _flag_like(word) and words[task].rest:
            out += [str(words[task].rest), word]
        elif equals and not value and flag in words.get(task, Words()).valued:
            raise MissingValue(task, flag)
        else:
            valued = word if word in words.get(task, Words()).valued else ""
            slots = words.get(task, Words()).slots
            filled = max(filled, slots.index(flag) + 1) if flag in slots else filled  # `fleet --action gate`
            out.append(word)
    if valued:
        raise MissingValue(task, valued)
    return out


def _flag_like(word: str) -> bool:
    """Whether ``word`` reads as a flag: it starts with ``-`` and is not ``-`` or ``-N``."""
    return word.startswith("-") and word != "-" and not word[1:].isdigit()


def _words(collection: Collection, core: ParserContext) -> dict[str, Words]:
    """:class:`Words` of each task name (aliases too)."""
    found: dict[str, Words] = {}
    for context in collection.to_contexts(ignore_unknown_help=True):
        own = _flags(context, valued=False)
        names = [name for name in (context.name, *context.aliases) if name]  # a task's context has a name
        task = collection[names[0]]
        gatherer = getattr(task, "rest", None)
        read = Words(
            valued=frozenset(_flags(context) | (_flags(core) - own)),
            slots=tuple(to_flag(name) for name in task.positional),
            rest=to_flag(gatherer) if gatherer else None,
        )
        found.update(dict.fromkeys(names, read))
    return found


def _flags(context: ParserContext, *, valued: bool = True) -> set[str]:
    """Every spelling (-j, --json) of the context's flags; with ``valued``, of those that always
    take a value (an optional value, as core --help's, is not taken from a bare word)."""
    arguments = [a for a in context.flags.values() if not valued or (a.takes_value and not a.optional)]
    return {to_flag(name) for argument in arguments for name in argument.names}


def _missing_slots(tasks: Sequence[ParserContext], collection: Collection) -> None:
    """Refuse a task run without one of its positional arguments (`stackgate fleet`)."""
    for context in tasks:
        for name in collection[context.name].positional:
            argument = context.args[name]
            if argument.value is None:
                raise Exit(f"stackgate: {_needs(str(context.name), argument, value_name(name))}", code=ExitCode.USAGE)


def _other_actions_options(tasks: Sequence[ParserContext], collection: Collection) -> None:
    """Refuse an option that only other actions take (`stackgate fleet verify --canary 2`); an action the
    task does not know is the command's to name, with the nearest one."""
    for context in tasks:
        task = collection[context.name]
        actions = getattr(task, "actions", None) or {}
        action = context.args[task.positional[0]].value if actions else None
        if action not in actions:
            continue
        for option in sorted({o for spec in actions.values() for o in spec.options} - set(actions[action].options)):
            argument = context.args[option]
            if argument.value in (None, [], argument.default):
                continue
            owners = ", ".join(each for each, spec in actions.items() if option in spec.options)
            said = f"{context.name} {action} takes no {to_flag(option)}: it is an option of {context.name} {owners}"
            lists = f"`stackgate {context.name} {action} --help` lists its options"
            raise Exit(f"stackgate: {said} ({lists})", code=ExitCode.USAGE)


def _needs(said: str, argument: Argument | None, what: str) -> str:
    """``verify --json needs a value: write the JSON report here``: what was said, what it lacks, and why."""
    text = f": {argument.help}" if argument is not None and argument.help else ""
    return f"{said} needs {what}{text}"


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
    which value it needs (``--json needs a value: write the JSON report here``); an unknown word
    names the nearest command or flag (``did you mean --check?``)."""
    context = error.context
    if isinstance(error, MissingValue):
        return _missing_value(error.task, error.flag)
    unknown = _UNKNOWN.fullmatch(str(error))
    if unknown is not None:
        return _unknown_text(unknown[1], context)
    found = _NEEDED_VALUE.match(str(error))
    if found is None or context is None:
        return str(error)
    return _missing_value(str(context.name), "--" + found[1].replace("_", "-"))


def _missing_value(task: str, flag: str) -> str:
    contexts = {context.name: context for context in namespace.to_contexts(ignore_unknown_help=True)}
    argument = contexts[task].flags.get(flag) if task in contexts else None
    needs = "a number" if argument is not None and argument.kind is int else "a value"
    said = f"{task} --{str(argument.name).replace('_', '-')}" if argument is not None else f"{task} {flag}".strip()
    return _needs(said, argument, needs)


def _unknown_text(word: str, context: ParserContext | None) -> str:
    """``no option or command 'verfy' here: did you mean verify?``; a flag is matched against the
    flags of the command it follows (and the global ones), any other word against the commands."""
    task = context.name if context is not None and context.name else None
    if word.startswith("-"):
        flags = {to_flag(n) for a in (*program.initial_context.flags.values(),) for n in a.names}
        if task is not None and context is not None:
            flags |= {to_flag(n) for a in context.flags.values() for n in a.names}
        candidates = sorted(flags)
    else:
        candidates = sorted(namespace.task_names)
    near = difflib.get_close_matches(word.partition("=")[0], candidates, n=1, cutoff=0.6)
    where = f"{task} has no option" if task is not None and word.startswith("-") else "no option or command"
    guess = f": did you mean {near[0]}?" if near else ""
    lists = f"`stackgate {task} --help` lists its options" if task is not None and word.startswith("-") else _LISTS
    return f"{where} {word!r} here{guess} ({lists})"


program = StackgateProgram(name="stackgate", binary="stackgate", version=__version__, namespace=namespace)
