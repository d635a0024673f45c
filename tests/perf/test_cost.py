"""Cost of a verify cycle: the finite-generation work, the fit of planted step costs, context
factors."""

from __future__ import annotations

import numpy as np
import pytest

from bisect_eagle.perf.cost import CostModel, component_work, context_keys, generation_work
from bisect_eagle.perf.horizon import finite_generation, steady_state

PLANTED = {
    "verify_fixed": 0.010,
    "verify_token": 0.0005,
    "draft_step": 0.001,
    "spec_fixed": 0.002,
    "cycle_fixed": 0.0005,
    "prefill": 0.03,
    "draft_prefill": 0.004,
}


def seconds(work: dict, theta: dict = PLANTED, factor: float = 1.0, groups=("verify",)) -> float:
    from bisect_eagle.perf.cost import TERMS

    return sum(
        float(np.mean(v)) * theta.get(t, 0.0) * (factor if TERMS[t][0] in groups else 1.0)
        for t, v in work.items()
    )


def test_finite_generation_always_accepting_with_truncation():
    # 10 tokens, 3 steps: emits 4 (r=10), 4 (r=6), then r=2 drafts 1 and emits 2: 3 cycles, 7
    # drafts, 10 verified
    gen = finite_generation(
        np.ones(3), tokens=10, num_steps=3, num_draft_tokens=4, truncate_drafts=True
    )
    assert (gen.cycles, gen.draft_steps, gen.verify_tokens, gen.spec_cycles) == (3, 7, 10, 3)
    assert gen.accept_length == pytest.approx(10 / 3)


def test_finite_generation_never_accepting():
    gen = finite_generation(
        np.zeros(3), tokens=5, num_steps=3, num_draft_tokens=4, truncate_drafts=True
    )
    assert gen.cycles == pytest.approx(5)
    assert gen.draft_steps == pytest.approx(3 + 3 + 2 + 1 + 0)  # min(3, r - 1) for r = 5..1
    assert gen.spec_cycles == pytest.approx(4)  # the last token is a plain target step
    full = finite_generation(
        np.zeros(3), tokens=5, num_steps=3, num_draft_tokens=4, truncate_drafts=False
    )
    assert full.draft_steps == pytest.approx(15)


def test_finite_generation_approaches_steady_state():
    surv = np.cumprod([0.9, 0.8, 0.7])
    gen = finite_generation(
        surv, tokens=4000, num_steps=3, num_draft_tokens=4, truncate_drafts=True
    )
    assert gen.accept_length == pytest.approx(
        float(steady_state(surv, num_steps=3, num_draft_tokens=4).tokens), rel=2e-3
    )


def synthetic_rows(model: CostModel, rng: np.random.Generator, noise: float = 0.01) -> None:
    for t in (1, 2, 4, 8, 16):
        w = component_work("verify", tokens=t)
        model.add(w, seconds(w) * (1 + noise * rng.standard_normal()), source="micro")
    for comp in ("draft_step", "draft_extend", "prefill", "draft_prefill"):
        w = component_work(comp)
        model.add(w, seconds(w) * (1 + noise * rng.standard_normal()), source="micro")
    for steps in range(0, 12):
        surv = np.cumprod(np.full(max(steps, 1), 0.8))
        gen = finite_generation(
            surv, tokens=48, num_steps=steps, num_draft_tokens=steps + 1, truncate_drafts=True
        )
        w = generation_work(gen)
        model.add(w, seconds(w) * (1 + noise * rng.standard_normal()))


def test_fit_recovers_planted_parameters():
    model = CostModel()
    synthetic_rows(model, np.random.default_rng(0))
    got = model.params()
    for term in ("verify_fixed", "verify_token", "draft_step", "spec_fixed", "prefill"):
        assert got[term] == pytest.approx(PLANTED[term], rel=0.1), term
    assert model.sigma < 0.05
    surv = np.cumprod(np.full(13, 0.75))
    held = generation_work(
        finite_generation(surv, tokens=48, num_steps=13, num_draft_tokens=14, truncate_drafts=True)
    )
    assert model.predict(held) == pytest.approx(seconds(held), rel=0.02)


def test_context_factor_learnt_and_unseen_key_is_neutral():
    rng = np.random.default_rng(1)
    model = CostModel()
    synthetic_rows(model, rng)
    slow = context_keys({"NCCL_ALGO": "Ring"}, {"attention_backend": "triton"})
    assert slow == ("env:NCCL_ALGO=Ring", "server_args:attention_backend=triton")
    for steps in range(0, 12):
        gen = finite_generation(
            np.cumprod(np.full(max(steps, 1), 0.8)),
            tokens=48,
            num_steps=steps,
            num_draft_tokens=steps + 1,
            truncate_drafts=True,
        )
        w = generation_work(gen)
        model.add(w, seconds(w, factor=1.3, groups=("verify",)), context=slow)
    factors = model.factors()
    combined = (
        factors["env:NCCL_ALGO=Ring"]["verify"]
        * factors["server_args:attention_backend=triton"]["verify"]
    )
    assert combined == pytest.approx(1.3, rel=0.05)
    w = generation_work(steady_state(np.array([0.8, 0.6]), num_steps=2, num_draft_tokens=3))
    assert model.predict(w, context=["env:NCCL_UNSEEN=1"]) == pytest.approx(
        model.predict(w), rel=1e-9
    )


def test_parameter_uncertainty_shrinks_with_data():
    w = generation_work(steady_state(np.array([0.8, 0.6, 0.5]), num_steps=3, num_draft_tokens=4))
    few = CostModel()
    base = generation_work(steady_state(np.zeros(1), num_steps=0, num_draft_tokens=1))
    few.add(base, seconds(base))
    many = CostModel()
    synthetic_rows(many, np.random.default_rng(2))
    assert many.relative_sd(w) < 0.5 * few.relative_sd(w)


def test_concurrency_grows_the_verify_cost():
    surv = np.array([0.8, 0.6, 0.5])
    one = generation_work(steady_state(surv, num_steps=3, num_draft_tokens=4), batch=1)
    eight = generation_work(
        steady_state(surv, num_steps=3, num_draft_tokens=4), batch=8, knots=(16,)
    )
    assert eight["verify_token"] == 8 * one["verify_token"] == 32
    assert eight["hinge_16"] == 16 and eight["cycle_row"] == 7


def test_add_rejects_bad_input():
    model = CostModel()
    with pytest.raises(ValueError):
        model.add({"nope": 1.0}, 1.0)
    with pytest.raises(ValueError):
        model.add({"verify_fixed": 1.0}, 0.0)
    with pytest.raises(ValueError):
        model.fit()


def test_a_context_key_never_observed_widens_the_prediction_by_its_prior():
    model = CostModel()
    w = component_work("verify", tokens=1)
    for _ in range(3):
        model.add(w, 0.01, context=("env:NCCL_ALGO=Ring",))
    seen = model.relative_sd(w, context=("env:NCCL_ALGO=Ring",))
    unseen = model.relative_sd(
        w, context=("env:NCCL_ALGO=Ring", "server_args:attention_backend=triton")
    )
    assert model.predict(w, context=("server_args:attention_backend=triton",)) == pytest.approx(
        0.01, rel=1e-3
    )
    # the verify group is all of the forward
    expected = model.factor_prior_sd * model.sigma / model.sigma_prior
    assert unseen**2 == pytest.approx(seen**2 + expected**2, rel=1e-6)
