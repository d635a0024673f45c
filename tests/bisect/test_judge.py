"""The judge's sequential one-sided bound: exact limits, noise pooled across configurations, seeded noisy sources."""

from __future__ import annotations

import collections
import math
import random

import pytest

from bisect_eagle.bisect.ddmin import ProbeOutcome
from bisect_eagle.bisect.judge import Judge, NoisePool
from bisect_eagle.stats import schedule


def source(rng: random.Random, true: float, noise: float):
    """Samples of ``true`` with relative Gaussian noise, and the ``more(n)`` callback the judge calls."""
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
    assert judge.next_count(4, endpoint=False) == 8 and judge.next_count(12, endpoint=False) is None
    assert judge.next_count(3, endpoint=True) == 6


def test_deterministic_values_are_judged_by_the_limit_alone():
    exact = Judge("accept_length", threshold=2.5)
    assert exact.verdict([2.5], endpoint=False)[0] is ProbeOutcome.GOOD  # at the limit is good
    assert exact.verdict([2.49], endpoint=False)[0] is ProbeOutcome.BAD
    exact.noise.observe("a", [3.0, 3.0, 3.0])  # repeats that agree: zero noise, dof > 0
    assert exact.noise.dof == 2 and exact.noise.sd == 0
    assert exact.verdict([2.5001], endpoint=False)[0] is ProbeOutcome.GOOD
    outcome, why = exact.verdict([float("nan")], endpoint=False)
    assert outcome is ProbeOutcome.UNRESOLVED and "not a number" in why


def test_ratio_mode_compares_with_the_good_configurations_samples():
    judge = Judge("output_tok_s", ratio=0.9, reference=[100.0, 100.0, 100.0])
    assert judge.limit == pytest.approx(90.0)
    assert judge.verdict([100.0] * 3, endpoint=True, is_reference=True)[0] is ProbeOutcome.GOOD
    assert judge.verdict([91.0], endpoint=False)[0] is ProbeOutcome.GOOD
    assert judge.verdict([89.0], endpoint=False)[0] is ProbeOutcome.BAD
    with pytest.raises(ValueError, match="good configuration's samples first"):
        Judge(ratio=0.9).verdict([1.0], endpoint=False)


def test_the_band_follows_the_pooled_noise_and_the_sample_count():
    judge = Judge("output_tok_s", threshold=100.0)
    judge.noise.observe("good", [110.0, 112.2, 107.8])  # ~2 % noise, 2 dof
    outcome, why = judge.verdict([104.0], endpoint=False)
    assert outcome is ProbeOutcome.UNRESOLVED and "within the noise band" in why
    judge.noise.observe("bad", [70.0, 71.4, 68.6])
    judge.noise.observe("probe", [104.0, 106.0, 102.0, 104.0, 103.0, 105.0, 104.5, 103.5])
    assert judge.verdict([104.0, 106.0, 102.0, 104.0, 103.0, 105.0, 104.5, 103.5], endpoint=False)[0] \
        is ProbeOutcome.GOOD


def test_noise_pool_and_restore():
    pool = NoisePool()
    pool.observe("a", [1.0, math.e])
    assert pool.dof == 1 and pool.sd == pytest.approx(math.sqrt(0.5))
    pool.observe("bad", [0.0, 1.0])  # not positive: not pooled
    assert pool.dof == 1
    judge = Judge()
    judge.restore({"median": 80.0, "mad": 1.0}, {"sd_log": 0.02, "dof": 4})  # an older log's reference
    assert judge.reference == [80.0] and judge.noise.dof == 4 and judge.noise.sd == pytest.approx(0.02)
    judge.restore({"samples": [1.0, 2.0]}, None)
    assert judge.reference == [1.0, 2.0]


@pytest.mark.parametrize("above", [1.04, 0.96])
def test_a_config_4_percent_from_the_limit_resolves_on_its_side(above):
    """2 % noise: every one of 200 seeds resolves a config 4 % above (below) the limit GOOD (BAD)."""
    expected = ProbeOutcome.GOOD if above > 1 else ProbeOutcome.BAD
    outcomes, used = collections.Counter(), []
    for seed in range(200):
        rng = random.Random(seed)
        judge = Judge("output_tok_s", threshold=100.0)
        good, more_good = source(rng, 115.0, 0.02)
        assert judge.decide(good, key="good", endpoint=True, more=more_good)[0] is ProbeOutcome.GOOD
        bad, more_bad = source(rng, 70.0, 0.02)
        assert judge.decide(bad, key="bad", endpoint=True, more=more_bad)[0] is ProbeOutcome.BAD
        probe, more_probe = source(rng, 100.0 * above, 0.02)
        outcomes[judge.decide(probe, key="probe", endpoint=False, more=more_probe)[0]] += 1
        used.append(len(probe))
    assert outcomes == {expected: 200}
    assert max(used) <= Judge().max_samples and sum(used) / len(used) < 6


def test_an_endpoint_near_the_limit_is_sampled_more_before_giving_up():
    sizes, outcomes = [], collections.Counter()
    for seed in range(50):
        rng = random.Random(seed)
        judge = Judge("output_tok_s", threshold=100.0)
        good, more = source(rng, 103.0, 0.02)
        outcome, why = judge.decide(good, key="good", endpoint=True, more=more)
        outcomes[outcome] += 1
        sizes.append(len(good))
        if outcome is ProbeOutcome.UNRESOLVED:
            assert len(good) == judge.endpoint_samples and "sample budget spent" in why
    assert outcomes[ProbeOutcome.BAD] == 0 and outcomes[ProbeOutcome.GOOD] >= 45
    assert max(sizes) > Judge().repeats  # more samples than the first repeats where they did not decide


def test_one_sample_without_a_noise_estimate_is_judged_as_measured():
    judge = Judge("output_tok_s", threshold=100.0, repeats=1, max_samples=1, endpoint_samples=1)
    assert judge.decide([100.5], key="a", endpoint=True, more=lambda n: False)[0] is ProbeOutcome.GOOD
    assert judge.decide([99.5], key="b", endpoint=False, more=lambda n: False)[0] is ProbeOutcome.BAD
