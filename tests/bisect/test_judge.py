"""The judge's sequential one-sided bound: exact limits, noise pooled across configurations, one
error budget for the whole bisect, the requests' tail, seeded noisy sources."""

from __future__ import annotations

import collections
import math
import random

import pytest

from bisect_eagle.bisect.ddmin import ProbeOutcome
from bisect_eagle.bisect.judge import Judge, NoisePool
from bisect_eagle.stats import schedule


def source(rng: random.Random, true: float, noise: float):
    """Samples of ``true`` with relative Gaussian noise, and the ``more(n)`` callback the judge
    calls."""
    samples: list[float] = []

    def more(n: int) -> bool:
        while len(samples) < n:
            samples.append(true * (1 + noise * rng.gauss(0, 1)))
        return True

    return samples, more


def test_schedule_doubles_to_the_budget():
    assert schedule(1, 12) == [1, 2, 4, 8, 12]
    assert schedule(3, 24) == [3, 6, 12, 24]
    assert schedule(1, 1) == [1]
    judge = Judge()
    assert judge.next_count(4, endpoint=False) == 6 and judge.next_count(6, endpoint=False) is None
    assert judge.next_count(3, endpoint=True) == 6


def test_deterministic_values_are_judged_by_the_limit_alone():
    exact = Judge("accept_length", threshold=2.5)
    assert exact.verdict([2.5], endpoint=False).outcome is ProbeOutcome.GOOD  # at the limit is good
    assert exact.verdict([2.49], endpoint=False).outcome is ProbeOutcome.BAD
    exact.noise.observe("a", [3.0, 3.0, 3.0])  # repeats that agree: zero noise, dof > 0
    assert exact.noise.dof == 2 and exact.noise.sd == 0
    assert exact.verdict([2.5001], endpoint=False).outcome is ProbeOutcome.GOOD
    v = exact.verdict([float("nan")], endpoint=False)
    outcome, why = v.outcome, v.detail
    assert outcome is ProbeOutcome.UNRESOLVED and "not a number" in why


def test_ratio_mode_compares_with_the_good_configurations_samples():
    judge = Judge("output_tok_s", ratio=0.9, reference=[100.0, 100.0, 100.0])
    assert judge.limit == pytest.approx(90.0)
    assert judge.verdict([100.0] * 3, endpoint=True, is_reference=True).outcome is ProbeOutcome.GOOD
    assert judge.verdict([91.0], endpoint=False).outcome is ProbeOutcome.GOOD
    assert judge.verdict([89.0], endpoint=False).outcome is ProbeOutcome.BAD
    with pytest.raises(ValueError, match="good configuration's samples first"):
        Judge(ratio=0.9).verdict([1.0], endpoint=False)


def test_the_band_follows_the_pooled_noise_and_the_sample_count():
    judge = Judge("output_tok_s", threshold=100.0)
    judge.noise.observe("good", [110.0, 112.2, 107.8])  # ~2 % noise, 2 dof
    v = judge.verdict([104.0], endpoint=False)
    outcome, why = v.outcome, v.detail
    assert outcome is ProbeOutcome.UNRESOLVED and "within the noise band" in why
    judge.noise.observe("bad", [70.0, 71.4, 68.6])
    judge.noise.observe("probe", [104.0, 106.0, 102.0, 104.0, 103.0, 105.0, 104.5, 103.5])
    assert (
        judge.verdict(
            [104.0, 106.0, 102.0, 104.0, 103.0, 105.0, 104.5, 103.5], endpoint=False
        ).outcome
        is ProbeOutcome.GOOD
    )


def test_noise_pool_and_restore():
    pool = NoisePool()
    pool.observe("a", [1.0, math.e])
    assert pool.dof == 1 and pool.sd == pytest.approx(math.sqrt(0.5))
    pool.observe("bad", [0.0, 1.0])  # not positive: not pooled
    assert pool.dof == 1
    judge = Judge()
    # an older log's reference
    judge.restore({"median": 80.0, "mad": 1.0}, {"sd_log": 0.02, "dof": 4})
    assert (
        judge.reference == [80.0] and judge.noise.dof == 4 and judge.noise.sd == pytest.approx(0.02)
    )
    judge.restore({"samples": [1.0, 2.0]}, None)
    assert judge.reference == [1.0, 2.0]


@pytest.mark.parametrize("above", [1.08, 0.92])
def test_a_config_8_percent_from_the_limit_resolves_on_its_side(above):
    """2 % noise: over 200 seeds a config 8 % above (below) the limit is never judged on the wrong
    side, and nearly always resolves within the probe's budget."""
    expected = ProbeOutcome.GOOD if above > 1 else ProbeOutcome.BAD
    outcomes, used = collections.Counter(), []
    for seed in range(200):
        rng = random.Random(seed)
        judge = Judge("output_tok_s", threshold=100.0)
        good, more_good = source(rng, 115.0, 0.02)
        assert (
            judge.decide(good, key="good", endpoint=True, more=more_good).outcome
            is ProbeOutcome.GOOD
        )
        bad, more_bad = source(rng, 70.0, 0.02)
        assert (
            judge.decide(bad, key="bad", endpoint=True, more=more_bad).outcome is ProbeOutcome.BAD
        )
        probe, more_probe = source(rng, 100.0 * above, 0.02)
        outcomes[judge.decide(probe, key="probe", endpoint=False, more=more_probe).outcome] += 1
        used.append(len(probe))
    assert set(outcomes) <= {expected, ProbeOutcome.UNRESOLVED} and outcomes[expected] >= 190
    assert max(used) <= Judge().max_samples


