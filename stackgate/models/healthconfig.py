"""The Slurm health check's settings (``stackgate slurm-health``) and its drain reasons.

slurmd runs a ``HealthCheckProgram`` as root with a nearly empty environment (no PATH of the
site's, no SLURM_CONF, an unknown working folder), so every path here must be absolute, and
everything comes from flags or from one TOML file the program is pointed at (``--config``)::

    [slurm-health]
    lock = "/etc/stackgate/node.toml"        # the spec verify --cached checks against
    prom = "/var/lib/prometheus/node-exporter/stackgate_verify.prom"
    timeout_s = 30                           # the hard cap on the verify run
    checks = ["gpu.*", "python.*"]           # default: every static check, as verify --cached
    stackgate = "/opt/stackgate/bin/stackgate"   # default: this program's own interpreter
    slurm_bin = "/usr/bin"                   # where scontrol and sinfo are
    slurm_conf = "/etc/slurm/slurm.conf"     # default: Slurm's own default
    node = "gpu01"                           # default: $SLURMD_NODENAME, else the short hostname
    state_dir = "/var/lib/stackgate/slurm-health"   # the damping's counts and each node's reason history
    role = "check"                           # check (HealthCheckProgram), prolog, epilog (slurm.conf's Prolog=,
                                             # Epilog=), judge (a verdict only, Slurm untouched: NHC acts on it)

A drain reason this check writes starts with :data:`PREFIX`; only a node drained with such a
reason is ever resumed by it: an admin's drain (any other reason) is left alone.
"""

from __future__ import annotations

import difflib
import math
import re
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from stackgate.models.exitcodes import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the 3.10 floor
    import tomli as tomllib

__all__ = [
    "PREFIX",
    "REASON_MAX",
    "ROLES",
    "HealthConfig",
    "drain_reason",
    "load",
    "ours",
    "parse",
]

PREFIX = "stackgate:"
#: Longest reason written: Slurm keeps any length, but `sinfo -R` shows about this much of it.
REASON_MAX = 120
DEFAULT_TIMEOUT_S = 30.0
_NODE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,62}$")
_PATHS = ("lock", "prom", "stackgate", "slurm_bin", "slurm_conf", "state_dir")
#: What the program is run as: slurmd's periodic HealthCheckProgram, or slurm.conf's Prolog or Epilog.
ROLES = ("check", "prolog", "epilog", "judge")
DEFAULT_STATE_DIR = Path("/var/lib/stackgate/slurm-health")
_FLAGS = {"timeout_s": "timeout", "checks": "check"}
#: Keys the file and the flags spell otherwise than the field: `lock` (as the CLI's --lock) is the spec.
_FIELDS = {"lock": "spec"}


@dataclass(frozen=True)
class HealthConfig:
    spec: Path | None = None
    prom: Path | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    checks: tuple[str, ...] = ()
    stackgate: Path | None = None
    slurm_bin: Path | None = None
    slurm_conf: Path | None = None
    node: str | None = None
    state_dir: Path = DEFAULT_STATE_DIR
    role: str = "check"

    def merged(self, flags: Mapping[str, Any]) -> HealthConfig:
        """These settings with the flags given (not None, not empty) on top, each checked."""
        given = {k: v for k, v in flags.items() if v not in (None, (), "")}
        problems: list[str] = []
        values = _values(given, "--", problems, flag=True)
        _raise(problems, "slurm-health")
        return replace(self, **values)


def drain_reason(check: str, summary: str) -> str:
    """``stackgate: <check>: <summary>``, one printable line of at most :data:`REASON_MAX`.

    >>> drain_reason("gpu.count", "found 7 GPUs,\\n the spec wants 8")
    'stackgate: gpu.count: found 7 GPUs, the spec wants 8'
    >>> len(drain_reason("python.pins", "x" * 500))
    120
    """
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in f"{PREFIX} {check}: {summary}").split())
    return text if len(text) <= REASON_MAX else text[: REASON_MAX - 3] + "..."


def ours(reason: str) -> bool:
    """Whether a node's reason was written by this check (an admin's is anything else)."""
    return reason.startswith(PREFIX)


def load(path: Path) -> HealthConfig:
    try:
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--config {path}: cannot read it: {getattr(exc, 'strerror', None) or exc}") from exc
    return parse(text, str(path))


def parse(text: str, source: str = "config") -> HealthConfig:
    """The ``[slurm-health]`` table of a TOML text, every key checked.

    >>> parse('[slurm-health]\\nlock = "node.toml"\\ntimeout_s = -1\\nchekcs = []', "h.toml")
    Traceback (most recent call last):
    stackgate.models.exitcodes.UsageError: h.toml: 3 problems:
      slurm-health.chekcs: unknown key (did you mean 'checks'?)
      slurm-health.lock: 'node.toml' is not an absolute path (slurmd runs the check from any folder)
      slurm-health.timeout_s: -1 is not a number of seconds above 0
    """
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{source}: not valid TOML: {exc}") from exc
    except RecursionError:
        raise UsageError(f"{source}: not valid TOML: nested too deeply") from None
    problems = [f"{key}: unknown table (the settings are in [slurm-health])" for key in raw if key != "slurm-health"]
    table = raw.get("slurm-health", {})
    if not isinstance(table, dict):
        problems.append(f"slurm-health: a table, not {type(table).__name__}")
        table = {}
    values = _values(table, "slurm-health.", problems)
    _raise(problems, source)
    return HealthConfig(**values)


def _values(table: Mapping[str, Any], where: str, problems: list[str], *, flag: bool = False) -> dict[str, Any]:
    keys = {v: k for k, v in _FIELDS.items()}
    known = tuple(keys.get(f.name, f.name) for f in fields(HealthConfig))
    found: dict[str, Any] = {}
    for key, value in table.items():
        path = f"{where}{_FLAGS.get(key, key).replace('_', '-') if flag else key}"
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            problems.append(f"{path}: unknown key" + (f" (did you mean {close[0]!r}?)" if close else ""))
        elif key in _PATHS:
            _absolute(value, path, problems, found, _FIELDS.get(key, key))
        elif key == "timeout_s":
            number = _number(value)
            if number is None or not (math.isfinite(number) and number > 0):
                problems.append(f"{path}: {value!r} is not a number of seconds above 0")
            else:
                found[key] = number
        elif key == "checks":
            if isinstance(value, (list, tuple)) and all(
                isinstance(v, str) and v and not v.startswith("-") for v in value
            ):
                found[key] = tuple(value)
            else:
                problems.append(f"{path}: {value!r} is not a list of check names or globs")
        elif key == "role":
            if value in ROLES:
                found[key] = value
            else:
                problems.append(f"{path}: {value!r} is not one of {', '.join(ROLES)}")
        elif isinstance(value, str) and _NODE.match(value):
            found[key] = value
        else:
            problems.append(f"{path}: {value!r} is not a Slurm node name")
    return found


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _absolute(value: Any, path: str, problems: list[str], found: dict[str, Any], key: str) -> None:
    if isinstance(value, (str, Path)) and str(value) and "\x00" not in str(value) and Path(value).is_absolute():
        found[key] = Path(value)
    else:
        problems.append(f"{path}: {str(value)!r} is not an absolute path (slurmd runs the check from any folder)")


def _raise(problems: list[str], source: str) -> None:
    if problems:
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        raise UsageError(f"{source}: {count}:\n  " + "\n  ".join(sorted(problems)))
