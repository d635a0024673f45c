"""The throughput split: which side, acceptance or cost, explains a live measurement's gap."""

from __future__ import annotations

import math

import pytest

from bisect_eagle.perf.split import ACCEPT_MARGIN, explain, stage1_accept_length, stage1_floor

STAGE1 = "the dump (stage 1)"


def split(accept_length: float, cycles_s: float, *, predicted: float | None = 3.6, **kw):
    """A measurement of ``accept_length`` at ``cycles_s`` verify cycles/s against 90 tok/s."""
    return explain(
        accept_length=accept_length,
        tok_s=accept_length * cycles_s,
        needed_tok_s=90.0,
        need="the target",
        predicted=predicted,
        source=STAGE1 if predicted else "",
        **kw,
    )


def test_an_accept_length_below_its_floor_with_cycles_that_would_reach_the_target_is_acceptance():
    s = split(2.1, 40.0)  # 40 cycles/s at the predicted 3.6 would give 144 tok/s
    assert s.side == "acceptance" and s.floor == pytest.approx(3.24) and s.short
    assert s.cycles_s == pytest.approx(40.0) and s.needed_cycles_s == pytest.approx(25.0)
    assert s.sentence() == (
        "accept length 2.1 where the dump (stage 1) predicts 3.6 (floor 3.24); 40 verify cycles/s, "
        "25 needed for the target's 90 tok/s at 3.6: the acceptance side"
    )


def test_acceptance_as_predicted_with_too_few_cycles_is_cost():
    s = split(3.5, 20.0)  # 20 cycles/s: 72 tok/s even at the predicted 3.6
    assert s.side == "cost" and not s.short
    assert s.sentence().endswith(
        "20 verify cycles/s, 25 needed for the target's 90 tok/s at 3.6: the cost side"
    )


def test_an_accept_length_better_than_predicted_leaves_the_cost_side():
    assert split(4.2, 20.0).side == "cost"


def test_short_acceptance_and_too_few_cycles_are_both():
    s = split(2.1, 20.0)
    assert s.side == "both" and s.sentence().endswith(": both sides (acceptance and cost)")


def test_a_measurement_that_meets_the_need_has_no_gap():
    s = split(3.5, 30.0)  # 105 tok/s
    assert s.side == "none"
    assert s.sentence().endswith(": no gap (105.0 tok/s meets the target's 90)")
    short = split(2.1, 50.0)  # 105 tok/s, but the accept length is below its floor: headroom
    assert short.side == "none" and short.sentence().endswith(
        "though the accept length is materially below its prediction"
    )


def test_a_gap_within_the_noise_of_the_prediction_is_no_side():
    s = split(3.3, 26.0)  # 85.8 tok/s; above the floor 3.24, and 26 × 3.6 = 93.6 would reach 90
    assert s.side == "unknown" and not s.short
    assert s.sentence().endswith(
        ": side unknown: the gap is within the noise of the predicted accept length"
    )


def test_the_floor_is_the_stated_margin_below_stage_1_inclusive():
    assert stage1_floor(3.6) == pytest.approx(3.6 * (1 - ACCEPT_MARGIN)) and ACCEPT_MARGIN == 0.10
    assert stage1_floor(1.05) == 1.0  # never below the bonus token alone
    assert split(3.24, 20.0).side == "cost"  # at the floor: not materially below


def test_the_models_own_interval_is_the_floor_when_given():
    assert split(2.1, 40.0, floor=2.0).side == "unknown"  # 2.1 is inside the model's interval
    assert split(1.9, 40.0, floor=2.0).side == "acceptance"


def test_without_a_prediction_a_gap_has_no_side():
    s = split(2.1, 40.0, predicted=None)
    assert s.side == "unknown" and s.needed_cycles_s is None and s.floor is None
    assert s.sentence() == (
        "accept length 2.1 (nothing predicts it for this wiring and steps); 40 verify cycles/s: "
        "side unknown (84 tok/s against the target's 90)"
    )
    assert split(3.0, 40.0, predicted=None).side == "none"


@pytest.mark.parametrize("al, tok_s", [(0.0, 10.0), (2.0, -1.0), (math.nan, 10.0), (2.0, math.inf)])
def test_a_measurement_that_is_not_positive_is_refused(al, tok_s):
    with pytest.raises(ValueError, match="must be positive"):
        explain(accept_length=al, tok_s=tok_s, needed_tok_s=90.0, need="the target", predicted=3.6)


def test_stage_1_predicts_specforges_simulated_accept_length_plus_the_bonus_token():
    acc = [0.9, 0.8, 0.5]
    simulated = 0.9 + 0.9 * 0.8 + 0.9 * 0.8 * 0.5  # a0 + a0·a1 + a0·a1·a2
    assert stage1_accept_length(acc, num_steps=3) == pytest.approx(simulated + 1)
    assert stage1_accept_length(acc, num_steps=2) == pytest.approx(1 + 0.9 + 0.72)
    deeper = 1 + simulated + 0.36 * 0.5 + 0.36 * 0.25  # deeper positions reuse the last
    assert stage1_accept_length(acc, num_steps=5) == pytest.approx(deeper)
    # a chain that verifies 2 of its 3 drafts (num_draft_tokens 3, the root included) accepts 2 at
    # most
    verified = stage1_accept_length(acc, num_steps=3, num_draft_tokens=3)
    assert verified == pytest.approx(1 + 0.9 + 0.72)
