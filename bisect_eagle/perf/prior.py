"""The cold prior of a draft step's cost: what is known before the first speculative trial.

Before any speculative trial the cost fit knows one number, the baseline's measured seconds per
token (a one-token target forward ``t``). What a draft forward costs beside it follows from how a
decode forward at batch 1 spends its time: streaming the weights it reads (``bytes / (tp ·
bandwidth)``) and a fixed latency that does not shrink with the model (kernel launches, all-reduces
at ``tp > 1``, sampling, host syncs). So

    φ = max(0, 1 - t_mem / t)                    the fixed share of the target's forward
    κ = u + (1 - u) · L_draft / L_target          the share of that fixed latency a draft forward
    pays r = φ · κ + (1 - φ) · bytes_draft / bytes_target     a draft step, in target forwards

where ``u`` is the share of the fixed latency paid once per forward (graph launch, logits and
sampling, host sync) rather than per layer (each layer's launches and collectives), which a
one-layer draft pays only once. A large MoE target at ``tp = 8`` reads a few GB per GPU per token
and is latency-bound (``φ`` near 1): its draft steps cost about ``u`` of a target forward, however
small the draft; a dense target on one GPU is bandwidth-bound and its draft steps cost about the
draft's weights over the target's.

The inputs (:class:`Deployment`) come from the target's and the draft's ``config.json``
(:meth:`ModelSize.from_config`: active parameters per token, layers, bytes per parameter), the
plan's tensor parallelism and the device's memory bandwidth. A config.json that cannot be read
leaves that model unknown: the target's weights per GPU are then a deployment's typical footprint
(:data:`WEIGHT_FILL` of a device's memory, :data:`ACTIVE_SHARE` of it read per token, whatever
``tp`` is: a target is sharded to fit its GPUs), and the draft's weights :data:`DRAFT_SHARE` of the
target's.

An extra token in the verify forward (:meth:`ColdPrior.verify_token`) costs the per-token work ``c``
(compute, attention, sampling: small, and not known before a trial) plus, on a MoE target, the
routed experts it reads that the other tokens did not: a share ``routed · (1 - k/E)`` of the weights
(``routed``: the routed experts' share of the bytes read per token; ``k`` of ``E`` experts per
token), paid as streamed bytes in the memory-bound part of the forward and, in the latency-bound
part, as the expert GEMMs that are launched for it (a share ``w``, unknown)::

    vt = c + routed · (1 - k/E) · ((1 - φ) + φ · w)

so a dense target's extra token is nearly free while a sparse MoE's can cost a large share of a
forward, and the prior is wide where the config.json says MoE or says nothing.

Uncertainty: ``u``, the bandwidth, and each size are drawn (``u ~ Beta(2, 2)``, log-normal factors
on the bandwidth and the sizes, wider for an unknown model) and ``r`` is computed per draw: the
prior is the draws' median and their log-sd (:meth:`ColdPrior.draft_step`). :meth:`ColdPrior.terms`
hands the cost fit (:class:`~bisect_eagle.perf.cost.CostModel`, ``prior``) the draft step's share of
a target forward and its relative sd, and the speculative cycle's own overhead (tree build,
acceptance) with an honest sd: the interval of a cold prediction is wide, and it narrows as trials
fit the step costs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# B/s per device: an H100 SXM's HBM3, the slowest HBM of an 8-GPU serving node
GPU_BANDWIDTH = 3.35e12
CPU_BANDWIDTH = 5e10  # B/s: a server CPU's DRAM (the local engine on cpu)
DEVICE_MEMORY = 80e9  # B per device, when the target's size is unknown (an H100)
# share of a device's memory its weights fill (the rest: KV cache, activations, CUDA graphs)
WEIGHT_FILL = 0.5
# weights read per token when unknown: geometric midpoint of dense (1) and sparse MoE (~0.05)
ACTIVE_SHARE = 0.22
# the draft's weights over the target's active ones when unknown (one layer and a head)
DRAFT_SHARE = 0.03
TYPICAL_LAYERS = 48  # target layers when unknown
# per drafting cycle beyond its forwards (tree build, acceptance): share, relative sd
SPEC_OVERHEAD = (0.1, 1.0)
# median share of a forward one more token's own work costs (c), log-sd TOKEN_WORK_SD
TOKEN_WORK = 0.025
TOKEN_WORK_SD = 1.0
# the routed experts' share of a target's bytes when no config.json tells (uniform)
UNKNOWN_ROUTED = (0.0, 0.85)
# log-sd of what reading and launching one more token's experts costs (kernels, expert routing)
EXPERT_COST_SD = 0.7
BANDWIDTH_SD = 0.4  # log-sd of the device's bandwidth around its nominal value
# log-sd of bytes read per token estimated from a config.json (kernels, KV reads, scales)
KNOWN_SIZE_SD = 0.3
UNKNOWN_SIZE_SD = 1.0  # log-sd of a size that no config.json told
DRAWS = 2000

_DTYPE_BYTES = {
    "float32": 4.0,
    "float": 4.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "half": 2.0,
    "float8_e4m3fn": 1.0,
}


@dataclass(frozen=True, kw_only=True)
class ModelSize:
    """What a forward at batch 1 reads: active parameters per token, bytes per parameter, layers."""

    active_params: float
    bytes_per_param: float
    layers: int
    routed_params: float = 0.0  # of active_params: the routed experts' (MoE; 0 for a dense model)
    experts: int = 0  # routed experts per MoE layer
    experts_per_token: int = 0

    @property
    def bytes(self) -> float:
        return self.active_params * self.bytes_per_param

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelSize | None:
        """The size of a Hugging Face ``config.json`` (a target, or an EAGLE-3 draft in either
        layout).

        Args:
            config: the parsed config.json. A speculators draft's Llama keys are read under
                ``transformer_layer_config``. Counted per token: attention (MLA when
                ``kv_lora_rank`` is set), the MLP (a MoE layer's routed ``num_experts_per_tok`` and
                shared experts of ``moe_intermediate_size``; the first ``first_k_dense_replace``
                layers dense), the LM head (``draft_vocab_size`` rows for a draft) and a draft's
                ``fc`` over the aux hidden states; the embedding is a row lookup and is not counted.
                Bytes per parameter from ``quantization_config`` (fp8, NVFP4/MXFP4, ``bits``) or
                ``torch_dtype`` (default 2).

        Returns:
            None when ``hidden_size`` or ``num_hidden_layers`` is missing or not a positive number.
        """
        inner = config.get("transformer_layer_config")
        cfg = {**config, **inner} if isinstance(inner, Mapping) else dict(config)
        h, layers = _positive(cfg.get("hidden_size")), _positive(cfg.get("num_hidden_layers"))
        if h is None or layers is None:
            return None
        heads = _positive(cfg.get("num_attention_heads")) or max(1.0, h / 128)
        head_dim = _positive(cfg.get("head_dim")) or h / heads
        kv_heads = _positive(cfg.get("num_key_value_heads")) or heads
        inter = _positive(cfg.get("intermediate_size")) or 4 * h
        if _positive(cfg.get("kv_lora_rank")):  # multi-head latent attention (DeepSeek family)
            kv, rope = float(cfg["kv_lora_rank"]), _positive(cfg.get("qk_rope_head_dim")) or 64.0
            nope, v = (
                _positive(cfg.get("qk_nope_head_dim")) or 128.0,
                _positive(cfg.get("v_head_dim")) or 128.0,
            )
            q_rank = _positive(cfg.get("q_lora_rank"))
            q = h * q_rank + q_rank * heads * (nope + rope) if q_rank else h * heads * (nope + rope)
            attention = q + h * (kv + rope) + kv * heads * (nope + v) + heads * v * h
        else:
            attention = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim
        experts = _positive(
            cfg.get("n_routed_experts") or cfg.get("num_experts") or cfg.get("num_local_experts")
        )
        per_token = _positive(cfg.get("num_experts_per_tok"))
        if experts and per_token:
            shared = float(cfg.get("n_shared_experts") or 0)
            moe_inter = _positive(cfg.get("moe_intermediate_size")) or inter
            dense = min(layers, float(cfg.get("first_k_dense_replace") or 0))
            routed = (layers - dense) * per_token * 3 * h * moe_inter
            mlp = (
                dense * 3 * h * inter
                + routed
                + (layers - dense) * (shared * 3 * h * moe_inter + h * experts)
            )
        else:
            routed, mlp = 0.0, layers * 3 * h * inter
        vocab = _positive(cfg.get("draft_vocab_size") or cfg.get("vocab_size")) or 32000.0
        fc = 0.0
        if any(
            k in config for k in ("draft_vocab_size", "eagle_config", "transformer_layer_config")
        ):
            fc = (
                float(config.get("num_aux_hidden_states") or 3)
                * (_positive(cfg.get("target_hidden_size")) or h)
                * h
            )
        params = layers * attention + mlp + vocab * h + fc
        return cls(
            active_params=params,
            bytes_per_param=_bytes_per_param(cfg),
            layers=int(layers),
            routed_params=routed,
            experts=int(experts or 0),
            experts_per_token=int(per_token or 0),
        )


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """What is known of a deployment before its first trial (the module docstring's inputs)."""

    target: ModelSize | None = None  # None: no readable config.json
    draft: ModelSize | None = None
    tp: int = 1  # tensor parallelism of the plan: the GPUs a forward's weights are spread over
    bandwidth: float = GPU_BANDWIDTH  # B/s per device


class ColdPrior:
    """The draft step's prior cost from a :class:`Deployment` and the measured one-token forward
    (module docstring).

    Args:
        deployment: the known sizes, tensor parallelism and bandwidth.
        draws: draws of the unknowns per evaluation.
        seed: the draws' seed (a prior is reproducible).
    """

    def __init__(self, deployment: Deployment, *, draws: int = DRAWS, seed: int = 0):
        if deployment.tp < 1 or not deployment.bandwidth > 0:
            raise ValueError(
                f"tp must be >= 1 and bandwidth > 0, got {deployment.tp} and {deployment.bandwidth}"
            )
        self.deployment = deployment
        self.draws = draws
        self.seed = seed

    def _fixed_share(self, forward_s: float, rng: np.random.Generator) -> np.ndarray:
        """Draws of ``φ``, the fixed (latency) share of the measured one-token forward
        ``forward_s``."""
        d, n = self.deployment, self.draws
        if d.target is not None:
            target_gpu, target_sd = d.target.bytes / d.tp, KNOWN_SIZE_SD
        else:
            target_gpu, target_sd = DEVICE_MEMORY * WEIGHT_FILL * ACTIVE_SHARE, UNKNOWN_SIZE_SD
        target_gpu = target_gpu * np.exp(target_sd * rng.standard_normal(n))
        t_mem = target_gpu / (d.bandwidth * np.exp(BANDWIDTH_SD * rng.standard_normal(n)))
        return np.maximum(0.0, 1.0 - t_mem / forward_s)

    def draft_step(self, forward_s: float) -> tuple[float, float]:
        """(median, log-sd) of a draft step in one-token target forwards, given the measured
        ``forward_s``.

        Raises:
            ValueError: ``forward_s`` not finite and > 0.
        """
        _check(forward_s)
        d, rng = self.deployment, np.random.default_rng(self.seed)
        n = self.draws
        fixed = self._fixed_share(forward_s, rng)
        layers = d.target.layers if d.target is not None else TYPICAL_LAYERS
        if d.draft is not None and d.target is not None:
            ratio, ratio_sd, draft_layers = (
                d.draft.bytes / d.target.bytes,
                KNOWN_SIZE_SD,
                d.draft.layers,
            )
        else:
            ratio, ratio_sd, draft_layers = (
                DRAFT_SHARE,
                UNKNOWN_SIZE_SD,
                d.draft.layers if d.draft else 1,
            )
        ratio = np.minimum(1.0, ratio * np.exp(ratio_sd * rng.standard_normal(n)))
        per_forward = rng.beta(2.0, 2.0, n)
        kappa = per_forward + (1 - per_forward) * min(1.0, draft_layers / layers)
        return _median_sd(fixed * kappa + (1 - fixed) * ratio)

    def verify_token(self, forward_s: float) -> tuple[float, float]:
        """(median, log-sd) of one more token in the verify forward, in one-token target forwards
        (module docstring).

        Raises:
            ValueError: ``forward_s`` not finite and > 0.
        """
        _check(forward_s)
        d, rng = self.deployment, np.random.default_rng(self.seed + 1)
        n = self.draws
        fixed = self._fixed_share(forward_s, rng)
        work = TOKEN_WORK * np.exp(TOKEN_WORK_SD * rng.standard_normal(n))
        if d.target is None:
            routed, new = rng.uniform(*UNKNOWN_ROUTED, n), 1.0
        else:
            routed = d.target.routed_params / d.target.active_params
            new = 1 - d.target.experts_per_token / d.target.experts if d.target.experts else 0.0
        # the latency-bound part's extra expert GEMMs, a share of it
        launched = rng.beta(1.0, 3.0, n)
        experts = (
            routed
            * new
            * ((1 - fixed) + fixed * launched)
            * np.exp(EXPERT_COST_SD * rng.standard_normal(n))
        )
        return _median_sd(work + experts)

    def terms(self, forward_s: float) -> dict[str, tuple[float, float]]:
        """The cost fit's prior (share of a one-token target forward, relative sd) of the
        speculative terms and of the verify forward's per-token cost.

        Args:
            forward_s: the measured seconds of a one-token target forward (finite, > 0).

        Returns:
            ``{"draft_step", "spec_fixed", "verify_token"}`` → ``(median, log-sd)``, the median in
            one-token target forwards.

        Raises:
            ValueError: ``forward_s`` not finite and > 0.
        """
        return {
            "draft_step": self.draft_step(forward_s),
            "spec_fixed": SPEC_OVERHEAD,
            "verify_token": self.verify_token(forward_s),
        }


def _check(forward_s: float) -> None:
    if not (math.isfinite(forward_s) and forward_s > 0):
        raise ValueError(f"forward_s must be finite and > 0, got {forward_s}")


def _median_sd(draws: np.ndarray) -> tuple[float, float]:
    """(median, log-sd) of positive draws."""
    log_r = np.log(np.maximum(draws, 1e-6))
    return float(np.exp(np.median(log_r))), float(np.std(log_r))


def _positive(value: Any) -> float | None:
    return (
        float(value)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        else None
    )


def _bytes_per_param(cfg: Mapping[str, Any]) -> float:
    """Bytes per weight from ``quantization_config`` (scales included), else ``torch_dtype``."""
    q = cfg.get("quantization_config")
    if isinstance(q, Mapping):
        text = " ".join(
            str(v).lower() for v in (q.get("quant_method"), q.get("quant_algo"), q.get("format"))
        )
        if "fp4" in text:
            return 0.5625  # 4-bit values, one 8-bit scale per 16
        if "fp8" in text:
            return 1.0
        if _positive(q.get("bits")):
            return float(q["bits"]) / 8 + 0.03  # group scales and zeros
    return _DTYPE_BYTES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), 2.0)
