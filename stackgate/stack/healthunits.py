"""The health check's systemd units, written for this machine: the shipped templates
(``stackgate/systemd/``) with the program that runs (the installed ``stackgate``, found from how
this one was started) and the spec it judges put into the service's ``ExecStart=``,
``Environment=STACKGATE_LOCK=`` and ``ConditionPathExists=`` lines.

The templates are units as they are (``systemd-analyze`` reads them); what changes per machine is
those three lines, so a unit installed by `stackgate init --health-units DIR` runs under pipx, uv
tool or a venv, and its condition names the spec the service is given.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from stackgate.models import settings
from stackgate.models.exitcodes import UsageError

__all__ = ["SERVICE", "TEMPLATES", "TIMER", "Unit", "installed_program", "render_units"]

#: The shipped unit templates (package data).
TEMPLATES = Path(__file__).resolve().parents[1] / "systemd"
SERVICE = "stackgate-health.service"
TIMER = "stackgate-health.timer"
#: What a unit cannot carry as a plain word: whitespace and quotes (word splitting), ``%``
#: (specifiers), ``$`` (variable expansion), ``;`` and ``\\`` (command separators, escapes), controls.
_UNSAFE = re.compile(r"[\s\"'%$;\\\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Unit:
    """One unit file to write: its name and its text."""

    name: str
    text: str


def installed_program(argv0: str, executable: str) -> Path:
    """The installed ``stackgate`` this process runs as, symlinks resolved (pipx and uv tool link
    ``~/.local/bin/stackgate`` to their venv's script): ``argv0`` when it is that program, else the
    ``stackgate`` beside the interpreter ``executable`` (``python -m stackgate`` in a venv).

    A stackgate that is not installed (a checkout's ``invoke``) has no program a unit can run from
    any folder: :class:`UsageError` says how to install one.
    """
    for candidate in (Path(argv0), Path(executable).parent / "stackgate"):
        if candidate.name == "stackgate" and candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate.resolve()
    raise UsageError(
        f"this stackgate is not an installed program (it runs as {argv0}, and {executable} has no `stackgate` "
        "beside it): the unit needs one that runs from any folder. Install it (pipx install stackgate, "
        "or uv tool install stackgate), then run: stackgate init --health-units /etc/systemd/system"
    )


def render_units(program: Path, spec: Path) -> list[Unit]:
    """The service and the timer, the service running ``program``'s cached verify of ``spec``.

    >>> service, timer = render_units(Path("/opt/sg/bin/stackgate"), Path("/etc/stackgate/stack.toml"))
    >>> [line for line in service.text.splitlines() if line.startswith(("Condition", "Environment=S", "ExecStart"))]
    ... # doctest: +NORMALIZE_WHITESPACE
    ['ConditionPathExists=/etc/stackgate/stack.toml', 'Environment=STACKGATE_LOCK=/etc/stackgate/stack.toml',
     'ExecStart=/opt/sg/bin/stackgate verify --cached --prom /var/lib/prometheus/node-exporter/stackgate_verify.prom']
    """
    _check_word("the program", program)
    _check_word("the spec (--lock)", spec)
    lines = []
    for line in (TEMPLATES / SERVICE).read_text(encoding="utf-8").splitlines():
        key = line.partition("=")[0]
        if key == "ConditionPathExists":
            line = f"ConditionPathExists={spec}"
        elif line.startswith(f"Environment={settings.LOCK.env}="):
            line = f"Environment={settings.LOCK.env}={spec}"
        elif key == "ExecStart":
            line = f"ExecStart={program} {line.partition('=')[2].split(maxsplit=1)[1]}"
        lines.append(line)
    return [Unit(SERVICE, "\n".join(lines) + "\n"), Unit(TIMER, (TEMPLATES / TIMER).read_text(encoding="utf-8"))]


def _check_word(what: str, path: Path) -> None:
    """A path a unit carries as one plain word: absolute, nothing systemd reads as syntax."""
    if not path.is_absolute():
        raise UsageError(f"{what} {path} is not an absolute path: a unit runs from /; give the full path")
    found = _UNSAFE.search(str(path))
    if found is not None:
        raise UsageError(
            f"{what} {str(path)!r} holds {found[0]!r}, which systemd reads as syntax in a unit: "
            "use a path of plain characters (a symlink to it will do)"
        )
