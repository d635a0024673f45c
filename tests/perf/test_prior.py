"""The cold prior: sizes from config.json, a draft step's cost from what is known before the first
trial, and the cold prediction it gives: near a known 8-GPU answer, with an interval wider than a
warm one."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bisect_eagle.perf.cost import CostModel
from bisect_eagle.perf.model import ThroughputModel
from bisect_eagle.perf.prior import ColdPrior, Deployment, ModelSize

# DeepSeek-V3's config.json (the DeepSeek-V2 code SGLang serves Kimi-K2.5 and GLM-5 with): 37 B
# active parameters
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "first_k_dense_replace": 3,
    "vocab_size": 129280,
    "quantization_config": {"quant_method": "fp8"},
}
# the incident's draft: one Llama layer on 3 × 7168 aux inputs, a 32k draft vocabulary (SpecForge
# layout)
EAGLE3_DRAFT = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "hidden_size": 7168,
    "num_hidden_layers": 1,
    "num_attention_heads": 56,
    "num_key_value_heads": 8,
    "intermediate_size": 18432,
    "vocab_size": 129280,
    "draft_vocab_size": 32000,
    "torch_dtype": "bfloat16",
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]},
}
LLAMA_8B = {
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}
LLAMA_8B_DRAFT = {**LLAMA_8B, "num_hidden_layers": 1, "draft_vocab_size": 32000, "eagle_config": {}}
BASELINE_TOK_S = 90.0  # the incident's 8-GPU baseline
BASE = {"speculative_algorithm": "none", "num_steps": 0}


def chain(steps: int) -> dict:
    return {
        "speculative_algorithm": "EAGLE3",
        "eagle_aux_hidden_state_layer_ids": [2, 30, 58],
        "num_steps": steps,
        "topk": 1,
        "num_draft_tokens": steps + 1,
    }


def eight_gpu_truth(steps: int, a: float = 0.8) -> dict:
    """A latency-bound 8-GPU target (scripts/landscape.py): a draft step costs 0.62 target
    forwards."""
    al = 1 + sum(a**k for k in range(1, steps + 1))
    return {
        "output_tok_s": BASELINE_TOK_S * al / (1 + 0.62 * steps + 0.03 * (steps + 1)),
        "accept_length": al,
        "accept_rate_per_position": [a] * steps,
        "verify_steps": 1000.0,
    }


def cold_model(deployment: Deployment) -> ThroughputModel:
    """A model that has seen the baseline only, with stage 1's accuracy of the wiring and
    ``deployment``'s prior."""
    model = ThroughputModel(cost=CostModel(prior=ColdPrior(deployment).terms))
    model.set_standalone([2, 30, 58], [0.8] * 6)
    model.update(BASE, {"output_tok_s": BASELINE_TOK_S, "accept_length": 1.0}, record=False)
    return model


def test_active_parameters_from_config_json_match_the_published_counts():
    ds = ModelSize.from_config(DEEPSEEK_V3)
    assert (
        ds.active_params == pytest.approx(37e9, rel=0.05)
        and ds.layers == 61
        and ds.bytes_per_param == 1.0
    )
    # 8.0 B less the embedding
    assert ModelSize.from_config(LLAMA_8B).active_params == pytest.approx(7.5e9, rel=0.02)
    draft = ModelSize.from_config(EAGLE3_DRAFT)
    # a layer, fc over 3 states, a 32k head
    assert draft.layers == 1 and 0.5e9 < draft.active_params < 1.2e9
    nvfp4 = {
        **DEEPSEEK_V3,
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"},
    }
    assert ModelSize.from_config(nvfp4).bytes_per_param == pytest.approx(0.5625)
    speculators = {"speculators_model_type": "eagle3", "transformer_layer_config": LLAMA_8B_DRAFT}
    assert ModelSize.from_config(speculators) == ModelSize.from_config(LLAMA_8B_DRAFT)
    assert ModelSize.from_config({"hidden_size": 4096}) is None


def test_a_latency_bound_target_pays_more_per_draft_step_than_a_bandwidth_bound_one():
    big = ColdPrior(
        Deployment(
            target=ModelSize.from_config(DEEPSEEK_V3),
            draft=ModelSize.from_config(EAGLE3_DRAFT),
            tp=8,
        )
    ).draft_step(1 / BASELINE_TOK_S)
    small = ColdPrior(
        Deployment(
            target=ModelSize.from_config(LLAMA_8B),
            draft=ModelSize.from_config(LLAMA_8B_DRAFT),
            tp=1,
        )
    ).draft_step(1 / 150)
    # 37 GB over 8 GPUs is ~1.4 ms of an 11 ms forward: fixed latency dominates
    assert 0.3 < big[0] < 0.8
    # 15 GB on one GPU is most of a 6.7 ms forward: the draft's weights set its cost
    assert 0.05 < small[0] < 0.3
    faster = ColdPrior(
        Deployment(
            target=ModelSize.from_config(DEEPSEEK_V3),
            draft=ModelSize.from_config(EAGLE3_DRAFT),
            tp=8,
        )
    ).draft_step(1 / 400)
    # the same weights in a quicker forward leave less fixed latency to pay
    assert faster[0] < big[0]


