"""SGLang's ``--speculative-adaptive`` as a reference line: its run-time ``num_steps`` policy,
predicted.

SGLang 0.5.23 (``srt/speculative/adaptive_spec_params.py``) keeps one slot per batch-size bucket
(the largest configured bucket ≤ the batch size; CUDA-graph padding is ignored here). A slot tracks
an EMA (``ema_alpha``) of the accepted drafts per request (bonus excluded) at its current step
count, initialised at ``steps - 1``; after ``warmup_batches`` verifies, every ``update_interval``
verifies it steps down while ``ema ≤ prev - 0.5 + down_hysteresis`` (``0.5 + down_hysteresis`` when
``prev = 0``), else up while ``ema > current - 0.5 + up_hysteresis``; at 0 steps (no drafting) it
probes the next candidate. Each step count runs with ``num_draft_tokens = steps + 1`` (chain
drafting only; ``topk = 1``). The initial step count is the server's ``num_steps`` when it is a
candidate, else the middle candidate.

Prediction (:meth:`~bisect_eagle.perf.model.ThroughputModel.predict_adaptive`, which reads this
module: the policy needs no model): the policy is simulated (seeded) for ``cycles`` verifies with
per-request accepted drafts drawn from the acceptance posterior mean at the current step count,
which gives the share of cycles spent at each step count; throughput is ``B · Σ_s share_s · AL_s /
Σ_s share_s · cycle_s`` with each ``AL_s`` (tokens per cycle) and ``cycle_s`` (seconds per cycle)
from the same model (per-request costs of a finite benchmark amortised per cycle at each step
count), and its interval from the model's joint draws at fixed shares. Switching costs between step
counts are ignored.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# SGLang 0.5.23 DEFAULT_ADAPTIVE_CONFIG (batch-size bucket -> slot)
DEFAULT_ADAPTIVE_CONFIG: dict[str, dict[str, Any]] = {
    "1": {
        "candidate_steps": [1, 3, 5, 7],
        "up_hysteresis": 0.0,
        "down_hysteresis": -0.25,
        "ceiling_coeff": 0,
    },
    "8": {
        "candidate_steps": [0, 1, 3],
        "up_hysteresis": 0.0,
        "down_hysteresis": 0.0,
        "ceiling_coeff": 0,
    },
    "32": {
        "candidate_steps": [0, 1],
        "up_hysteresis": 0.0,
        "down_hysteresis": 0.0,
        "ceiling_coeff": 0,
    },
    "64": {
        "candidate_steps": [0],
        "up_hysteresis": 0.0,
        "down_hysteresis": 0.0,
        "ceiling_coeff": 0,
    },
}


@dataclass(frozen=True)
class SlotConfig:
    """One batch-size bucket's policy (SGLang's ``AdaptiveStepSlot`` parameters and defaults)."""

    candidate_steps: tuple[int, ...]
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0
    ceiling_coeff: float = 0.0


def slot_for_batch(batch: int, config: Mapping[str, Mapping[str, Any]] | None = None) -> SlotConfig:
    """The slot SGLang routes ``batch`` to: the largest bucket ≤ ``batch`` (the smallest when none
    is)."""
    cfg = dict(DEFAULT_ADAPTIVE_CONFIG if config is None else config)
    top = {k: v for k, v in cfg.items() if not k.isdigit()}  # global keys apply to every slot
    buckets = sorted(int(k) for k in cfg if k.isdigit())
    if not buckets:
        raise ValueError("an adaptive config needs at least one integer batch-size key")
    chosen = buckets[max(0, bisect.bisect_right(buckets, batch) - 1)]
    entry = {**top, **cfg[str(chosen)]}
    steps = sorted(set(entry["candidate_steps"]))
    if not steps or any(s < 0 for s in steps):
        raise ValueError(f"bucket {chosen}: candidate_steps must be non-negative ints, got {steps}")
    fields = {
        k: entry[k]
        for k in (
            "ema_alpha",
            "update_interval",
            "warmup_batches",
            "down_hysteresis",
            "up_hysteresis",
            "ceiling_coeff",
        )
        if k in entry
    }
    return SlotConfig(tuple(steps), **fields)


class _Slot:
    """SGLang's ``AdaptiveStepSlot`` state machine (logging and runtime swaps left out)."""

    def __init__(self, initial_steps: int, cfg: SlotConfig):
        self.cfg = cfg
        self.steps = list(cfg.candidate_steps)
        self.current = (
            initial_steps if initial_steps in self.steps else self.steps[len(self.steps) // 2]
        )
        self.ema = float(self.current - 1)
        self.count = 0

    def update(self, correct_per_req: np.ndarray) -> None:
        """One batch: update the EMA and, on schedule after warm-up, the step count.

        Args:
            correct_per_req: accepted draft tokens of each request of the batch (the EMA moves only
                while speculating, ``current > 0``).
        """
        c = self.cfg
        if self.current > 0:
            self.ema = (1 - c.ema_alpha) * self.ema + c.ema_alpha * float(np.mean(correct_per_req))
        self.count += 1
        if (
            self.count > c.warmup_batches
            and (self.count - c.warmup_batches) % c.update_interval == 0
        ):
            self._recompute()

    def _recompute(self) -> None:
        c, old = self.cfg, self.current
        idx = old_idx = self.steps.index(old)
        if old == 0:
            idx = min(idx + 1, len(self.steps) - 1)
            if self.steps[idx] > 0 and self.ema < 0:
                self.ema = float(self.steps[idx] - 1)
            self.current = self.steps[idx]
            return
        while idx > 0:
            prev = self.steps[idx - 1]
            threshold = (0.5 if prev == 0 else prev - 0.5) + c.down_hysteresis
            if self.ema <= threshold:
                idx -= 1
            else:
                break
        if idx == old_idx:
            while idx < len(self.steps) - 1 and self.ema > self.steps[idx] - 0.5 + c.up_hysteresis:
                idx += 1
        if c.ceiling_coeff > 0:
            ceiling = max(1, int(np.ceil(self.ema * c.ceiling_coeff)))
            if ceiling < self.steps[idx] <= old:
                while idx > 0 and self.steps[idx] > ceiling:
                    idx -= 1
        self.current = self.steps[idx]


def simulate_occupancy(
    slot: SlotConfig,
    *,
    initial_steps: int,
    accepted_dist: Mapping[int, np.ndarray],
    batch: int = 1,
    cycles: int = 4000,
    seed: int = 0,
) -> dict[int, float]:
    """Share of verify cycles at each candidate step count under SGLang's policy.

    ``accepted_dist[s][k]`` = P(``k`` drafts accepted in a cycle at ``s`` steps), ``k = 0 .. s``,
    for every positive candidate ``s``; each cycle draws ``batch`` requests independently.
    """
    rng = np.random.default_rng(seed)
    state = _Slot(initial_steps, slot)
    cdfs = {s: np.cumsum(accepted_dist[s]) for s in slot.candidate_steps if s > 0}
    seen: dict[int, int] = {s: 0 for s in slot.candidate_steps}
    for _ in range(cycles):
        s = state.current
        seen[s] += 1
        if s > 0:
            draws = np.searchsorted(cdfs[s], rng.random(batch) * cdfs[s][-1], side="right")
            state.update(np.minimum(draws, s))
        else:
            state.update(np.zeros(batch))
    return {s: n / cycles for s, n in seen.items()}
