"""The failure knowledge base: signatures of known failures, kept as data.

Each ``*.toml`` file beside this module (one per component) holds ``[[signature]]`` entries:
an id and a title, the component, the stages where it shows (provision, verify, smoke), the
severity, regex patterns, the cause, the fix with commands, the public source it was learned
from with real examples from that source. diagnose, smoke's log scan, provision's reading of
installer output and verify's import classifier all read this one table, so that a signature
is written once.

Causes, fixes and commands may quote a pattern's named groups (``{lib}``), an extractor's
values (``{culprit}``) and the stack's context (``{lock_backend}``): the context keys are
:data:`CONTEXT_KEYS`, filled from a lock by :func:`lock_context`; without a lock each reads
as a neutral phrase.

Optional fields, for entries that need them: ``anchor`` (the literal the scan looks for, when
it cannot be read off the pattern), ``window`` (a multi-line event ending on the anchor's
line, like a traceback), ``after`` (lines following the anchor's line that belong to the
event, like a resolver's explanation), ``at_end`` with ``followed_only_by`` (only when the log
ends with it: a hang), ``preceded_by`` (an ``at_end`` match counts only after a line of
context, not in a pasted excerpt of its own kind of lines), ``consequence`` (a symptom listed after its
cause), ``supersedes`` (generic ids this specific one replaces on the same line), ``extract`` (an extractor of
:mod:`stackgate.scan.extract`), ``references`` and ``counterexamples``.

This package is the data and its model; the engine that scans text for it (the prefilter, the
scanner, the extractors, never-silent events) is :mod:`stackgate.scan`.
"""

from __future__ import annotations

from stackgate.models.finding import SEVERITIES, Finding
from stackgate.models.knowledge._model import (
    COMPONENTS,
    CONTEXT_KEYS,
    STAGES,
    Signature,
    SignatureError,
    context_defaults,
    load,
    read_folder,
    spec_context,
)

__all__ = [
    "COMPONENTS",
    "CONTEXT_KEYS",
    "SEVERITIES",
    "STAGES",
    "Signature",
    "SignatureError",
    "context_defaults",
    "load",
    "spec_context",
    "rank",
    "read_folder",
]


def rank(finding: Finding) -> tuple[int, bool, int]:
    """Sort key of findings: most severe first, causes before their consequences, then by position."""
    return (-SEVERITIES.index(finding.severity), finding.consequence, finding.evidence.line)
