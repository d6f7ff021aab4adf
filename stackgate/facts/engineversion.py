"""Which release of the serving engine the stack holds: its installed distribution's version, read
by the stack's own interpreter (the probe, without importing torch or the engine), so that what
stackgate expects of the engine's log follows the release installed, never an assumed one."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from stackgate.facts.interpreters import describe
from stackgate.facts.values import Missing

__all__ = ["installed_version"]


def installed_version(python: Path, environ: Mapping[str, str], distribution: str) -> str | None:
    """The version of ``distribution`` installed for ``python`` under ``environ``; None when the
    interpreter cannot say or does not hold it."""
    if not python.exists():
        return None
    facts = describe(python, environ, torch=False)
    if isinstance(facts, Missing):
        return None
    found = facts.dist(distribution)
    return found.version if found is not None else None
