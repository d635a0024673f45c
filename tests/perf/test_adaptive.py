"""SGLang's --speculative-adaptive policy (0.5.23 defaults) and its predicted throughput."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic_engine import effective, fitted_model

from bisect_eagle.perf.acceptance import chain_survival
from bisect_eagle.perf.adaptive import SlotConfig, _Slot, simulate_occupancy, slot_for_batch


@pytest.mark.parametrize(
    ("batch", "steps"),
    [(1, (1, 3, 5, 7)), (7, (1, 3, 5, 7)), (8, (0, 1, 3)), (40, (0, 1)), (500, (0,))],
)
def test_batch_size_buckets(batch, steps):
    assert slot_for_batch(batch).candidate_steps == steps


def test_custom_config_and_validation():
    slot = slot_for_batch(4, {"ema_alpha": 0.5, "2": {"candidate_steps": [2, 4]}})
    assert slot.candidate_steps == (2, 4) and slot.ema_alpha == 0.5
    with pytest.raises(ValueError):
        slot_for_batch(1, {"ema_alpha": 0.5})


def test_slot_steps_down_on_rejections_like_sglang():
    slot = _Slot(4, slot_for_batch(1))  # 4 is not a candidate: the middle one (5); EMA starts at 4
    assert (slot.current, slot.ema) == (5, 4.0)
    for _ in range(15):  # 10 warm-up verifies, then the first decision
        slot.update(np.zeros(1))
    assert slot.ema == pytest.approx(4 * 0.8**15)
    # below 2.25 (3 - 0.5 - 0.25) and below 0.25 (1 - 0.5 - 0.25): two steps down
    assert slot.current == 1


def test_slot_steps_up_when_every_draft_is_accepted():
    slot = _Slot(1, slot_for_batch(1))
    seen = []
    for _ in range(60):
        slot.update(np.full(1, float(slot.current)))  # all drafts accepted
        seen.append(slot.current)
    # decisions every 5 verifies after 10 warm-up ones; the EMA lags one step count behind
    assert seen[13] == 1 and seen[14] == 3 and seen[19] == 3 and seen[24] == 5 and seen[-1] == 7


def test_slot_can_rise_several_candidates_in_one_decision():
    slot = _Slot(1, slot_for_batch(1))
    for _ in range(15):
        slot.update(np.full(1, 7.0))  # SGLang's rise loop: 0.5, 2.5 and 4.5 are all below the EMA
    assert slot.current == 7


def test_zero_step_slot_probes_upward():
    slot = _Slot(0, SlotConfig((0, 1, 3), down_hysteresis=0.0))
    for _ in range(15):
        slot.update(np.zeros(4))
    assert slot.current == 1


def occupancy(p: float) -> dict[int, float]:
    dist = {}
    for s in (1, 3, 5, 7):
        surv = chain_survival(np.full(s, p), s)
        dist[s] = np.concatenate([[1.0], surv]) - np.concatenate([surv, [0.0]])
    return simulate_occupancy(slot_for_batch(1), initial_steps=3, accepted_dist=dist, cycles=3000)


def test_occupancy_follows_acceptance():
    high, low = occupancy(0.97), occupancy(0.3)
    assert max(high, key=high.get) == 7
    assert max(low, key=low.get) == 1
    assert sum(high.values()) == pytest.approx(1.0)


def test_predicted_adaptive_lies_between_its_candidates():
    model = fitted_model()
    fixed = [model.predict(effective(steps=s)).tok_s for s in (1, 3, 5, 7)]
    ad = model.predict_adaptive(effective(steps=3))
    assert min(fixed) * 0.99 <= ad.tok_s <= max(fixed) * 1.01
    assert ad.low <= ad.tok_s <= ad.high
    with pytest.raises(ValueError):
        model.predict_adaptive(effective(steps=3, topk=4, num_draft_tokens=8))


def test_adaptive_at_high_concurrency_runs_without_drafting():
    model = fitted_model()
    ad = model.predict_adaptive(effective(steps=3), concurrency=64)
    assert ad.details["occupancy"] == {"0": 1.0}
    assert ad.tok_s == pytest.approx(ad.baseline_tok_s)
