"""An A/B of two stacks on the same GPUs, and the decision it supports: switch or keep.

The live stack (A, "live") and the new one (B, "new") are launched one after the other, in an
order alternated so that a machine that warms up or slows down over the run (clocks, thermal
state, a neighbour) favours neither: rounds of AB then BA (ABBA for two rounds), whose means
cancel any drift that is linear in time. Each side's decode rate pools the runs of all its legs;
the difference of the two means gets a 95% Welch interval: "slower" means slower beyond that
measured noise. Where the spec has an accuracy check, each side's exact answers pool over its
legs too, and a new stack that answers fewer of them exactly is kept out however fast it is.
Pure: numbers and token ids in, judgements out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from stackgate.serve import bench, quality

__all__ = [
    "LIVE",
    "MODES",
    "NEW",
    "Condition",
    "Decision",
    "Leg",
    "Side",
    "conditions",
    "decide",
    "difference",
    "not_measured",
    "order",
    "side",
]

LIVE, NEW = "live", "new"
MODES = ("if-better", "if-passes", "never")


def order(rounds: int) -> tuple[str, ...]:
    """The legs, in launch order: AB, then BA, alternating.

    >>> order(2)
    ('live', 'new', 'new', 'live')
    >>> order(3)
    ('live', 'new', 'new', 'live', 'live', 'new')
    """
    legs: list[str] = []
    for i in range(rounds):
        legs += [LIVE, NEW] if i % 2 == 0 else [NEW, LIVE]
    return tuple(legs)


@dataclass(frozen=True)
class Leg:
    """One launch of one side: what it measured and whether everything in it passed."""

    side: str
    position: int  #: 1-based, in launch order
    passed: bool
    decode: tuple[float, ...]  #: decode tok/s of each complete run
    tokens: tuple[int, ...] = ()  #: the first complete greedy run's token ids
    failures: tuple[str, ...] = ()  #: "check: summary" of each failed result
    accuracy: tuple[int, int] | None = None  #: exact answers and answers asked, where the check ran

    @property
    def mean(self) -> float | None:
        return sum(self.decode) / len(self.decode) if self.decode else None


@dataclass(frozen=True)
class Side:
    """One side over all its legs."""

    name: str
    legs: tuple[Leg, ...]
    decode: bench.Summary | None  #: the runs of every leg, pooled
    tokens: tuple[int, ...]  #: the greedy tokens of its first leg that had any
    repeatable: bool  #: every leg gave those same tokens
    accuracy: tuple[int, int] | None = None  #: exact answers and answers asked over its legs

    @property
    def passed(self) -> bool:
        return bool(self.legs) and all(leg.passed for leg in self.legs)

    @property
    def failures(self) -> list[str]:
        return [f"leg {leg.position}: {text}" for leg in self.legs for text in leg.failures]

    def to_dict(self) -> dict[str, Any]:
        return {
            "legs": [leg.position for leg in self.legs],
            "leg_means": [None if leg.mean is None else round(leg.mean, 3) for leg in self.legs],
            "passed": self.passed,
            "failures": self.failures,
            "decode_tok_s": self.decode.to_dict() if self.decode else None,
            "tokens": len(self.tokens),
            "repeatable": self.repeatable,
            "accuracy": list(self.accuracy) if self.accuracy else None,
        }


def side(name: str, legs: Sequence[Leg]) -> Side:
    mine = tuple(leg for leg in legs if leg.side == name)
    values = [v for leg in mine for v in leg.decode]
    with_tokens = [leg.tokens for leg in mine if leg.tokens]
    tokens = with_tokens[0] if with_tokens else ()
    scored = [leg.accuracy for leg in mine if leg.accuracy is not None]
    accuracy = (sum(r for r, _ in scored), sum(n for _, n in scored)) if scored else None
    return Side(name, mine, bench.summarize(values), tokens, all(t == tokens for t in with_tokens), accuracy)


@dataclass(frozen=True)
class Condition:
    """One thing the decision rests on, and whether it held."""

    name: str
    held: bool
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "held": self.held, "text": self.text}


@dataclass(frozen=True)
class Decision:
    mode: str
    switch: bool
    reason: str  #: one sentence: why current is switched or kept
    conditions: tuple[Condition, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "switch": self.switch,
            "reason": self.reason,
            "conditions": [c.to_dict() for c in self.conditions],
        }


def conditions(live: Side, new: Side, *, accept_output_change: bool) -> tuple[Condition, ...]:
    """passes, same greedy tokens, not slower, as accurate: what ``if-better`` needs, each with its evidence."""
    passes = Condition(
        "passes",
        new.passed,
        "the new stack passed every check of every leg"
        if new.passed
        else f"the new stack failed: {'; '.join(new.failures[:3]) or 'it was not measured'}",
    )
    return (passes, _same_tokens(live, new, accept_output_change), _not_slower(live, new), _as_accurate(live, new))


def _as_accurate(live: Side, new: Side) -> Condition:
    """The new stack answers the accuracy set at least as often exactly as the live one.

    >>> _as_accurate(side(LIVE, [Leg(LIVE, 1, True, (), accuracy=(16, 16))]),
    ...              side(NEW, [Leg(NEW, 2, True, (), accuracy=(13, 16))])).text
    'less accurate: new 13 of 16 exact (81.2%), live 16 of 16 (100.0%)'
    """
    if live.accuracy is None and new.accuracy is None:
        return Condition("as_accurate", True, "not checked: the spec has no [accuracy] floor")
    if live.accuracy is None or new.accuracy is None:
        missing = "live" if live.accuracy is None else "new"
        return Condition("as_accurate", False, f"cannot compare accuracy: the {missing} stack has no accuracy figure")
    (a, n), (b, m) = live.accuracy, new.accuracy
    text = f"new {b} of {m} exact ({b / m:.1%}), live {a} of {n} ({a / n:.1%})"
    if b * n < a * m:
        return Condition("as_accurate", False, f"less accurate: {text}")
    return Condition("as_accurate", True, f"as accurate: {text}")


def _same_tokens(live: Side, new: Side, accept: bool) -> Condition:
    if not live.tokens or not new.tokens:
        return Condition("same_output", False, "no greedy token ids from both sides to compare")
    found = quality.agreement(live.tokens, new.tokens)
    if found.identical:
        return Condition("same_output", True, f"greedy outputs agree: {found.text()}")
    where = (
        f"first differing token at position {found.prefix} "
        f"(live {_at(live.tokens, found.prefix)}, new {_at(new.tokens, found.prefix)}); {found.text()}"
    )
    if accept:
        return Condition("same_output", True, f"greedy outputs differ, accepted with --accept-output-change: {where}")
    return Condition("same_output", False, f"greedy outputs differ: {where}")


def _at(tokens: Sequence[int], index: int) -> str:
    return f"token id {tokens[index]}" if index < len(tokens) else "ended"


def difference(live: Side, new: Side) -> bench.Difference | None:
    if live.decode is None or new.decode is None:
        return None
    return bench.difference(live.decode, new.decode)


def _not_slower(live: Side, new: Side) -> Condition:
    diff = difference(live, new)
    if diff is None:
        missing = "live" if live.decode is None else "new"
        return Condition("not_slower", False, f"cannot compare speed: the {missing} stack has no complete benchmark")
    text = f"decode new - live: {diff.text()}"
    if diff.significant and diff.delta < 0:
        return Condition("not_slower", False, f"slower beyond the measured noise: {text}")
    if diff.significant:
        return Condition("not_slower", True, f"faster: {text}")
    return Condition("not_slower", True, f"within the measured noise: {text}")


def decide(mode: str, live: Side, new: Side, *, accept_output_change: bool) -> Decision:
    """Switch or keep, per ``mode`` (:data:`MODES`), and the one-sentence reason."""
    found = conditions(live, new, accept_output_change=accept_output_change)
    failed = [c for c in found if not c.held]
    if mode == "never":
        would = "would have switched" if not failed else f"would have kept it ({failed[0].text})"
        return Decision(mode, False, f"--switch never: report only; if-better {would}", found)
    if mode == "if-passes":
        passes = found[0]
        if passes.held:
            return Decision(mode, True, f"switched: {passes.text} (--switch if-passes)", found)
        return Decision(mode, False, f"kept the live stack: {passes.text}", found)
    if failed:
        return Decision(mode, False, f"kept the live stack: {failed[0].text}", found)
    if quality.agreement(live.tokens, new.tokens).identical:
        return Decision(mode, True, f"switched: it passes, gives the same greedy tokens and is {found[2].text}", found)
    # Switched on --accept-output-change: the reason says the outputs differed, and where.
    return Decision(mode, True, f"switched: it passes and is {found[2].text}; {found[1].text}", found)


def not_measured(mode: str, why: str) -> Decision:
    """The decision when the A/B never ran (the new generation failed to build or verify)."""
    return Decision(mode, False, f"kept the live stack: {why}", (Condition("passes", False, why),))
