"""Accept length from per-position acceptance: chain formula, SGLang's tree selection, the
posterior."""

from __future__ import annotations

import numpy as np
import pytest

from bisect_eagle.perf.acceptance import (
    AcceptanceModel,
    accept_length,
    chain_accept_length,
    chain_survival,
    fit_rank_decay,
    position_counts,
    rank_probabilities,
    survival,
    tree_survival,
    wiring_key,
)


@pytest.mark.parametrize(
    ("p", "steps", "want"),
    [
        ([1.0, 1.0, 1.0], 3, 4.0),
        ([0.0, 1.0, 1.0], 3, 1.0),
        ([0.5, 0.5], 2, 1.75),
        ([0.9, 0.8, 0.7], 3, 1 + 0.9 + 0.72 + 0.504),
        ([0.9, 0.8, 0.7], 1, 1.9),
        ([0.5], 3, 1 + 0.5 + 0.25 + 0.125),  # positions beyond the given ones repeat the last
    ],
)
def test_chain_formula_exact(p, steps, want):
    assert chain_accept_length(p, steps) == pytest.approx(want)


def test_chain_vectorises_over_draws():
    p = np.array([[1.0, 1.0], [0.5, 0.5]])
    np.testing.assert_allclose(chain_accept_length(p, 2), [3.0, 1.75])
    np.testing.assert_allclose(chain_survival(p, 2), [[1.0, 1.0], [0.5, 0.25]])


def test_rank_probabilities_decay_and_sum_below_one():
    q = rank_probabilities(np.array([0.7]), 4, rank_decay=0.5)[0]
    np.testing.assert_allclose(q, [0.7, 0.15, 0.075, 0.0375])
    assert q.sum() == pytest.approx(0.7 + 0.3 * (1 - 0.5**3))  # recall@k = p + (1-p)(1-ρ^{k-1})


def test_tree_hand_computed():
    # depth 1: [.6, .2]; depth 2: children of both [.36, .12, .12, .04]; keep the 3 best of 6: .6,
    # .36, .2
    surv = tree_survival([0.6, 0.6], num_steps=2, topk=2, num_draft_tokens=4, rank_decay=0.5)
    np.testing.assert_allclose(surv, [0.8, 0.36])
    assert accept_length(surv) == pytest.approx(2.16)


@pytest.mark.parametrize("seed", range(5))
def test_topk1_tree_is_the_chain(seed):
    p = np.random.default_rng(seed).uniform(0.2, 0.99, size=7)
    for steps in (1, 3, 7):
        tree = tree_survival(p, num_steps=steps, topk=1, num_draft_tokens=steps + 1)
        np.testing.assert_allclose(tree, chain_survival(p, steps))


@pytest.mark.parametrize(("topk", "steps"), [(2, 3), (4, 5), (8, 4)])
def test_more_draft_tokens_never_lower_accept_length(topk, steps):
    rng = np.random.default_rng(topk * 10 + steps)
    p = rng.uniform(0.3, 0.95, size=(16, steps))  # 16 draws at once
    candidates = topk + (steps - 1) * topk**2
    prev = np.ones(16)
    for ndt in range(1, candidates + 3):  # beyond the candidate count it saturates
        al = accept_length(tree_survival(p, num_steps=steps, topk=topk, num_draft_tokens=ndt))
        assert np.all(al >= prev - 1e-12)
        prev = al
    assert np.all(prev <= 1 + steps)


def test_tree_survival_is_a_probability_and_non_increasing_with_depth():
    p = np.random.default_rng(3).uniform(0.1, 0.99, size=(32, 6))
    surv = tree_survival(p, num_steps=6, topk=4, num_draft_tokens=40)
    assert np.all((surv >= 0) & (surv <= 1))
    assert np.all(np.diff(surv, axis=-1) <= 1e-12)


