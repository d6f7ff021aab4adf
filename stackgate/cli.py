"""The command line's rules, shared by every task: one short flag per long flag, the same in every
task (``SHORT_FLAGS``, through :func:`task`); domain errors into invoke exits with the documented
codes (:func:`run_command`); and a reader that stops reading (``stackgate provision | head -1``)
is not turned into a traceback."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Protocol

import invoke
from invoke.exceptions import Exit

from stackgate.express import outcome
from stackgate.models.exitcodes import ExitCode
from stackgate.streams import quiet_closed_output

__all__ = [
    "ALIASES",
    "SHORT_FLAGS",
    "VALUE_NAMES",
    "Action",
    "Task",
    "quiet_closed_output",
    "run_command",
    "task",
    "value_name",
]

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

#: Other long names a flag is also given by, by parameter: an old spelling kept where it is the
#: documented contract (`lock --check` is lock's --up-to-date; --check NAME elsewhere picks checks).
ALIASES: Mapping[str, tuple[str, ...]] = {"up_to_date": ("check",)}

#: The word help shows for each flag's value (``--lock=PATH``), by long flag, the same in every task
#: that has the flag (invoke writes ``STRING`` for all); a task's bare words are named by the flag
#: that gathers them (``stackgate diagnose [LOG...]``).
VALUE_NAMES: Mapping[str, str] = {
    "lock": "PATH",
    "json": "PATH",
    "junit": "PATH",
    "markdown": "PATH",
    "prom": "PATH",
    "html": "PATH",
    "model": "PATH",
    "out": "PATH",
    "python": "PATH",
    "inventory": "PATH",
    "config": "PATH",
    "kernel_log": "PATH",
    "bundle": "PATH",
    "stackgate": "PATH",
    "slurm_conf": "PATH",
    "to": "SPEC",
    "wheelhouse": "DIR",
    "runs_dir": "DIR",
    "node_dir": "DIR",
    "shared_dir": "DIR",
    "slurm_bin": "DIR",
    "check": "NAME",
    "profile": "NAME",
    "upgrade_package": "NAME",
    "partition": "NAME",
    "node": "NAME",
    "parallel": "N",
    "batch": "N",
    "canary": "N",
    "max_nodes": "N",
    "nodes": "N",
    "tp": "N",
    "port": "N",
    "last": "N",
    "timeout": "SECONDS",
    "connect_timeout": "SECONDS",
    "concurrency": "N,N,...",
    "rates": "R,R,...",
    "path": "LOG",
    "run": "RUN",
    "action": "ACTION",
    "hosts": "HOSTS",
    "only": "AREA",
    "switch": "RULE",
    "engine": "ENGINE",
    "engine_option": "NAME=VALUE",
    "nodelist": "NODES",
    "time": "LIMIT",
    "slurm_arg": "FLAG",
    "regressed_since": "DATE",
    "threshold": "PERCENT",
    "help": "COMMAND",
    "print-completion-script": "SHELL",
}


def value_name(name: str) -> str:
    """The word help shows for the value of flag ``name`` (a parameter's name, ``runs_dir``).

    >>> value_name("lock"), value_name("new_flag")
    ('PATH', 'NEW_FLAG')
    """
    return VALUE_NAMES.get(name, name.upper().replace("-", "_"))


class Action(Protocol):
    """A sub-command of a task (stackgate.models.fleetoptions.FleetAction): its summary and its own options."""

    @property
    def summary(self) -> str: ...

    @property
    def options(self) -> tuple[str, ...]: ...


class Task(invoke.Task):
    """An invoke task whose short flags come from :data:`SHORT_FLAGS`, never from a guess.

    ``rest`` names the argument that gathers a task's bare words (``stackgate diagnose a.log
    b.log``): invoke gives a positional argument one word, so the program (stackgate.program) turns
    each bare word after such a task into that flag. ``actions`` are the values of a task's first
    positional argument that are sub-commands (``stackgate fleet gate``), each with its ``summary``
    and the ``options`` only it takes: the program shows each action's help with its own options and
    refuses another action's.
    """

    def __init__(
        self, *args: Any, rest: str | None = None, actions: Mapping[str, Action] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **{**kwargs, "auto_shortflags": False})
        self.rest = rest
        self.actions: Mapping[str, Action] = actions or {}

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
        opts["names"] = [*opts["names"], *ALIASES.get(name, ())]
        return opts


def task(*args: Any, **kwargs: Any) -> Any:
    """``invoke.task`` making a :class:`Task`: ``@task(help={...})``, ``@task(rest="path")``."""
    return invoke.task(*args, klass=Task, **kwargs)


def run_command(command: Callable[[], ExitCode]) -> None:
    """Run a command; exit with its code, 2 for a usage error, 130 when interrupted."""
    code, message = outcome(command)
    if message is not None or code != ExitCode.PASSED:
        raise Exit(message, code=int(code))
