"""The engine interface's shared pieces: rounds on one launch combined into one result."""

from __future__ import annotations

import math

import pytest
from fake_engine import FakeEngine

from bisect_eagle.engines.base import RequestRecord, TrialResult, combine_rounds
from bisect_eagle.spec.settings import LiveSettings


def _round(tok_s: float, verify: int) -> TrialResult:
    return TrialResult(
        engine="e",
        status="ok",
        requested={},
        effective={},
        output_tok_s=tok_s,
        accept_length=8 / verify,
        accept_length_hist={8 // verify: verify},
        wall_s=8 / tok_s,
        requests=[
            RequestRecord(
                id="p0",
                prompt_tokens=3,
                completion_tokens=8,
                verify_steps=verify,
                latency_s=8 / tok_s,
            )
        ],
        warnings=["w"],
    )


def test_combined_rounds_are_a_geometric_mean_and_the_rounds_acceptance():
    r = combine_rounds([_round(100.0, 4), _round(121.0, 2)])
    assert r.output_tok_s == pytest.approx(110.0)  # √(100 · 121)
    # the rounds' mean: each round's is the engine's own definition
    assert r.accept_length == pytest.approx(3.0)
    assert r.accept_length_hist == {2: 4, 4: 2} and [q.id for q in r.requests] == ["p0", "p0@r1"]
    assert (
        r.round_values == {"output_tok_s": [100.0, 121.0], "accept_length": [2.0, 4.0]}
        and r.rounds == 2
    )
    assert r.wall_s == pytest.approx(0.08 + 8 / 121) and r.warnings == ["w"]
    m = r.metrics()
    assert m["rounds"] == 2 and m["output_tok_s_round_sd_log"] == pytest.approx(
        abs(math.log(121) - math.log(100)) / math.sqrt(2)
    )


def test_one_round_is_the_result_itself_and_carries_no_round_metrics():
    one = _round(100.0, 4)
    assert combine_rounds([one]) is one and one.rounds == 1 and "rounds" not in one.metrics()


def test_an_engine_whose_rounds_do_not_share_a_launch_refuses_more_than_one():
    engine = FakeEngine()
    plan = engine.plan(LiveSettings(num_steps=2))
    assert engine.run_rounds(plan, rounds=1).ok
    with pytest.raises(ValueError, match="one round per launch"):
        engine.run_rounds(plan, rounds=2)