def test_an_unknown_deployment_is_a_wider_prior():
    known = ColdPrior(
        Deployment(
            target=ModelSize.from_config(DEEPSEEK_V3),
            draft=ModelSize.from_config(EAGLE3_DRAFT),
            tp=8,
        )
    ).draft_step(1 / BASELINE_TOK_S)
    unknown = ColdPrior(Deployment()).draft_step(1 / BASELINE_TOK_S)
    assert unknown[1] > known[1] > 0.2
    assert 0.15 < unknown[0] < 0.8
    with pytest.raises(ValueError, match="forward_s"):
        ColdPrior(Deployment()).draft_step(0.0)


def test_the_cost_fit_takes_the_prior_of_the_terms_it_names():
    model = cold_model(Deployment())
    # the fit's one-token forward
    share, _ = ColdPrior(Deployment()).draft_step(1 / BASELINE_TOK_S / 1.03)
    params = model.cost.params()
    assert params["draft_step"] / model.cost.fit()["unit"] == pytest.approx(share, rel=1e-6)
    default = ThroughputModel()
    default.update(BASE, {"output_tok_s": BASELINE_TOK_S, "accept_length": 1.0}, record=False)
    assert default.cost.params()["draft_step"] < 0.5 * params["draft_step"]  # the default is cheap


def test_the_first_prediction_on_an_8_gpu_target_from_its_config_json_is_near_the_truth():
    model = cold_model(
        Deployment(
            target=ModelSize.from_config(DEEPSEEK_V3),
            draft=ModelSize.from_config(EAGLE3_DRAFT),
            tp=8,
        )
    )
    for steps in (1, 2, 3, 4):
        p, truth = model.predict(chain(steps)), eight_gpu_truth(steps)["output_tok_s"]
        assert abs(p.tok_s - truth) / truth < 0.25, steps
        assert p.low <= truth <= p.high, steps
    default = ThroughputModel()
    default.set_standalone([2, 30, 58], [0.8] * 6)
    default.update(BASE, {"output_tok_s": BASELINE_TOK_S, "accept_length": 1.0}, record=False)
    # the cold start
    assert default.predict(chain(3)).tok_s > 1.4 * eight_gpu_truth(3)["output_tok_s"]


def test_without_config_json_the_cold_interval_covers_a_latency_bound_target():
    """The baseline alone (a server's paths exist only on its node): a draft step between a
    bandwidth-bound target's (~0.15 of a forward) and a latency-bound one's (0.62), and an interval
    that covers the latter."""
    model = cold_model(Deployment())
    for steps in (1, 2, 3, 4):
        p, truth = model.predict(chain(steps)), eight_gpu_truth(steps)["output_tok_s"]
        assert p.low <= truth <= p.high, steps
        # cheaper steps than this truth: the prior is the midpoint, not the worst case
        assert truth < p.tok_s
    assert abs(model.predict(chain(1)).tok_s / eight_gpu_truth(1)["output_tok_s"] - 1) < 0.25


def test_a_cold_interval_narrows_as_trials_arrive():
    model = cold_model(Deployment())
    width = lambda p: math.log(p.high / p.low)  # noqa: E731
    cold = model.predict(chain(3))
    rng = np.random.default_rng(0)
    for steps in (1, 4, 2):
        truth = eight_gpu_truth(steps)
        model.update(
            chain(steps),
            {**truth, "output_tok_s": truth["output_tok_s"] * math.exp(0.02 * rng.normal())},
            record=False,
        )
    warm = model.predict(chain(3))
    assert width(warm) < 0.5 * width(cold)
    assert warm.low <= eight_gpu_truth(3)["output_tok_s"] <= warm.high
    assert abs(warm.tok_s / eight_gpu_truth(3)["output_tok_s"] - 1) < 0.05


def test_a_moe_config_json_raises_and_widens_the_verify_token_prior():
    """One more verified token: nearly free on a dense target, a wide and larger share of a forward
    on a sparse MoE, whose extra token reads experts the other tokens did not; widest where no
    config.json tells."""
    forward_s = 0.011  # a one-token forward of a large target on 8 GPUs
    moe = ColdPrior(Deployment(target=ModelSize.from_config(DEEPSEEK_V3), tp=8)).terms(forward_s)[
        "verify_token"
    ]
    dense = ColdPrior(Deployment(target=ModelSize.from_config(LLAMA_8B), tp=1)).terms(forward_s)[
        "verify_token"
    ]
    unknown = ColdPrior(Deployment(tp=8)).terms(forward_s)["verify_token"]
    # larger, and wider in shares
    assert moe[0] > 2 * dense[0] and moe[0] * moe[1] > 2 * dense[0] * dense[1]
    assert unknown[0] * unknown[1] > dense[0] * dense[1]
    assert ModelSize.from_config(LLAMA_8B).routed_params == 0.0
    ds = ModelSize.from_config(DEEPSEEK_V3)
    assert (
        ds.experts == 256
        and ds.experts_per_token == 8
        and 0.3 < ds.routed_params / ds.active_params < 0.9
    )


def test_the_cost_fit_is_told_the_verify_token_prior():
    prior = ColdPrior(Deployment(target=ModelSize.from_config(DEEPSEEK_V3), tp=8))
    assert set(prior.terms(0.011)) == {"draft_step", "spec_fixed", "verify_token"}
