"""A synthetic 8-GPU deployment landscape of an EAGLE-3 draft, as an engine: known truth, optional noise.

Axes (the spec's ``space``; ``env.*`` and ``server_args.*`` as the sglang engine takes them): the wiring
(eight candidate aux-layer lists of a 48-layer target, one right), ``num_steps``, ``topk``,
``num_draft_tokens``, ``env.NCCL_ALGO``, ``env.NCCL_PROTO``, ``server_args.disable_custom_all_reduce`` and
``server_args.attention_backend``. The noise-free throughput of a config is

    tok/s = BASELINE_TOK_S × system × accept_length / verify_cost

with ``accept_length = 1 + Σ_{k=1..steps} a^k`` (``a``: the wiring's per-step acceptance, a little higher with
tree drafting), ``verify_cost = 1 + 0.62·steps + 0.03·draft_tokens`` and ``system`` the product of the
NCCL, all-reduce and attention factors. The baseline (no speculation, default system settings) is
``BASELINE_TOK_S``; only the right wiring with short chains and a good system setting beats it (a few % of
all configs). Failures: NVLS with the LL protocol cannot launch, triton attention cannot capture a wide tree
(``topk > 2``), ``num_draft_tokens`` above the tree's ``1 + topk × steps`` nodes is refused.

:class:`LandscapeEngine` is an :class:`~bisect_eagle.engines.base.Engine`: ``plan`` applies SGLang's
speculative rules (the fingerprint is the trial's identity), ``run`` returns the value times
``exp(N(0, noise²))`` from its own seeded generator, its noise split between launches and benchmark rounds
(:meth:`LandscapeEngine.run_rounds`). Used by ``scripts/bench_search.py``.
"""

from __future__ import annotations

import math
import random
from typing import Any

from bisect_eagle.engines.base import Engine, RequestRecord, TrialResult, combine_rounds, failed
from bisect_eagle.engines.plan import TrialPlan, make_plan, speculative_effective
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.settings import LiveSettings

BASELINE_TOK_S = 90.0
TRUE_WIRING = [2, 23, 44]
WIRINGS = [TRUE_WIRING, [1, 22, 43], [3, 24, 45], [23, 44, 47], [0, 2, 23], [2, 23, 47], [10, 20, 30], [44, 45, 46]]
ACCEPT = {0: 0.80, 1: 0.40, 2: 0.45, 3: 0.30, 4: 0.35, 5: 0.40, 6: 0.10, 7: 0.05}  # per-step acceptance
STANDALONE = {0: 0.79, 1: 0.55, 2: 0.56, 3: 0.41, 4: 0.44, 5: 0.60, 6: 0.12, 7: 0.08}  # what stage 1 would score
NCCL_ALGO = {"Ring": 1.0, "Tree": 0.97, "NVLS": 1.04}
NCCL_PROTO = {"Simple": 1.0, "LL": 1.01, "LL128": 1.02}
ATTENTION = {"fa3": 1.0, "flashinfer": 0.99, "triton": 0.90}
NO_CUSTOM_ALL_REDUCE = 0.92
LAUNCH_S = 600.0  # a launch of a large target on a node (load, capture, warm-up): ten minutes, simulated

