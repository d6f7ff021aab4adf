"""The signatures made ready to scan: each pattern's prefilter key, and the checks that need the engine.

The knowledge base (:mod:`stackgate.models.knowledge`) is data: its loader checks each entry's
fields. What only the engine can judge is checked here, still at load, still with the entry's
file and id: every pattern has a literal the prefilter can look for (read off the pattern by
:mod:`.literals`, or declared as ``anchor``), the extractor it names exists, and the names its
texts quote are captured, extracted or the stack's context.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import string
from pathlib import Path

from stackgate.models.knowledge import CONTEXT_KEYS, Signature, SignatureError, read_folder
from stackgate.models.knowledge import load as load_data
from stackgate.scan import extract
from stackgate.scan.literals import LiteralError
from stackgate.scan.literals import required_literals as _literal_runs

__all__ = [
    "COMMONNESS",
    "best_key",
    "known_names",
    "load",
    "prefilter_key",
    "quoted_names",
    "ready",
    "required_literal",
    "required_literals",
]

# Characters ordered from most to least common in serving and installer logs (counted on the
# healthy SGLang 0.5.9 and pip/uv logs under tests/data and on SGLang's serving lines, decode and
# prefill batches and access lines, as benchmarks/diagnose_speed.py writes them; characters not
# listed count as rarest). The prefilter key of a signature starts at its rarest character, and
# the scan looks for each key (or a one-line pattern's rarest literal) at its rarest byte, so
# that the search stops on few positions of a healthy log ("TP0" is on every serving line: a
# search anchored at "T" costs). Any choice is correct (a key is a substring of a literal every
# match contains); this one is fast.
COMMONNESS = " e0:un2tr,oa1g-h3ck#sq.6pdT45i978/P][bl()D_m=OFwf\"NyIKGHv'xSBECLzM+jARW|V<U%>Q}{!XJ\\;^@~*&Z?`$Y"


def quoted_names(signature: Signature) -> set[str]:
    """The ``{names}`` its title, cause, fix and commands quote."""
    texts = [signature.title, signature.cause, signature.fix, *signature.commands]
    return {name for text in texts for _, name, _, _ in string.Formatter().parse(text) if name}


def known_names(signature: Signature) -> set[str]:
    extracted = extract.EXTRACTORS[signature.extract].provides if signature.extract else ()
    return set(signature.group_names) | set(CONTEXT_KEYS) | set(extracted)


def required_literals(pattern: re.Pattern[str]) -> list[str]:
    """The runs of literal characters that every match of ``pattern`` contains, in order.

    >>> required_literals(re.compile(r"NCCL error in: (?P<where>\\S+), (?P<what>[a-z ]+)"))
    ['NCCL error in: ', ', ']
    """
    return _literal_runs(pattern.pattern)


def required_literal(pattern: re.Pattern[str]) -> str:
    """The longest run of literal characters that every match of ``pattern`` contains.

    >>> required_literal(re.compile(r"undefined symbol: (?P<symbol>\\S+)"))
    'undefined symbol: '
    """
    return max(required_literals(pattern), key=len, default="")


def best_key(literals: list[str]) -> str:
    """Of the keys the literals offer, the one that starts at the rarest character (then the longest).

    >>> best_key(["hint: `", "` was found on ", ", but not at the requested version"])
    '` was found on '
    """
    keys = [prefilter_key(literal) for literal in literals]
    return max(keys, key=lambda k: (len(k) >= 8, _rarity(k[0]) if k else -1, len(k)), default="")


def prefilter_key(literal: str, *, minimum: int = 8, longest: int = 24) -> str:
    """The part of ``literal`` the scan looks for: it starts at its rarest character.

    >>> prefilter_key("GPU has fallen off the bus")
    'U has fallen off the bus'
    >>> prefilter_key("abc")
    'abc'
    """
    if len(literal) <= minimum:
        return literal
    start = max(range(len(literal) - minimum + 1), key=lambda i: (_rarity(literal[i]), -i))
    return literal[start : start + longest]


def _rarity(ch: str) -> int:
    index = COMMONNESS.find(ch)
    return len(COMMONNESS) if index < 0 else index


@functools.lru_cache(maxsize=None)
def load(folder: Path | None = None) -> tuple[Signature, ...]:
    """Every signature of the knowledge base (or of ``folder``), ready to scan; raises :class:`SignatureError`."""
    return tuple(ready(s) for s in (load_data() if folder is None else read_folder(folder)))


def ready(signature: Signature) -> Signature:
    """The signature with its prefilter keys; an entry the engine cannot use raises :class:`SignatureError`."""
    where = f"{signature.file}: {signature.id}"
    try:
        keys = tuple(map(prefilter_key, signature.anchors))
        keys = keys or tuple(best_key(required_literals(p)) for p in signature.patterns)
    except LiteralError as exc:
        raise SignatureError(f"{where}: bad pattern: {exc}") from exc
    problems = []
    if any(len(k) < 4 for k in keys) and not signature.at_end:
        problems.append(
            f"each pattern needs a literal of 4+ characters for the prefilter (got {list(keys)}); declare `anchor`"
        )
    if signature.extract is not None and signature.extract not in extract.EXTRACTORS:
        problems.append(f"unknown extractor {signature.extract!r}")
    unknown = sorted(quoted_names(signature) - known_names(signature)) if not problems else []
    if unknown:
        problems.append(f"quotes unknown names {unknown}")
    if problems:
        raise SignatureError(f"{where}: {'; '.join(problems)}")
    return dataclasses.replace(signature, keys=keys)
