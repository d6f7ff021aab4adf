"""Every ``STACKGATE_*`` setting, declared once: its variable, type, default and meaning.

A setting is read from the environment each time it is asked for, never when a module is
imported, so an ``export`` (or a test's ``monkeypatch.setenv``) takes effect at once and ``-v``
can say where each value came from: the default, an environment variable, or a flag that a
command passed. A value that does not parse is a :class:`UsageError` naming the variable (a
usage error, exit 2); :func:`report` reads them all, so a command refuses a bad one before it
touches anything. An empty variable counts as unset.

Renamed variables keep their old name for one release: a value set only under the old name is
used, with a one-line warning on stderr naming the new one.

``python -m stackgate.models.settings`` prints the table that docs/settings.md carries.
"""

from __future__ import annotations

import math
import os
import re
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar

from stackgate.models.exitcodes import UsageError

__all__ = [
    "BASE_PYTHON",
    "DEEP_AHEAD",
    "DEEP_DIR",
    "DEEP_TIMEOUT_S",
    "DOWNLOAD_TIMEOUT_S",
    "FAULT",
    "HISTORY_DIR",
    "HISTORY_INDEX",
    "IMPORT_TIMEOUT_S",
    "KEEP_GENERATIONS",
    "KMSG",
    "LAUNCH_MARKER",
    "LOCK",
    "LOG_DIR",
    "NVML_MODULE",
    "PROBE_TIMEOUT_S",
    "PYTHON_INSTALL_TIMEOUT_S",
    "RUNFILE_CACHE",
    "SETTINGS",
    "SYSTEM_DIR",
    "TOOLKIT_INDEX_URL",
    "TOOLKIT_INSTALLER",
    "TOOLKIT_INSTALL_TIMEOUT_S",
    "Setting",
    "Value",
    "markdown_table",
    "report",
    "state_home",
]

T = TypeVar("T")
#: A flag that a command passed for a setting: (its name as typed, its value; None when not given).
Flag = tuple[str, Any]


