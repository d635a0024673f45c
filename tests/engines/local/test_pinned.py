"""Pinned acceptance in the local decoder and engine: the target's tokens, the profile's accept
length, seeded draws, a natural round's forwards, and the cost-side delay."""

import random

import pytest

from bisect_eagle.artifacts.draft import init_weights, load_draft
from bisect_eagle.artifacts.prompts import load_prompts
from bisect_eagle.artifacts.target import load_target
from bisect_eagle.engines.local import LocalEngine, Pin, SpeculativeDecoder
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.settings import LiveSettings, profile_for_accept_length

FAST = {"num_prompts": 2, "warmup_prompts": 1, "max_new_tokens": 31}


@pytest.fixture(scope="module")
def models(tiny):
    model, tok = load_target(tiny.target)
    return model, load_draft(tiny.draft, target=tiny.target), load_prompts(tiny.prompts, tok, n=3)


@pytest.fixture(scope="module")
def random_draft(tiny):
    """The tiny draft's shapes with random weights: it almost never guesses right."""
    loaded = load_draft(tiny.draft, target=tiny.target)
    init_weights(loaded.model, seed=7, std=0.2)
    return loaded


def _generate(decoder, prompt, pin=None, max_new=24):
    return decoder.generate(prompt.input_ids, max_new_tokens=max_new, pin=pin)


def test_pin_draws_the_conditional_chain_of_an_unconditional_profile():
    pin = Pin(rates=[0.9, 0.6, 0.3], rng=random.Random(0))
    counts = [pin.draw(3) for _ in range(20000)]
    for k, rate in enumerate([0.9, 0.6, 0.3]):
        assert sum(c > k for c in counts) / len(counts) == pytest.approx(rate, abs=0.015)
    always = Pin(rates=[1.0, 1.0, 0.0], rng=random.Random(0))
    assert {always.draw(3) for _ in range(50)} == {2}
    assert always.draw(1) == 1  # a round that drafts fewer positions draws over those only


def test_seeded_pins_draw_the_same_for_the_same_prompt():
    a = Pin.seeded([0.8, 0.5, 0.2], [1, 2, 3])
    b = Pin.seeded([0.8, 0.5, 0.2], [1, 2, 3])
    c = Pin.seeded([0.8, 0.5, 0.2], [1, 2, 4])
    draws = [[p.draw(3) for _ in range(30)] for p in (a, b, c)]
    assert draws[0] == draws[1] != draws[2]


def test_pinned_decoding_keeps_the_targets_tokens_and_reaches_the_profile_with_a_bad_draft(
    models, random_draft
):
    """A random draft accepts almost nothing naturally; pinned to [1, 1, 0] it accepts two drafts
    per round and the output is still the target's greedy continuation."""
    model, _, prompts = models
    natural = SpeculativeDecoder(model, random_draft, None, 3)
    for p in prompts[:2]:
        free = _generate(natural, p)
        assert free.verify_steps > 16  # ~1 token per round
        pinned = _generate(natural, p, Pin.seeded([1.0, 1.0, 0.0], p.input_ids, free.tokens))
        assert pinned.tokens == free.tokens
        # 24 tokens: 7 rounds of 3, then a round drafting the 2 that fit (both accepted) and its
        # bonus token
        assert pinned.accepted_per_step == [3] * 8
        assert len(pinned.tokens) / pinned.verify_steps == 3.0


def test_pinned_rounds_run_a_natural_rounds_forwards(models):
    """Every round still drafts num_steps tokens and verifies num_steps + 1: pinning changes no
    forward's size."""
    model, draft, prompts = models
    decoder = SpeculativeDecoder(model, draft, None, 3)
    p = prompts[0]
    free = _generate(decoder, p)
    sizes: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda _m, args, kwargs: sizes.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        pinned = _generate(decoder, p, Pin.seeded([0.5, 0.25, 0.0], p.input_ids, free.tokens))
    finally:
        hook.remove()
    assert sizes[0] == len(p.input_ids) - 1  # the prefill
    assert sizes[1:] == [1 + d for d in pinned.drafted_per_step]
    done = [sum(pinned.accepted_per_step[:i]) for i in range(pinned.verify_steps)]
    # as many drafts as a natural round
    assert pinned.drafted_per_step == [min(3, 24 - d - 1) for d in done]
    assert pinned.tokens == free.tokens


def test_pinned_without_a_continuation_emits_the_accepted_drafts(models, random_draft):
    """A server's pin (no continuation): accepted drafts are emitted as proposed, the bonus is the
    target's."""
    model, _, prompts = models
    decoder = SpeculativeDecoder(model, random_draft, None, 3)
    p = prompts[0]
    forced = _generate(decoder, p, Pin.seeded([1.0, 1.0, 0.0], p.input_ids))
    assert forced.accepted_per_step == [3] * 8
    assert forced.tokens != _generate(decoder, p).tokens


def test_the_baseline_refuses_a_pin(models):
    model, _, prompts = models
    with pytest.raises(BadInput, match="needs a draft"):
        _generate(SpeculativeDecoder(model, None, None, 0), prompts[0], Pin.seeded([1.0], [1]))


def test_cycle_delay_waits_inside_every_target_forward(models):
    model, draft, prompts = models
    p = prompts[0]
    fast = _generate(SpeculativeDecoder(model, draft, None, 3), p, max_new=8)
    slow = _generate(SpeculativeDecoder(model, draft, None, 3, cycle_delay_s=0.05), p, max_new=8)
    assert slow.tokens == fast.tokens
    # the prefill and every verify step wait 50 ms inside the model clock
    assert slow.model_s >= 0.05 * (slow.verify_steps + 1)


def test_engine_pins_accept_length_and_keeps_a_natural_trials_output(tiny):
    with LocalEngine(tiny.target, tiny.draft, tiny.prompts) as engine:
        natural = engine.plan(LiveSettings(**FAST))
        pinned = engine.plan(
            LiveSettings(**FAST, pinned_acceptance=profile_for_accept_length(2.0, 3))
        )
        assert pinned.fingerprint != natural.fingerprint
        assert (natural.acceptance, pinned.acceptance) == ("natural", "pinned")
        assert "pinned_acceptance" not in natural.effective
        assert pinned.effective["pinned_acceptance"] == [1.0, 0.0, 0.0]
        a, b = engine.run(natural), engine.run(pinned)
    assert b.ok and b.acceptance == "pinned" and a.acceptance == "natural"
    assert b.to_json()["acceptance"] == "pinned"
    assert [r.completion_tokens for r in a.requests] == [r.completion_tokens for r in b.requests]
    # 31 tokens: 15 rounds of 2, then one drafting none
    assert b.accept_length == pytest.approx(31 / 16)
    assert b.accept_rate_per_position[0] == 1.0 and b.accept_rate_per_position[1] == 0.0
    assert a.accept_length > b.accept_length
