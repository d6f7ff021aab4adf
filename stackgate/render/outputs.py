"""Where a command's reports go: one check that every path can be written, one writer for every format.

A command names its outputs as ``{option: Output(path, render)}``; ``render`` turns the run's
document into the file's text (JSON, JUnit XML, Markdown, Prometheus, HTML). Paths are checked
before anything runs (exit 2, nothing changed) and written atomically after the run (JSON through
:func:`stackgate.edges.files.write_json`, which hides secrets; each other format's renderer hides its own).
A folder that does not exist yet is made (as pytest's --junitxml makes its own), and said so on
standard error, so that a mistyped path does not make a folder unseen.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from stackgate.edges.files import to_stdout, unwritable, write_json, write_text

__all__ = ["JSON", "Output", "check_outputs", "write_reports"]

#: A format: the run's document -> the file's text.
Render = Callable[[Mapping[str, Any]], str]


def JSON(doc: Mapping[str, Any]) -> str:  # noqa: N802 (a format's name, as the others are)
    """The document as strict JSON (written through :func:`stackgate.edges.files.write_json`)."""
    return json.dumps(doc, indent=2, allow_nan=False)


@dataclass(frozen=True)
class Output:
    """One report a command was asked for: where it goes and how the document becomes its text."""

    path: Path | None
    render: Render


def check_outputs(outputs: Mapping[str, Output]) -> str | None:
    """Why one of the asked-for reports could not be written at the end (checked before anything
    runs), or None. ``-`` is standard output, and only one report may go there."""
    return unwritable({option: out.path for option, out in outputs.items() if out.path is not None})


def write_reports(doc: Mapping[str, Any], outputs: Mapping[str, Output]) -> None:
    """Write each asked-for report of ``doc``, atomically (``-``: standard output)."""
    for option, out in outputs.items():
        if out.path is None:
            continue
        made = _missing_folder(out.path)
        if out.render is JSON:
            write_json(out.path, doc)
        else:
            write_text(out.path, out.render(doc))
        if made is not None:
            sys.stderr.write(f"stackgate: {option} {out.path}: made the folder {made}, which did not exist\n")


def _missing_folder(path: Path) -> Path | None:
    """The outermost folder above ``path`` that does not exist (writing the report makes it), or None."""
    if to_stdout(path):
        return None
    missing = [folder for folder in Path(path).parents if not folder.exists()]
    return missing[-1] if missing else None
