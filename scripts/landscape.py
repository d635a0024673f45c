"""A family of synthetic 8-GPU deployments of an EAGLE-3 draft, each drawn at random from a seed, as
engines.

The search and the bisect are judged on these worlds, so their structure is drawn, not borrowed from
the throughput model (:mod:`bisect_eagle.perf`): what an extra verified token costs, how fast
acceptance decays, what a wider tree buys, what NCCL and server settings do (with an interaction the
model has no term for), how far stage 1's proxy is from live acceptance, and how the machine drifts.
:func:`draw_world` makes one member; :data:`REPORTED_SEEDS` are the members whose figures the README
reports, :data:`HELDOUT_SEEDS` members never looked at while tuning the search (run them with
``bench_search.py --family --heldout``).

A world (:class:`World`), in target forwards (one forward of the target alone = 1):

- **Verify.** A forward verifying ``T`` tokens costs ``1 + vt · S · (1 - exp(-(T - 1) / S))``: the
  first extra tokens cost ``vt`` each (dense targets 0.01–0.08; MoE targets 0.06–0.48, where an
  extra token routes to other experts), saturating after about ``S`` tokens (MoE: every expert read;
  dense: ``S`` large, nearly linear).
- **Draft.** Each draft step costs ``draft_step`` (latency-bound MoE on 8 GPUs: a large share of a
  forward) plus ``draft_row`` per extra tree row (``topk - 1``); each speculative cycle
  ``spec_fixed`` more.
- **Acceptance.** Each wiring has a conditional acceptance ``a0 · decay^(k-1)`` at position ``k``;
  one wiring (:attr:`World.true_index`) is the one the draft was trained on. A tree of width ``w =
  min(topk, (ndt - 1) / steps)`` gives position ``k`` the chance ``1 - (1 - c_k)^(1 + gain · log2
  w)``. Accept length is ``1 + Σ_k Π_{j ≤ k} c_j``, at most ``ndt``.
- **System.** Every non-default value of ``env.NCCL_ALGO``,
  ``server_args.disable_custom_all_reduce`` and ``server_args.attention_backend`` has a log factor
  on tok/s drawn from ``N(0, σ_sys²)``; one pair of values has an extra interaction factor; another
  pair cannot launch (``launch_error``), and in some worlds triton attention cannot capture a tree
  wider than 2 (``capture_error``).
- **Stage 1.** What a standalone trial would score (:meth:`World.standalone`): per dump sample, hits
  of the first position drawn from the wiring's proxy accuracy ``scale · a0 · (1 + ε_w)`` (teacher
  forcing reads high by a shared ``scale``; ``ε_w`` is each wiring's own error), and per-position
  rates with their own decay: never the true curve.
- **Measurement.** tok/s times ``exp(N(0, noise²))``, its variance split between the launch and each
  benchmark round on it (``launch_share``), times ``exp(drift · launches so far)`` (a machine that
  warms or throttles).

A member has a config at least :data:`MIN_HEADROOM` above its baseline: deployments where
speculation cannot pay are not a search problem. ``scripts/bench_search.py --family`` runs the
search on each member.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass, field
from typing import Any

from bisect_eagle.engines.base import Engine, RequestRecord, TrialResult, combine_rounds, failed
from bisect_eagle.engines.plan import TrialPlan, make_plan
from bisect_eagle.engines.sglang.rules import speculative_effective
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.spec.schema import settings_from
from bisect_eagle.spec.settings import LiveSettings

REPORTED_SEEDS = tuple(range(8))  # the members whose figures the README reports
HELDOUT_SEEDS = tuple(range(100, 108))  # members never run while tuning the search
# a launch of a large target on a node (load, capture, warm-up): ten minutes, simulated
LAUNCH_S = 600.0
MIN_HEADROOM = 1.08  # a member's best config over its baseline, at least
STANDALONE_SAMPLES = 64  # dump samples a standalone trial scores
SAMPLE_TOKENS = (40, 160)  # scored tokens per dump sample (uniform)
SYSTEM: dict[str, list[Any]] = {  # searched system settings, default first
    "env.NCCL_ALGO": ["Ring", "Tree", "NVLS"],
    "server_args.disable_custom_all_reduce": [False, True],
    "server_args.attention_backend": ["fa3", "flashinfer", "triton"],
}
SPACE: dict[str, dict[str, Any]] = {
    "num_steps": {"type": "int", "low": 1, "high": 6},
    "topk": {"type": "categorical", "choices": [1, 2, 4]},
    "num_draft_tokens": {"type": "categorical", "choices": [4, 8, 16]},
    **{k: {"type": "categorical", "choices": v} for k, v in SYSTEM.items()},
}


@dataclass(frozen=True, kw_only=True)
class World:
    """One drawn deployment (module docstring); every field is drawn by :func:`draw_world`."""

    seed: int
    moe: bool
    layers: int
    base_tok_s: float  # the target alone with default system settings
    wirings: tuple[tuple[int, ...], ...]
    true_index: int
    accept0: tuple[float, ...]  # per wiring: conditional acceptance of the first position
    decay: tuple[float, ...]  # per wiring: its per-position decay
    tree_gain: float
    verify_token: float
    verify_saturation: float
    draft_step: float
    draft_row: float
    spec_fixed: float
    system: dict[str, float] = field(default_factory=dict)  # "key=value" -> log factor on tok/s
    interaction: tuple[str, str, float] = ("", "", 0.0)
    failure: tuple[str, str] = ("", "")  # a pair of "key=value" that cannot launch
    triton_tree_limit: int | None = None  # widest tree triton attention captures (None: no limit)
    proxy_scale: float = 1.0
    proxy_error: tuple[float, ...] = ()  # per wiring
    proxy_decay: tuple[float, ...] = ()  # per wiring: stage 1's per-position decay
    noise_scale: float = 1.0
    launch_share: float = 0.5
    drift: float = 0.0  # log tok/s per launch

    @property
    def true_wiring(self) -> list[int]:
        return list(self.wirings[self.true_index])

    # -- the truth
    # ----------------------------------------------------------------------------------------

    def _system(self, effective: dict[str, Any]) -> tuple[float, str | None]:
        """(log factor of the system settings, failure class or None)."""
        chosen = {f"{k}={v}" for k, v in _flat_system(effective).items()}
        if set(self.failure) <= chosen:
            return 0.0, "launch_error"
        topk = int(effective.get("topk") or 1)
        if (
            self.triton_tree_limit is not None
            and "server_args.attention_backend=triton" in chosen
            and topk > self.triton_tree_limit
        ):
            return 0.0, "capture_error"
        log = sum(self.system.get(c, 0.0) for c in chosen)
        a, b, effect = self.interaction
        return log + (effect if {a, b} <= chosen else 0.0), None

    def acceptance(self, wiring: list[int] | None, *, steps: int, topk: int, ndt: int) -> float:
        """Accept length of ``wiring`` (None: the draft's own, the true one; unknown ids accept next
        to nothing)."""
        ids = tuple(sorted(wiring)) if wiring else tuple(self.wirings[self.true_index])
        known = {tuple(sorted(w)): i for i, w in enumerate(self.wirings)}
        i = known.get(ids)
        a0, decay = (self.accept0[i], self.decay[i]) if i is not None else (0.03, 0.5)
        width = max(1.0, min(topk, (ndt - 1) / steps))
        boost = 1 + self.tree_gain * math.log2(width)
        length, running = 1.0, 1.0
        for k in range(steps):
            c = a0 * decay**k
            running *= 1 - (1 - c) ** boost
            length += running
        return min(length, float(ndt))

    def cycle_cost(self, *, steps: int, topk: int, ndt: int) -> float:
        """One speculative cycle in target forwards (module docstring)."""
        s = self.verify_saturation
        verify = 1 + self.verify_token * s * (1 - math.exp(-(ndt - 1) / s))
        return verify + steps * (self.draft_step + self.draft_row * (topk - 1)) + self.spec_fixed

    def true_value(self, effective: dict[str, Any]) -> tuple[float | None, float, str | None]:
        """(noise-free tok/s or None when it fails, accept length, failure class) of an effective
        config."""
        log, failure = self._system(effective)
        if failure is not None:
            return None, math.nan, failure
        speed = self.base_tok_s * math.exp(log)
        if effective.get("speculative_algorithm") == "none" or not effective.get("num_steps"):
            return speed, 1.0, None
        steps, topk = int(effective["num_steps"]), int(effective.get("topk") or 1)
        ndt = int(effective.get("num_draft_tokens") or steps + 1)
        wiring = effective.get(IDS_KEY)
        # the target's final state: no fc, ids unused
        if effective.get("speculative_algorithm") == "EAGLE":
            wiring = [-1]
        # acceptance pinned: every forward runs, the profile accepts
        pinned = effective.get("pinned_acceptance")
        al = 1 + sum(pinned) if pinned else self.acceptance(wiring, steps=steps, topk=topk, ndt=ndt)
        return speed * al / self.cycle_cost(steps=steps, topk=topk, ndt=ndt), al, None

    def truth(self, flat: dict[str, Any]) -> float:
        """The noise-free tok/s of flat settings (``env.X``, ``server_args.y`` dotted), 0.0 when it
        fails."""
        plan = WorldEngine(self).plan(settings_from(dict(flat), "truth"))
        return 0.0 if plan.refusal is not None else self.true_value(plan.effective)[0] or 0.0

    def best(self) -> tuple[dict[str, Any], float]:
        """The best flat config of :data:`SPACE` over every wiring, and its noise-free tok/s.

        The system settings multiply tok/s whatever the speculative shape, except where they fail,
        so each shape the engine accepts is scored once and paired with every system combination
        that launches with it.
        """
        engine = WorldEngine(self)
        shapes = []
        for wiring, steps, topk, ndt in itertools.product(
            self.wirings, range(1, 7), [1, 2, 4], [4, 8, 16]
        ):
            plan = engine.plan(
                LiveSettings(
                    eagle_aux_hidden_state_layer_ids=list(wiring),
                    num_steps=steps,
                    topk=topk,
                    num_draft_tokens=ndt,
                )
            )
            if plan.refusal is None:
                e = plan.effective
                al = self.acceptance(
                    list(wiring), steps=steps, topk=topk, ndt=e["num_draft_tokens"]
                )
                value = al / self.cycle_cost(steps=steps, topk=topk, ndt=e["num_draft_tokens"])
                shapes.append(
                    (
                        value,
                        {
                            IDS_KEY: list(wiring),
                            "num_steps": steps,
                            "topk": topk,
                            "num_draft_tokens": ndt,
                        },
                    )
                )
        scored = []
        for combo in itertools.product(*SYSTEM.values()):
            system = dict(zip(SYSTEM, combo, strict=True))
            nested = {"env": {}, "server_args": {}}
            for key, v in system.items():
                group, name = key.split(".", 1)
                nested[group][name] = v
            for value, shape in shapes:
                log, failure = self._system({**nested, "topk": shape["topk"]})
                if failure is None:
                    scored.append((self.base_tok_s * math.exp(log) * value, {**shape, **system}))
        value, flat = max(scored, key=lambda x: x[0])
        return flat, value

    def good_config(self) -> dict[str, Any]:
        """A flat config at or above the baseline: the best chain of the true wiring with default
        system settings when it beats the baseline, else the space's best."""
        chains = [{IDS_KEY: self.true_wiring, "num_steps": s, "topk": 1} for s in range(1, 7)]
        value, flat = max((self.truth(c), c) for c in chains)
        return flat if value >= self.base_tok_s else self.best()[0]

    def config_json(self) -> dict[str, Any]:
        """The target's ``config.json`` as its deployment would ship it: what the tool may know
        before a trial (MoE or dense, sizes), never the drawn costs. Its sizes are typical of the
        kind, not of this member."""
        if self.moe:
            return {
                "architectures": ["DeepseekV3ForCausalLM"],
                "hidden_size": 7168,
                "num_hidden_layers": self.layers,
                "num_attention_heads": 128,
                "num_key_value_heads": 128,
                "intermediate_size": 18432,
                "moe_intermediate_size": 2048,
                "n_routed_experts": 384,
                "num_experts_per_tok": 8,
                "n_shared_experts": 1,
                "first_k_dense_replace": 1,
                "kv_lora_rank": 512,
                "q_lora_rank": 1536,
                "qk_rope_head_dim": 64,
                "qk_nope_head_dim": 128,
                "v_head_dim": 128,
                "vocab_size": 163840,
                "torch_dtype": "bfloat16",
                "quantization_config": {"quant_method": "fp8"},
            }
        return {
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 8192,
            "num_hidden_layers": self.layers,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "intermediate_size": 28672,
            "vocab_size": 128256,
            "torch_dtype": "bfloat16",
        }

    # -- stage 1
    # ---------------------------------------------------------------------------------------------

    def standalone(self, index: int, *, steps: int, rng: random.Random) -> dict[str, Any]:
        """What a standalone trial of wiring ``index`` scores: per-sample first-position hits and
        tokens, and a per-position accuracy (each position's rate drawn from its tokens), all from
        the proxy."""
        proxy = min(0.99, self.proxy_scale * self.accept0[index] * (1 + self.proxy_error[index]))
        tokens = [rng.randint(*SAMPLE_TOKENS) for _ in range(STANDALONE_SAMPLES)]
        hits = [sum(rng.random() < proxy for _ in range(n)) for n in tokens]
        per_position = []
        for k in range(steps):
            rate = min(0.99, proxy * self.proxy_decay[index] ** k)
            n = sum(tokens)
            per_position.append(sum(rng.random() < rate for _ in range(n)) / n)
        return {"hits": hits, "tokens": tokens, "per_position": per_position}


