"""The prefilter's reader of regular expressions (stackgate.scan.literals)."""

from __future__ import annotations

import re

import pytest

from stackgate.models import knowledge
from stackgate.scan.literals import LiteralError, required_literals


@pytest.mark.parametrize(
    ("source", "runs"),
    [
        (r"undefined symbol: (?P<symbol>\S+)", ["undefined symbol: "]),
        (
            r"Attention backend not (?:specified|set)\. Use (?P<b>\w+) backend",
            ["Attention backend not ", ". Use ", " backend"],
        ),
        (r"a(?:bc)?d", ["a", "d"]),
        (r"x(?:yz)+w", ["xyz", "w"]),
        (r"lib[a-z]+\.so\.\d+", ["lib", ".so."]),
        (r"^NVRM: Xid \(PCI:(?P<bus>[0-9a-f:.]+)\): (?P<xid>\d+)", ["NVRM: Xid (PCI:", "): "]),
        (r"(?=look)ahead", ["ahead"]),
        (r"ab{2}c", ["ab", "c"]),
        (r"a{0,3}bc", ["bc"]),
        (r"one|two", []),
        (r"\x41BC\u0041DE", ["BC", "DE"]),
        (r"(?s:A.B)C", ["A", "BC"]),
        (r"(?i:abc)d", ["d"]),
        (r"a(?P=name)b", ["a", "b"]),
        (r"tab\there", ["tab", "here"]),
    ],
)
def test_the_runs_every_match_contains(source: str, runs: list[str]) -> None:
    assert required_literals(source) == runs


@pytest.mark.parametrize("source", [r"(unclosed", r"[unclosed", r"closed)"])
def test_an_unbalanced_pattern_is_an_error(source: str) -> None:
    with pytest.raises(LiteralError):
        required_literals(source)


def test_every_run_of_every_signature_is_in_each_of_its_examples() -> None:
    """A run that an example does not contain would make the prefilter skip a real failure."""
    for signature in knowledge.load():
        for example in signature.examples:
            for pattern in signature.patterns:
                hit = pattern.search(example)
                if hit is None:
                    continue
                for run in required_literals(pattern.pattern):
                    assert run in hit.group(0), (signature.id, run)


def test_the_knowledge_base_no_longer_imports_the_private_parser() -> None:
    import stackgate.models.knowledge._model as model
    import stackgate.scan.keys as keys

    assert all("_parser" not in open(m.__file__, encoding="utf-8").read() for m in (model, keys))
    assert re.compile("x")  # the public module is all it needs


def test_no_pattern_holds_a_raw_newline() -> None:
    """A TOML basic string turns "\\n" into a newline: the pattern must say \\\\n (grep reads lines)."""
    for signature in knowledge.load():
        for pattern in signature.patterns:
            assert "\n" not in pattern.pattern, signature.id