SPACE: dict[str, dict[str, Any]] = {
    "num_steps": {"type": "int", "low": 1, "high": 6},
    "topk": {"type": "categorical", "choices": [1, 2, 4]},
    "num_draft_tokens": {"type": "categorical", "choices": [4, 8, 16]},
    "env.NCCL_ALGO": {"type": "categorical", "choices": list(NCCL_ALGO)},
    "env.NCCL_PROTO": {"type": "categorical", "choices": list(NCCL_PROTO)},
    "server_args.disable_custom_all_reduce": {"type": "categorical", "choices": [False, True]},
    "server_args.attention_backend": {"type": "categorical", "choices": list(ATTENTION)},
}
DEFAULTS = {"env": {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"},
            "server_args": {"disable_custom_all_reduce": False, "attention_backend": "fa3"}}


def gate(margin: float = 0.05) -> list[list[int]]:
    """The wirings stage 1 would pass: standalone accuracy within ``margin`` of the best."""
    best = max(STANDALONE.values())
    return [WIRINGS[i] for i, acc in STANDALONE.items() if acc >= best - margin]


def _system(effective: dict[str, Any]) -> tuple[float, str | None]:
    """(throughput factor of the system settings, failure class or None)."""
    env = {**DEFAULTS["env"], **(effective.get("env") or {})}
    args = {**DEFAULTS["server_args"], **(effective.get("server_args") or {})}
    if env["NCCL_ALGO"] == "NVLS" and env["NCCL_PROTO"] == "LL":
        return 0.0, "launch_error"
    if args["attention_backend"] == "triton" and (effective.get("topk") or 1) > 2:
        return 0.0, "capture_error"
    factor = NCCL_ALGO[env["NCCL_ALGO"]] * NCCL_PROTO[env["NCCL_PROTO"]] * ATTENTION[args["attention_backend"]]
    return factor * (NO_CUSTOM_ALL_REDUCE if args["disable_custom_all_reduce"] else 1.0), None


def true_value(effective: dict[str, Any]) -> tuple[float | None, float, str | None]:
    """(noise-free tok/s or None when it fails, accept length, failure class) of an effective config."""
    system, failure = _system(effective)
    if failure is not None:
        return None, float("nan"), failure
    if effective.get("speculative_algorithm") == "none":
        return BASELINE_TOK_S * system, 1.0, None
    ids = sorted(effective.get("eagle_aux_hidden_state_layer_ids") or TRUE_WIRING)
    a = ACCEPT[WIRINGS.index(ids)] if ids in WIRINGS else 0.05
    steps, topk, ndt = effective["num_steps"], effective["topk"], effective["num_draft_tokens"]
    a = 1 - (1 - a) ** (1 + 0.25 * math.log2(topk))  # a tree gives the right token more chances
    accept_length = 1 + sum(a**k for k in range(1, steps + 1))
    cost = 1 + 0.62 * steps + 0.03 * ndt
    return BASELINE_TOK_S * system * accept_length / cost, accept_length, None


class LandscapeEngine(Engine):
    """The landscape as an engine: each measurement is the true value times log-normal noise (``noise`` relative).

    Its benchmark rounds share a launch (:meth:`run_rounds`): the noise of one measurement splits into a launch
    effect (variance ``launch_share · noise²``, drawn once per launch) and a round effect (the rest, drawn per
    round), so one round's noise is ``noise`` whatever the split. A launch is reported as :data:`LAUNCH_S` seconds
    outside its rounds (a large target's launch), a round as its tokens over its tok/s.
    """

    name = "landscape"
    rounds_share_launch = True

    def __init__(self, *, noise: float = 0.0, seed: int = 0, launch_share: float = 0.5):
        self.noise = noise
        self.launch_share = launch_share
        self.rng = random.Random(seed)
        self.runs = 0

    def plan(self, settings: LiveSettings) -> TrialPlan:
        effective, warnings, refusal = speculative_effective(settings)
        for key in ("concurrency", "device", "dtype"):
            effective.pop(key, None)
        if refusal is None and not settings.is_baseline:
            nodes = 1 + effective["topk"] * effective["num_steps"]
            if effective["num_draft_tokens"] > nodes:
                refusal = (f"num_draft_tokens {effective['num_draft_tokens']} exceeds the tree's "
                           f"1 + topk × num_steps = {nodes} tokens")
        return make_plan(self.name, settings, effective=effective, warnings=warnings, refusal=refusal)

    def run(self, plan: TrialPlan) -> TrialResult:
        return self.run_rounds(plan, rounds=1)

    def run_rounds(self, plan: TrialPlan, *, rounds: int) -> TrialResult:
        if plan.refusal is not None:
            raise BadInput(plan.refusal)
        self.runs += 1
        value, accept_length, failure = true_value(plan.effective)
        if value is None:
            return failed(
                self.name, requested=plan.requested, effective=plan.effective, cls=failure, detail="synthetic failure"
            )
        launch = self.rng.gauss(0.0, self.noise * math.sqrt(self.launch_share)) if self.noise else 0.0
        round_sd = self.noise * math.sqrt(1 - self.launch_share)
        results = [self._round(plan, value * math.exp(launch + (self.rng.gauss(0.0, round_sd) if self.noise else 0.0)),
                               accept_length) for _ in range(rounds)]
        result = combine_rounds(results)
        result.launch_s = LAUNCH_S
        return result

    def _round(self, plan: TrialPlan, measured: float, accept_length: float) -> TrialResult:
        tokens = 256
        return TrialResult(
            engine=self.name,
            status="ok",
            requested=plan.requested,
            effective=plan.effective,
            output_tok_s=measured,
            accept_length=accept_length,
            wall_s=tokens / measured,
            requests=[RequestRecord(id="p0", prompt_tokens=32, completion_tokens=tokens,
                                    verify_steps=round(tokens / accept_length), latency_s=tokens / measured)],
        )
