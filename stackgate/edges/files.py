"""Reports and kept runs written to disk: atomically (a reader never sees half a file), with
their secrets hidden (:mod:`stackgate.models.redact`), whoever built them."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

from stackgate.models.redact import redact

__all__ = ["write_json", "write_text"]


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
    """
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