def _flat_system(effective: dict[str, Any]) -> dict[str, Any]:
    """The system settings of an effective config, defaults filled in, as ``{"env.NCCL_ALGO":
    ...}``."""
    out = {}
    for key, values in SYSTEM.items():
        group, name = key.split(".", 1)
        out[key] = (effective.get(group) or {}).get(name, values[0])
    return out


def draw_world(seed: int) -> World:
    """The family's member ``seed`` (module docstring); drawn again until it has
    :data:`MIN_HEADROOM`."""
    rng = random.Random(seed)
    while True:
        world = _draw(seed, rng)
        if world.best()[1] >= MIN_HEADROOM * world.base_tok_s:
            return world


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _draw(seed: int, rng: random.Random) -> World:
    moe = seed % 2 == 0  # half the family: MoE targets (even seeds), half dense
    layers = rng.choice([48, 61, 78, 92])
    n_wirings = rng.randint(5, 8)
    true_ids = sorted({2, layers // 2 - 1, layers - 4})
    wirings = [tuple(true_ids)]
    # off-by-one layers, the embedding, other thirds: the incident's mistakes
    while len(wirings) < n_wirings:
        shift = rng.choice([-1, 1, 2])
        kind = rng.random()
        if kind < 0.35:
            ids = tuple(sorted({min(layers - 1, max(0, i + shift)) for i in true_ids}))
        elif kind < 0.6:
            ids = tuple(sorted({-1, *true_ids[:2]}))
        else:
            ids = tuple(sorted(rng.sample(range(layers), 3)))
        if ids not in wirings and len(ids) == 3:
            wirings.append(ids)
    order = list(range(n_wirings))
    rng.shuffle(order)
    wirings = [wirings[i] for i in order]
    true_index = order.index(0)
    a_true = rng.uniform(0.6, 0.9)
    accept0 = [
        a_true if i == true_index else a_true * rng.uniform(0.15, 0.9) for i in range(n_wirings)
    ]
    decay = [rng.uniform(0.86, 1.0) for _ in range(n_wirings)]
    sigma_sys = rng.uniform(0.01, 0.06)
    system = {
        f"{k}={v}": rng.gauss(0.0, sigma_sys) for k, values in SYSTEM.items() for v in values[1:]
    }
    pairs = [
        (a, b)
        for a, b in itertools.combinations(sorted(system), 2)
        if a.split("=")[0] != b.split("=")[0]
    ]
    a, b = rng.choice(pairs)
    fail = rng.choice([p for p in pairs if p != (a, b)])
    return World(
        seed=seed,
        moe=moe,
        layers=layers,
        base_tok_s=rng.uniform(40.0, 120.0),
        wirings=tuple(wirings),
        true_index=true_index,
        accept0=tuple(accept0),
        decay=tuple(decay),
        tree_gain=rng.uniform(0.12, 0.6),
        verify_token=_log_uniform(rng, 0.06, 0.48) if moe else _log_uniform(rng, 0.01, 0.08),
        verify_saturation=_log_uniform(rng, 3.0, 24.0) if moe else 200.0,
        draft_step=rng.uniform(0.15, 0.45) if moe else rng.uniform(0.04, 0.25),
        draft_row=rng.uniform(0.0, 0.04),
        spec_fixed=rng.uniform(0.015, 0.15),
        system=system,
        interaction=(a, b, rng.gauss(0.0, 0.07)),
        failure=fail,
        triton_tree_limit=rng.choice([2, None]),
        proxy_scale=rng.uniform(0.96, 1.3),
        proxy_error=tuple(rng.gauss(0.0, 0.04) for _ in range(n_wirings)),
        proxy_decay=tuple(rng.uniform(0.8, 1.0) for _ in range(n_wirings)),
        noise_scale=rng.uniform(0.6, 1.6),
        launch_share=rng.uniform(0.2, 0.8),
        drift=rng.uniform(-0.0035, 0.0035),
    )


class WorldEngine(Engine):
    """A :class:`World` as an engine: each measurement is the true value times log-normal noise and
    drift.

    ``plan`` applies SGLang's speculative rules (the fingerprint is the trial's identity) and
    refuses a ``num_draft_tokens`` above the tree's ``1 + topk × num_steps`` nodes;
    ``speculative_algorithm: EAGLE`` leaves the layer ids unused (the plan says so: no ids), as
    SGLang's EAGLE path for an EAGLE-3 draft does. Benchmark rounds share a launch
    (:meth:`run_rounds`): the noise splits into a launch effect (variance ``launch_share · noise²``)
    and a round effect (the rest), so one round's noise is ``noise`` whatever the split. A launch is
    reported as :data:`LAUNCH_S` seconds outside its rounds.

    Args:
        world: the deployment.
        noise: relative noise of one measurement before the world's own ``noise_scale``.
        seed: the measurements' generator.
        launch_share: the launch's share of the noise variance (None: the world's own).
    """

    name = "landscape"
    rounds_share_launch = True

    def __init__(
        self, world: World, *, noise: float = 0.0, seed: int = 0, launch_share: float | None = None
    ):
        self.world = world
        self.launch_share = world.launch_share if launch_share is None else launch_share
        self.noise = noise * world.noise_scale
        self.rng = random.Random(seed)
        self.runs = 0

    def plan(self, settings: LiveSettings) -> TrialPlan:
        effective, warnings, refusal = speculative_effective(settings)
        for key in ("concurrency", "device", "dtype"):
            effective.pop(key, None)
        if refusal is None and not settings.is_baseline:
            nodes = 1 + effective["topk"] * effective["num_steps"]
            if effective["num_draft_tokens"] > nodes:
                refusal = (
                    f"num_draft_tokens {effective['num_draft_tokens']} exceeds the tree's 1 + topk "
                    f"× num_steps = {nodes} tokens"
                )
            if effective.get("speculative_algorithm") == "EAGLE":
                effective[IDS_KEY] = []
        return make_plan(
            self.name, settings, effective=effective, warnings=warnings, refusal=refusal
        )

    def run(self, plan: TrialPlan) -> TrialResult:
        return self.run_rounds(plan, rounds=1)

    def run_rounds(self, plan: TrialPlan, *, rounds: int) -> TrialResult:
        if plan.refusal is not None:
            raise BadInput(plan.refusal)
        self.runs += 1
        value, accept_length, failure = self.world.true_value(plan.effective)
        if value is None:
            return failed(
                self.name,
                requested=plan.requested,
                effective=plan.effective,
                cls=failure,
                detail="synthetic failure",
            )
        share = self.launch_share
        drift = self.world.drift * (self.runs - 1)
        launch = self.rng.gauss(0.0, self.noise * math.sqrt(share)) if self.noise else 0.0
        round_sd = self.noise * math.sqrt(1 - share)
        results = [
            self._round(
                plan,
                value
                * math.exp(drift + launch + (self.rng.gauss(0.0, round_sd) if self.noise else 0.0)),
                accept_length,
            )
            for _ in range(rounds)
        ]
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
            requests=[
                RequestRecord(
                    id="p0",
                    prompt_tokens=32,
                    completion_tokens=tokens,
                    verify_steps=round(tokens / accept_length),
                    latency_s=tokens / measured,
                )
            ],
        )