def test_the_chance_of_any_false_verdict_in_a_bisect_stays_within_its_budget():
    """300 bisects of 2 % noise, each judging 12 configurations 1 % to 4 % from the limit (hard
    ones) at its level α/K: the share of bisects with any verdict on the wrong side stays within α
    (plus sampling slack)."""
    wrong_bisects = 0
    for seed in range(300):
        rng = random.Random(seed)
        judge = Judge("output_tok_s", ratio=0.9, max_samples=4)
        ref, more_ref = source(rng, 100.0, 0.02)
        more_ref(3)
        judge.reference = ref
        judge.noise.observe("ref", ref)
        wrong = False
        for k in range(12):
            side = 1 if k % 2 else -1
            true = 90.0 * (1 + side * rng.uniform(0.01, 0.04))
            probe, more = source(rng, true, 0.02)
            outcome = judge.decide(probe, key=f"p{k}", endpoint=False, more=more).outcome
            truly = ProbeOutcome.GOOD if true >= 90.0 else ProbeOutcome.BAD
            wrong |= outcome not in (truly, ProbeOutcome.UNRESOLVED)
        wrong_bisects += wrong
        assert judge.looks <= judge.comparisons
    assert wrong_bisects / 300 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 300)


def test_the_looks_are_the_bisects_budget():
    judge = Judge("output_tok_s", threshold=100.0, comparisons=2)
    judge.noise.observe("g", [110.0, 112.0, 108.0])
    assert (
        judge.decide([80.0], key="a", endpoint=False, more=lambda n: False).outcome
        is ProbeOutcome.BAD
    )
    assert (
        judge.decide([130.0], key="b", endpoint=False, more=lambda n: False).outcome
        is ProbeOutcome.GOOD
    )
    spent = judge.decide([60.0], key="c", endpoint=False, more=lambda n: False)
    assert spent.outcome is ProbeOutcome.UNRESOLVED and "2 looks are spent" in spent.detail
    assert judge.level == pytest.approx(0.025)  # 0.05 over 2 looks


def test_a_stall_in_some_requests_is_bad_by_the_tail_though_the_mean_is_good():
    """A fifth of each launch's requests stall at half speed while the rest run 8 % faster: the
    launch mean stays above 0.9 × the reference, but the slowest tenth runs at half its speed;
    min(KS, MWU) sees the changed shape."""
    rng = random.Random(3)

    def launch(stall: bool) -> list[float]:
        out = []
        for i in range(40):
            slow = stall and i % 5 == 0
            out.append((50.0 if slow else 108.0 if stall else 100.0) * math.exp(rng.gauss(0, 0.01)))
        return out

    ref = [launch(False) for _ in range(3)]
    values = [math.exp(sum(map(math.log, r)) / len(r)) for r in ref]
    judge = Judge("output_tok_s", ratio=0.9, reference=values, reference_requests=ref)
    judge.noise.observe("ref", values)
    stalled = [launch(True) for _ in range(2)]
    means = [math.exp(sum(map(math.log, r)) / len(r)) for r in stalled]
    assert judge.verdict(means).outcome is ProbeOutcome.GOOD  # the mean alone passes
    v = judge.verdict(means, requests=stalled)
    assert (
        v.outcome is ProbeOutcome.BAD and "BAD by the tail" in v.detail and v.shape_p < judge.level
    )
    same = [launch(False) for _ in range(2)]
    calm = judge.verdict([math.exp(sum(map(math.log, r)) / len(r)) for r in same], requests=same)
    assert calm.outcome is ProbeOutcome.GOOD and calm.shape_p >= judge.level


def test_p_below_follows_the_distance_to_the_limit():
    judge = Judge("output_tok_s", threshold=100.0)
    judge.noise.observe("g", [100.0, 102.0, 98.0, 101.0])
    far, near, above = (judge.verdict([v]).p_below for v in (80.0, 99.0, 110.0))
    assert far > 0.99 and 0.5 < near < far and above < 0.05


def test_an_endpoint_near_the_limit_is_sampled_more_before_giving_up():
    sizes, outcomes = [], collections.Counter()
    for seed in range(50):
        rng = random.Random(seed)
        judge = Judge("output_tok_s", threshold=100.0)
        good, more = source(rng, 105.0, 0.02)
        v = judge.decide(good, key="good", endpoint=True, more=more)
        outcome, why = v.outcome, v.detail
        outcomes[outcome] += 1
        sizes.append(len(good))
        if outcome is ProbeOutcome.UNRESOLVED:
            assert len(good) == judge.endpoint_samples and "sample budget spent" in why
    assert outcomes[ProbeOutcome.BAD] == 0 and outcomes[ProbeOutcome.GOOD] >= 45
    # more samples than the first repeats where they did not decide
    assert max(sizes) > Judge().repeats


def test_one_sample_without_a_noise_estimate_is_judged_as_measured():
    judge = Judge("output_tok_s", threshold=100.0, repeats=1, max_samples=1, endpoint_samples=1)
    assert (
        judge.decide([100.5], key="a", endpoint=True, more=lambda n: False).outcome
        is ProbeOutcome.GOOD
    )
    assert (
        judge.decide([99.5], key="b", endpoint=False, more=lambda n: False).outcome
        is ProbeOutcome.BAD
    )
