"""A planted engine for the perf tests: known chain acceptance and step costs, steady-state
metrics."""

from __future__ import annotations

import numpy as np

from bisect_eagle.perf.acceptance import chain_survival
from bisect_eagle.perf.cost import TERMS, generation_work
from bisect_eagle.perf.horizon import steady_state
from bisect_eagle.perf.model import ThroughputModel

TRUE_P = {
    (1, 5, 9): np.array([0.92, 0.9, 0.88, 0.8, 0.75, 0.7, 0.6, 0.55]),
    (5, 9, 11): np.array([0.6, 0.62, 0.6, 0.55, 0.5, 0.45, 0.4, 0.35]),
}
THETA = {
    "verify_fixed": 0.010,
    "verify_token": 0.0004,
    "draft_step": 0.001,
    "spec_fixed": 0.002,
    "cycle_fixed": 0.0003,
}


def effective(ids=(1, 5, 9), steps=3, **kw) -> dict:
    if steps == 0:
        return {
            "speculative_algorithm": "none",
            "num_steps": 0,
            "topk": 0,
            "num_draft_tokens": 0,
            **kw,
        }
    return {
        "speculative_algorithm": "EAGLE3",
        "eagle_aux_hidden_state_layer_ids": list(ids),
        "num_steps": steps,
        "topk": 1,
        "num_draft_tokens": steps + 1,
        **kw,
    }


def synthetic_trial(
    ids=(1, 5, 9), steps=3, cycles=400, noise=0.0, rng=None, env_factor=1.0
) -> dict:
    """Steady-state metrics of a planted engine: chain acceptance TRUE_P, step costs THETA."""
    p = TRUE_P[tuple(ids)] if steps else np.zeros(1)
    surv = chain_survival(p, steps) if steps else np.zeros(1)
    gen = steady_state(surv, num_steps=steps, num_draft_tokens=steps + 1)
    work = generation_work(gen)
    sec = sum(
        float(np.mean(v)) * THETA.get(t, 0.0) * (env_factor if TERMS[t][0] == "verify" else 1.0)
        for t, v in work.items()
    )
    al = float(gen.tokens)
    tok_s = al / sec * (1 + (noise * rng.standard_normal() if rng is not None else 0.0))
    rates = list(p[:steps]) if steps else []
    emitted = (
        np.concatenate([[1.0], surv]) - np.concatenate([surv, [0.0]]) if steps else np.array([1.0])
    )
    hist = {k + 1: round(cycles * float(e)) for k, e in enumerate(emitted)}
    return {
        "output_tok_s": tok_s,
        "accept_length": al,
        "accept_rate_per_position": rates,
        "accept_length_hist": hist,
    }


def fitted_model(configs=((1, 5, 9), (5, 9, 11)), steps=(1, 2, 4, 6), **kw) -> ThroughputModel:
    model = ThroughputModel(**kw)
    model.set_standalone([1, 5, 9], [0.85, 0.85, 0.8, 0.7, 0.65, 0.6, 0.5, 0.45])
    model.set_standalone(
        [5, 9, 11], [{"full_vocab": v} for v in (0.55, 0.6, 0.55, 0.5, 0.45, 0.4, 0.35, 0.3)]
    )
    model.update(effective(steps=0), synthetic_trial(steps=0))
    for ids in configs:
        for s in steps:
            model.update(effective(ids, s), synthetic_trial(ids, s))
    return model
