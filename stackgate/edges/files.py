"""Reports and kept runs written to disk: atomically (a reader never sees half a file), with
their secrets hidden (:mod:`stackgate.models.redact`), whoever built them."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

from stackgate.models.redact import redact

__all__ = ["STDOUT", "to_stdout", "unwritable", "write_json", "write_text"]

#: A report path that means standard output, as everywhere else.
STDOUT = "-"


def to_stdout(path: Path | str | None) -> bool:
    """Whether a report path means standard output (``-``).

    >>> to_stdout("-"), to_stdout(Path("-")), to_stdout("./-"), to_stdout(None)
    (True, True, False, False)
    """
    return path is not None and str(path) == STDOUT


def unwritable(outputs: Mapping[str, Path]) -> str | None:
    """Why one of the report paths (option -> path) could not be written at the end, or None.

    Checked before anything runs, so that a command refuses at once (exit 2) rather than after
    its work: a folder, a place under a file or a folder this user cannot write; ``-`` is
    standard output, for one report at most.
    """
    piped = [option for option, path in outputs.items() if to_stdout(path)]
    if len(piped) > 1:
        return f"{' and '.join(piped)}: only one report can go to standard output (-)"
    for option, path in outputs.items():
        if to_stdout(path):
            continue
        if path.is_dir():
            return f"{option} {path}: is a directory"
        existing = next((p for p in (path.parent, *path.parent.parents) if p.exists()), None)
        if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            return f"{option} {path}: cannot write there ({existing or path.parent} is not a writable folder)"
    return None


def write_json(path: Path | str, doc: Mapping[str, Any]) -> None:
    """The document as strict JSON, its secrets hidden (a report, a kept run).

    A NaN or an infinity fails here, loudly, not later in a reader's parser.
    """
    write_text(path, json.dumps(redact(doc), indent=2, sort_keys=False, allow_nan=False) + "\n")


def write_text(path: Path | str, text: str) -> None:
    """Write a report atomically: a reader never sees half a file.

    The temporary file is hidden (a leading dot, no report suffix), so a collector that reads
    a folder (node_exporter's textfile collector reads *.prom) never picks it up; the report
    gets the permissions a plain write would give (mkstemp makes files private to their owner,
    which would hide a root-written report from the collector's own user).
    ``-`` is standard output.
    """
    if to_stdout(path):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask, read without changing it (Linux says it in /proc; setting and
    restoring it would race with other threads creating files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
