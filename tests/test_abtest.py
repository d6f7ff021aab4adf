"""The A/B's order and the decision it supports, from numbers and token ids (runs/abtest.py)."""

from __future__ import annotations

from stackgate.runs import abtest
from stackgate.runs.abtest import LIVE, NEW, Leg

TOKENS = tuple(range(100))


def _sides(
    live: list[float], new: list[float], *, new_tokens: tuple[int, ...] = TOKENS, new_passed: bool = True
) -> tuple[abtest.Side, abtest.Side]:
    legs = [
        Leg(LIVE, 1, True, tuple(live), TOKENS),
        Leg(NEW, 2, new_passed, tuple(new), new_tokens, () if new_passed else ("smoke.launch: the server exited",)),
    ]
    return abtest.side(LIVE, legs), abtest.side(NEW, legs)


def test_the_order_alternates_so_that_linear_drift_favours_neither_side() -> None:
    assert abtest.order(1) == (LIVE, NEW)
    legs = abtest.order(4)
    assert legs == (LIVE, NEW, NEW, LIVE, LIVE, NEW, NEW, LIVE)
    # A machine that slows by 1 tok/s per leg: both sides' mean position is the same.
    positions = {side: [i for i, s in enumerate(legs) if s == side] for side in (LIVE, NEW)}
    assert sum(positions[LIVE]) == sum(positions[NEW])


def test_if_better_switches_within_the_noise_and_keeps_beyond_it() -> None:
    same = abtest.decide("if-better", *_sides([100.0, 102.0, 98.0], [101.0, 99.0, 100.5]), accept_output_change=False)
    assert same.switch and "within the measured noise" in same.reason
    slower = abtest.decide("if-better", *_sides([100.0, 100.5, 99.5], [95.0, 95.5, 94.5]), accept_output_change=False)
    assert not slower.switch and slower.reason.startswith(
        "kept the live stack: slower beyond the measured noise: decode new - live: -5.00 tok/s (-5.0%; 95% CI"
    )


def test_if_better_needs_the_same_tokens_unless_accepted() -> None:
    shifted = TOKENS[:37] + tuple(t + 1000 for t in TOKENS[37:])
    kept = abtest.decide(
        "if-better", *_sides([100.0, 101.0], [110.0, 111.0], new_tokens=shifted), accept_output_change=False
    )
    assert not kept.switch and kept.reason == (
        "kept the live stack: greedy outputs differ: first differing token at position 37 (live token id 37, new "
        "token id 1037); "
        "first 37 of 100 tokens identical, then diverge (37.0% of positions agree)"
    )
    sides = _sides([100.0, 101.0], [110.0, 111.0], new_tokens=shifted)
    accepted = abtest.decide("if-better", *sides, accept_output_change=True)
    assert accepted.switch and "same greedy tokens" not in accepted.reason
    assert accepted.reason.startswith("switched: it passes and is ") and accepted.reason.endswith(
        "; greedy outputs differ, accepted with --accept-output-change: first differing token at position 37 "
        "(live token id 37, new token id 1037); first 37 of 100 tokens identical, then diverge "
        "(37.0% of positions agree)"
    )


def test_if_passes_switches_a_slower_stack_that_passes_and_never_only_reports() -> None:
    sides = _sides([100.0, 100.5, 99.5], [95.0, 95.5, 94.5])
    assert abtest.decide("if-passes", *sides, accept_output_change=False).switch
    never = abtest.decide("never", *sides, accept_output_change=False)
    assert not never.switch and never.reason.startswith(
        "--switch never: report only; if-better would have kept it (slower beyond"
    )
    failing = abtest.decide("if-passes", *_sides([100.0], [], new_passed=False), accept_output_change=False)
    assert (
        not failing.switch
        and failing.reason == "kept the live stack: the new stack failed: leg 2: smoke.launch: the server exited"
    )


def test_no_figure_from_the_live_side_is_no_evidence_of_being_better() -> None:
    legs = [
        Leg(LIVE, 1, False, (), (), ("smoke.benchmark: no run returned the tokens asked",)),
        Leg(NEW, 2, True, (100.0, 101.0), TOKENS),
    ]
    found = abtest.decide("if-better", abtest.side(LIVE, legs), abtest.side(NEW, legs), accept_output_change=False)
    assert not found.switch and "no greedy token ids from both sides" in found.reason


def test_in_the_order_live_new_a_drifting_machine_alone_makes_the_new_stack_slower() -> None:
    """Two equal stacks on a machine that loses 15 tok/s per launch (two runs per launch)."""

    def measured(rounds: int) -> abtest.Decision:
        legs = [
            Leg(side, i + 1, True, (200.0 - 15 * i, 200.0 - 15 * i + 0.1), TOKENS)
            for i, side in enumerate(abtest.order(rounds))
        ]
        return abtest.decide("if-better", abtest.side(LIVE, legs), abtest.side(NEW, legs), accept_output_change=False)

    assert measured(1).reason.startswith(
        "kept the live stack: slower beyond the measured noise: decode new - live: -15.00 tok/s"
    )
    alternated = measured(2)
    assert alternated.switch and "within the measured noise: decode new - live: +0.00 tok/s" in alternated.reason


def test_a_faster_new_stack_that_answers_fewer_exactly_is_kept_out() -> None:
    legs = [
        Leg(LIVE, 1, True, (100.0, 101.0, 100.5), TOKENS, accuracy=(16, 16)),
        Leg(NEW, 2, True, (130.0, 131.0, 130.5), TOKENS, accuracy=(14, 16)),
        Leg(NEW, 3, True, (130.2, 130.8, 130.4), TOKENS, accuracy=(14, 16)),
        Leg(LIVE, 4, True, (100.2, 100.8, 100.4), TOKENS, accuracy=(16, 16)),
    ]
    live, new = abtest.side(LIVE, legs), abtest.side(NEW, legs)
    assert new.accuracy == (28, 32) and new.to_dict()["accuracy"] == [28, 32]
    found = abtest.decide("if-better", live, new, accept_output_change=True)
    assert not found.switch
    assert found.reason == "kept the live stack: less accurate: new 28 of 32 exact (87.5%), live 32 of 32 (100.0%)"
    assert [c.name for c in found.conditions if c.held] == ["passes", "same_output", "not_slower"]


def test_without_an_accuracy_check_on_either_side_accuracy_does_not_block_a_switch() -> None:
    found = abtest.decide("if-better", *_sides([100.0, 101.0], [110.0, 111.0]), accept_output_change=False)
    assert found.switch
    assert found.conditions[-1].text == "not checked: the spec has no [accuracy] floor"