@dataclass(frozen=True)
class Value(Generic[T]):
    """A setting's value in force, and where it came from."""

    setting: Setting[T]
    value: T
    source: str  #: "default", "environment $NAME", or "flag --NAME"

    @property
    def is_default(self) -> bool:
        return self.source == "default"

    @property
    def text(self) -> str:
        """The value as a person reads it; an unset one says what happens instead."""
        if self.value is None:
            return f"(unset: {self.setting.unset})"
        if isinstance(self.value, tuple):
            return ",".join(self.value) or "(none)"
        if isinstance(self.value, bool):
            return "on" if self.value else "off"
        return f"{self.value:g}" if isinstance(self.value, float) else str(self.value)


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One setting: the variable that sets it, how its text parses, its default, what it means."""

    env: str
    parse: Callable[[str], T]  #: raises ValueError with the reason a text is refused
    default: T
    meaning: str
    unset: str = ""  #: what happens when the default is None (the caller decides, e.g. a search)
    old: str | None = None  #: the deprecated name it had until this release
    test_only: bool = False

    def value(self, environ: Mapping[str, str] | None = None) -> T:
        """The value in force in ``environ`` (default: this process's environment, read now)."""
        return self.lookup(environ).value

    def lookup(self, environ: Mapping[str, str] | None = None, flag: Flag | None = None) -> Value[T]:
        """The value in force and its source: a given flag, then the variable, then the default."""
        if flag is not None and flag[1] is not None:
            return Value(self, flag[1], f"flag {flag[0]}")
        environ = os.environ if environ is None else environ
        name = self.env if environ.get(self.env) or not self.old or not environ.get(self.old) else self.old
        text = environ.get(name)
        if not text:
            return Value(self, self.default, "default")
        if name != self.env:
            _warn_renamed(name, self.env)
        try:
            parsed = self.parse(text)
        except ValueError as exc:
            raise UsageError(f"${name}={text[:200]!r}: {exc}; unset, it is {_shown(self) or 'empty'}") from exc
        return Value(
            self, parsed, f"environment ${name}" + (f", the old name of ${self.env}" if name != self.env else "")
        )


_WARNED: set[str] = set()


def _warn_renamed(old: str, new: str) -> None:
    """One line on stderr, once per process and name: the old name still works, for now."""
    if old in _WARNED:
        return
    _WARNED.add(old)
    sys.stderr.write(f"stackgate: ${old} is deprecated and goes in the next release; set ${new} instead\n")


def _shown(setting: Setting[Any]) -> str:
    """The default as docs/settings.md and errors show it.

    >>> _shown(DEEP_TIMEOUT_S), _shown(DEEP_DIR)
    ('300', "the system's temp folder")
    """
    if setting.default is None:
        return setting.unset
    return Value(setting, setting.default, "default").text.replace("(none)", "")


# --- parsers: each takes the variable's text, returns the value or raises ValueError(reason) ---


def seconds(text: str) -> float:
    """A positive, finite number of seconds.

    >>> seconds("1.5"), seconds("300")
    (1.5, 300.0)
    >>> seconds("abc")
    Traceback (most recent call last):
    ValueError: not a number of seconds
    """
    try:
        value = float(text)
    except ValueError:
        raise ValueError("not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError("must be a number of seconds above 0")
    return value


def count(text: str) -> int:
    """A whole number of at least 1.

    >>> count("3")
    3
    >>> count("0")
    Traceback (most recent call last):
    ValueError: must be a whole number of at least 1
    """
    try:
        value = int(text)
    except ValueError:
        raise ValueError("not a whole number") from None
    if value < 1:
        raise ValueError("must be a whole number of at least 1")
    return value


def path(text: str) -> Path:
    """A path; ``~`` is the user's home."""
    return Path(text).expanduser()


def url(text: str) -> str:
    """An http(s) URL with a host.

    >>> url("ftp://x/simple")
    Traceback (most recent call last):
    ValueError: not an http(s) URL with a host
    """
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL with a host")
    return text


def module(text: str) -> str:
    """A dotted module name.

    >>> module("fakes.fake_nvml")
    'fakes.fake_nvml'
    >>> module("fakes/fake_nvml.py")
    Traceback (most recent call last):
    ValueError: not a module name (e.g. pynvml, or fakes.fake_nvml)
    """
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", text):
        raise ValueError("not a module name (e.g. pynvml, or fakes.fake_nvml)")
    return text


def installer(text: str) -> str:
    """``uv`` or ``pip``."""
    if text not in ("uv", "pip"):
        raise ValueError("must be uv or pip")
    return text


def switch(text: str) -> bool:
    """``on`` or ``off`` (also 1/0, yes/no, true/false).

    >>> switch("off"), switch("1")
    (False, True)
    """
    value = text.strip().lower()
    if value in ("1", "on", "yes", "true"):
        return True
    if value in ("0", "off", "no", "false"):
        return False
    raise ValueError("must be on or off")


def points(text: str) -> tuple[str, ...]:
    """Comma-separated names, blanks dropped.

    >>> points("before:python.stack, deep.hang:1,")
    ('before:python.stack', 'deep.hang:1')
    """
    return tuple(p.strip() for p in text.split(",") if p.strip())


# --- the declarations, in the order -v and docs/settings.md list them --------------------------

LOCK: Setting[Path | None] = Setting(
    "STACKGATE_LOCK",
    path,
    None,
    "the lockfile a command uses when `--lock` names none",
    unset=(
        "stackgate.toml in the working folder or the nearest folder above it, then <system dir>/stack.toml, "
        "then the shipped profile blackwell-sm120-cu130"
    ),
)
SYSTEM_DIR: Setting[Path] = Setting(
    "STACKGATE_SYSTEM_DIR",
    path,
    Path("/etc/stackgate"),
    "the machine's own folder: its stack.toml is the lock when neither --lock, $STACKGATE_LOCK "
    "nor a stackgate.toml here or above names one; `init --system` writes there",
)
NVML_MODULE: Setting[str] = Setting(
    "STACKGATE_NVML_MODULE", module, "pynvml", "the module spoken to as NVML: pynvml's API (tests name a fake)"
)
PROBE_TIMEOUT_S: Setting[float] = Setting(
    "STACKGATE_PROBE_TIMEOUT_S",
    seconds,
    180.0,
    "how long the stack's interpreter may take to describe itself, torch's import included",
)
IMPORT_TIMEOUT_S: Setting[float] = Setting(
    "STACKGATE_IMPORT_TIMEOUT_S", seconds, 180.0, "how long each locked import may take in its own interpreter"
)
DEEP_TIMEOUT_S: Setting[float] = Setting(
    "STACKGATE_DEEP_TIMEOUT_S", seconds, 300.0, "how long each `verify --deep` run may take before it counts as a hang"
)
DEEP_DIR: Setting[Path | None] = Setting(
    "STACKGATE_DEEP_DIR",
    path,
    None,
    "where each `verify --deep` run's folder (its JSON lines and full log) is made",
    unset="the system's temp folder",
)
DEEP_AHEAD: Setting[bool] = Setting(
    "STACKGATE_DEEP_AHEAD",
    switch,
    True,
    "start each `verify --deep` run's interpreter (and its torch import) while the prerequisites are gathered; "
    "off: each starts with its check",
)
BASE_PYTHON: Setting[Path | None] = Setting(
    "STACKGATE_BASE_PYTHON",
    path,
    None,
    "the interpreter provision builds new generations from",
    unset="searched: pythonX.Y on PATH, pyenv's and uv's installs, /usr/local/bin, /usr/bin",
    old="STACKGATE_PYTHON",
)
PYTHON_INSTALL_TIMEOUT_S: Setting[float] = Setting(
    "STACKGATE_PYTHON_INSTALL_TIMEOUT_S",
    seconds,
    3600.0,
    "how long one uv or pip run building the Python stack may take",
    old="STACKGATE_INSTALL_TIMEOUT_S",
)
DOWNLOAD_TIMEOUT_S: Setting[float] = Setting(
    "STACKGATE_DOWNLOAD_TIMEOUT_S",
    seconds,
    60.0,
    "how long a locked URL wheel's download may wait for data before it tries again",
)
KEEP_GENERATIONS: Setting[int] = Setting(
    "STACKGATE_KEEP_GENERATIONS", count, 3, "how many generations a switch keeps, the current one included"
)
TOOLKIT_INDEX_URL: Setting[str] = Setting(
    "STACKGATE_TOOLKIT_INDEX_URL", url, "https://pypi.org/simple", "the index CUDA toolkit wheels are installed from"
)
TOOLKIT_INSTALLER: Setting[str] = Setting(
    "STACKGATE_TOOLKIT_INSTALLER",
    installer,
    "uv",
    "what installs CUDA toolkit wheels: uv (pip where uv is not found) or pip",
)
TOOLKIT_INSTALL_TIMEOUT_S: Setting[float] = Setting(
    "STACKGATE_TOOLKIT_INSTALL_TIMEOUT_S",
    seconds,
    3600.0,
    "how long one CUDA toolkit install (its wheels or its runfile) may take",
    old="STACKGATE_TOOLKIT_TIMEOUT_S",
)
RUNFILE_CACHE: Setting[Path | None] = Setting(
    "STACKGATE_RUNFILE_CACHE",
    path,
    None,
    "where downloaded CUDA runfiles are kept",
    unset="~/.cache/stackgate/runfiles",
)
KMSG: Setting[Path] = Setting(
    "STACKGATE_KMSG",
    path,
    Path("/dev/kmsg"),
    "the kernel's record device, read first for the kernel log (then `dmesg`, then `journalctl -k`)",
)
LOG_DIR: Setting[Path] = Setting(
    "STACKGATE_LOG_DIR",
    path,
    Path("reports"),
    "where smoke and gate keep each run's server logs: `<dir>/smoke/<time>-<pid>/`, `<dir>/gate/<run id>/`; "
    "a fleet run's SSH log: `<dir>/fleet/<run id>-ssh.log`",
    old="STACKGATE_RUN_DIR",
)
HISTORY_DIR: Setting[Path | None] = Setting(
    "STACKGATE_HISTORY_DIR",
    path,
    None,
    "where gate and smoke runs are kept, and `report` reads them",
    unset="python.root's runs/ when the root holds a stack, else ~/.local/state/stackgate/runs",
    old="STACKGATE_RUNS_DIR",
)
HISTORY_INDEX: Setting[bool] = Setting(
    "STACKGATE_HISTORY_INDEX",
    switch,
    True,
    "`off`: keep and read runs without their SQLite index (`report` reads every document, as before the index)",
)
#: Not a setting: the variable each launch sets in its server's environment (its value the launch's
#: token), by which a later run proves a process is one stackgate launched (serve/launched.py).
LAUNCH_MARKER = "STACKGATE_LAUNCH_ID"
FAULT: Setting[tuple[str, ...]] = Setting(
    "STACKGATE_FAULT",
    points,
    (),
    "test only: faults to plant, `point[,point...]` (stackgate/edges/faults.py lists the points)",
    test_only=True,
)

#: Every setting, by variable, in declaration order.
SETTINGS: dict[str, Setting[Any]] = {
    s.env: s
    for s in (
        LOCK,
        SYSTEM_DIR,
        NVML_MODULE,
        PROBE_TIMEOUT_S,
        IMPORT_TIMEOUT_S,
        DEEP_TIMEOUT_S,
        DEEP_DIR,
        DEEP_AHEAD,
        BASE_PYTHON,
        PYTHON_INSTALL_TIMEOUT_S,
        DOWNLOAD_TIMEOUT_S,
        KEEP_GENERATIONS,
        TOOLKIT_INDEX_URL,
        TOOLKIT_INSTALLER,
        TOOLKIT_INSTALL_TIMEOUT_S,
        RUNFILE_CACHE,
        KMSG,
        LOG_DIR,
        HISTORY_DIR,
        HISTORY_INDEX,
        FAULT,
    )
}


def state_home(environ: Mapping[str, str] | None = None) -> Path:
    """stackgate's state folder: ``$XDG_STATE_HOME/stackgate``, by default ``~/.local/state/stackgate``.

    >>> state_home({"XDG_STATE_HOME": "/s", "HOME": "/h"}), state_home({"HOME": "/h"})
    (PosixPath('/s/stackgate'), PosixPath('/h/.local/state/stackgate'))
    """
    environ = os.environ if environ is None else environ
    if environ.get("XDG_STATE_HOME"):
        return Path(environ["XDG_STATE_HOME"]) / "stackgate"
    return Path(environ.get("HOME") or Path.home()) / ".local" / "state" / "stackgate"


def report(
    environ: Mapping[str, str] | None = None, flags: Mapping[Setting[Any], Flag] | None = None
) -> list[Value[Any]]:
    """Every setting's value in force and its source; a :class:`UsageError` naming every bad one.

    ``flags`` are what a command was given for a setting (``{LOCK: ("--lock", path)}``).
    """
    values: list[Value[Any]] = []
    problems: list[str] = []
    for setting in SETTINGS.values():
        try:
            values.append(setting.lookup(environ, (flags or {}).get(setting)))
        except UsageError as exc:
            problems.append(str(exc))
    if len(problems) == 1:
        raise UsageError(problems[0])
    if problems:
        raise UsageError(f"{len(problems)} bad settings in the environment:\n  " + "\n  ".join(problems))
    return values


def markdown_table(settings: Sequence[Setting[Any]] | None = None) -> str:
    """The settings as docs/settings.md lists them: variable, default, meaning (the old name, if any)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for setting in SETTINGS.values() if settings is None else settings:
        shown = _shown(setting)
        default = "(none)" if not shown else shown if setting.default is None else f"`{shown}`"
        renamed = f" (was `{setting.old}`, still read until the next release)" if setting.old else ""
        rows.append(f"| `{setting.env}` | {default} | {setting.meaning}{renamed} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown_table())