def test_survival_dispatches_chain_and_tree():
    p = [0.8, 0.7, 0.6]
    np.testing.assert_allclose(
        survival(p, num_steps=3, topk=1, num_draft_tokens=4), chain_survival(p, 3)
    )
    # a chain cut short: a tree
    np.testing.assert_allclose(
        survival(p, num_steps=3, topk=1, num_draft_tokens=3),
        tree_survival(p, num_steps=3, topk=1, num_draft_tokens=3),
    )
    assert accept_length(survival(p, num_steps=3, topk=4, num_draft_tokens=8)) > accept_length(
        survival(p, num_steps=3, topk=4, num_draft_tokens=3)
    )


def test_position_counts_from_histogram_and_rates():
    reached, accepted = position_counts(
        num_steps=3, rates=[0.8, 0.625, 1.0], hist={"1": 2, 2: 3, 4: 5}
    )
    np.testing.assert_allclose(reached, [10, 8, 5])
    np.testing.assert_allclose(accepted, [8, 5, 5])


def test_position_counts_without_histogram_and_unreached_positions():
    reached, accepted = position_counts(
        num_steps=3, rates=[0.5, float("nan"), 1.0], verify_steps=100
    )
    np.testing.assert_allclose(reached, [100, 0, 0])
    np.testing.assert_allclose(accepted, [50, 0, 0])


def test_shrinkage_moves_toward_observed_acceptance():
    # no logit shift
    model = AcceptanceModel(prior_strength=10, shift_scale=1e-3, global_shift_scale=1e-3)
    w = wiring_key([1, 5, 9])
    model.set_prior(w, [0.5, 0.5, 0.5])
    assert model.mean(w, 3)[0] == pytest.approx(0.5, abs=1e-3)
    model.observe(w, [10, 0, 0], accepted=[9, 0, 0])
    first = model.mean(w, 3)[0]
    assert 0.5 < first < 0.9
    model.observe(w, [90, 0, 0], accepted=[81, 0, 0])
    second = model.mean(w, 3)[0]
    assert first < second < 0.9
    assert second == pytest.approx((10 * 0.5 + 90) / 110, abs=1e-3)


def test_wiring_shift_carries_live_evidence_to_unobserved_positions():
    model = AcceptanceModel()
    good, other = wiring_key([1, 5, 9]), wiring_key([5, 9, 11])
    model.set_prior(good, [0.6] * 6)
    model.set_prior(other, [0.6] * 6)
    # live acceptance far above stage 1's
    model.observe(good, [200, 180, 160], accepted=[190, 170, 150])
    assert model.shift(good) > 0.5
    assert model.mean(good, 6)[5] > 0.7  # position 5 never observed, still corrected
    # other wirings get the (shrunk) global shift only
    assert 0 < model.shift(other) < model.shift(good)


def test_posterior_uncertainty_shrinks_with_counts():
    rng = np.random.default_rng(0)
    model = AcceptanceModel()
    w = wiring_key([1, 5, 9])
    model.set_prior(w, [0.8, 0.7])
    before = model.sample(w, 2, draws=4000, rng=rng).std(axis=0)
    model.observe(w, [500, 400], accepted=[400, 280])
    after = model.sample(w, 2, draws=4000, rng=rng).std(axis=0)
    assert np.all(after < 0.5 * before)


def test_observe_rejects_impossible_counts():
    with pytest.raises(ValueError):
        AcceptanceModel().observe(wiring_key(None), [1, 2], accepted=[2, 1])


def test_fit_rank_decay_recovers_planted_value():
    p = np.array([0.7, 0.6, 0.5])
    obs = [
        (
            p,
            3,
            k,
            n,
            accept_length(
                tree_survival(p, num_steps=3, topk=k, num_draft_tokens=n, rank_decay=0.35)
            ),
        )
        for k, n in ((2, 6), (4, 10), (4, 16))
    ]
    assert fit_rank_decay(obs) == pytest.approx(0.35, abs=0.05)
    assert fit_rank_decay([]) is None
