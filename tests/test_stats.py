"""The statistics of the verdicts: the noise split between rounds and launches, rounds per launch,
drift."""

from __future__ import annotations

import math
import random

import pytest

from bisect_eagle.stats import best_rounds, drifted, pooled_bounds, variance_split


def _launches(*, sigma_l: float, sigma_r: float, rounds: int, n: int, seed: int) -> list:
    rng = random.Random(seed)
    out = []
    for config, mu in (("a", 4.6), ("b", 4.5)):
        for _ in range(n):
            effect = rng.gauss(0, sigma_l)
            logs = [mu + effect + rng.gauss(0, sigma_r) for _ in range(rounds)]
            mean = sum(logs) / rounds
            sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (rounds - 1))
            out.append((config, mean, rounds, sd))
    return out


@pytest.mark.parametrize(("sigma_l", "sigma_r"), [(0.02, 0.005), (0.005, 0.02), (0.0, 0.02)])
def test_the_split_recovers_the_variances_it_was_drawn_with(sigma_l, sigma_r):
    r2, l2 = variance_split(_launches(sigma_l=sigma_l, sigma_r=sigma_r, rounds=4, n=400, seed=1))
    assert math.sqrt(r2) == pytest.approx(sigma_r, rel=0.1)
    assert math.sqrt(l2) == pytest.approx(sigma_l, abs=0.003)


def test_the_split_says_what_it_cannot_tell():
    # no round spread
    assert variance_split([("a", 1.0, 1, None), ("a", 1.1, 1, None)]) == (None, None)
    r2, l2 = variance_split([("a", 1.0, 3, 0.1), ("b", 1.1, 3, 0.2)])  # no config launched twice
    assert r2 == pytest.approx((0.01 * 2 + 0.04 * 2) / 4) and l2 is None


def test_rounds_follow_the_split_and_the_cost_of_a_launch():
    # measure first
    assert best_rounds(sigma_r2=None, sigma_l2=None, cost_ratio=100, first=3, most=8) == 3
    # launches agree
    assert best_rounds(sigma_r2=1e-4, sigma_l2=0.0, cost_ratio=100, first=3, most=8) == 8
    assert best_rounds(sigma_r2=1e-4, sigma_l2=1e-4, cost_ratio=16, first=3, most=8) == 4  # √16
    # noise is launches
    assert best_rounds(sigma_r2=1e-6, sigma_l2=1e-4, cost_ratio=100, first=3, most=8) == 1
    # launches unmeasured
    assert best_rounds(sigma_r2=1e-4, sigma_l2=None, cost_ratio=100, first=3, most=8) == 3
    # nothing to average
    assert best_rounds(sigma_r2=0.0, sigma_l2=1e-4, cost_ratio=100, first=3, most=8) == 1


def test_drift_is_the_newest_value_outside_the_earlier_ones_prediction_interval():
    steady = [math.log(v) for v in (100, 101, 99, 100.5)]
    assert drifted(steady) is False
    assert drifted([*steady[:-1], math.log(110)]) is True
    assert drifted(steady[:2]) is None  # two values: no spread to judge by
    assert drifted([math.log(100 * 1.05**i) for i in range(3)]) is True  # a steady climb: a trend
    assert drifted([math.log(100 * 1.05**i * (1.01 if i % 2 else 0.99)) for i in range(8)]) is True
    assert drifted([math.log(100.0)] * 3) is False  # noise-free and flat


def test_the_pooled_bound_clears_a_true_ratio_no_more_often_than_its_confidence_allows():
    """A candidate exactly at the criterion ratio: over many simulated confirmations (3 candidate
    and 3 baseline launches, 3 looks' share of α), the lower bound clears the ratio at most about
    α/3 of the time."""
    rng = random.Random(7)
    looks, cleared, n = 3, 0, 3000
    for _ in range(n):
        cand = [110 * math.exp(rng.gauss(0, 0.02)) for _ in range(3)]
        base = [100 * math.exp(rng.gauss(0, 0.02)) for _ in range(3)]
        other = [120 * math.exp(rng.gauss(0, 0.02)) for _ in range(4)]
        _, lower, _, dof = pooled_bounds(cand, base, others=[other], confidence=0.95, looks=looks)
        cleared += lower >= 1.1
    assert dof == 7 and cleared / n < 0.05 / looks * 1.5


def test_the_pooled_bound_needs_a_repeated_config():
    with pytest.raises(ValueError, match="launched twice"):
        pooled_bounds([1.0], [2.0], others=[[3.0]], confidence=0.95, looks=1)


def test_the_family_level_splits_the_error_over_the_comparisons():
    from bisect_eagle.stats import family_level

    assert family_level(0.05, 25) == pytest.approx(0.002) and family_level(0.05, 0) == 0.05


def test_pinpoints_p_sees_a_shift_and_a_change_of_spread():
    from bisect_eagle.stats import distribution_p, shape_p

    rng = random.Random(0)
    a = [rng.gauss(0, 1) for _ in range(200)]
    assert distribution_p(a, [rng.gauss(0, 1) for _ in range(200)]) > 0.01
    assert distribution_p(a, [rng.gauss(0.5, 1) for _ in range(200)]) < 1e-4  # a shift: MWU
    assert distribution_p(a, [rng.gauss(0, 3) for _ in range(200)]) < 1e-4  # a wider spread: KS
    assert distribution_p([1.0, 1.0], [1.0]) == 1.0
    # per launch: a launch that runs 5 % fast as a whole is no change of shape; a stall in some
    # requests is
    calm = [[100 * math.exp(rng.gauss(0, 0.01)) for _ in range(30)] for _ in range(3)]
    fast = [[105 * math.exp(rng.gauss(0, 0.01)) for _ in range(30)] for _ in range(3)]
    stall = [
        [(50 if i % 5 == 0 else 100) * math.exp(rng.gauss(0, 0.01)) for i in range(30)]
        for _ in range(3)
    ]
    assert shape_p(fast, calm) > 0.01 and shape_p(stall, calm) < 1e-4
