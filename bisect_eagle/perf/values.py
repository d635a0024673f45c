"""The throughput model's value types: a configuration as the model sees it, a prediction, and an
estimate's work.

They have a module of their own so that what reads or records predictions
(:mod:`~bisect_eagle.perf.accuracy`, the search's guide) needs no model, and the model
(:mod:`~bisect_eagle.perf.model`) is the only module that makes them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bisect_eagle.keys import IDS_KEY
from bisect_eagle.perf import acceptance as acc
from bisect_eagle.perf.cost import context_keys


@dataclass(frozen=True)
class Config:
    """What the model needs from a plan's effective settings (:meth:`from_effective`)."""

    wiring: tuple
    num_steps: int  # 0: the target alone
    topk: int
    num_draft_tokens: int
    batch: int
    context: tuple
    tokens: int | None = None  # tokens per request (finite generation), None = steady state
    adaptive: bool = False

    @property
    def speculative(self) -> bool:
        return self.num_steps > 0

    @classmethod
    def from_effective(
        cls,
        effective: Mapping[str, Any],
        *,
        concurrency: int | None = None,
        finite_horizon: bool = False,
    ) -> Config:
        """The model's view of a plan's effective settings.

        Args:
            effective: a plan's effective settings
                (:attr:`~bisect_eagle.engines.plan.TrialPlan.effective`), read at
                ``speculative_algorithm``, ``eagle_aux_hidden_state_layer_ids``, ``num_steps``,
                ``topk``, ``num_draft_tokens``, ``concurrency``, ``env``, ``server_args``,
                ``server`` (the server settings the engine resolved, wherever it put them:
                :func:`~bisect_eagle.perf.cost.context_keys`), ``max_new_tokens`` and
                ``speculative_adaptive``. ``num_draft_tokens`` is taken as the plan states it (the
                engine applied SGLang's rules, ``topk == 1`` included); missing keys take SGLang's
                defaults, except ``num_draft_tokens`` of a speculative config, which is required.
            concurrency: overrides the settings' own ``concurrency``.
            finite_horizon: read ``max_new_tokens`` as the tokens per request
                (:attr:`~bisect_eagle.perf.benchmark.Benchmark.finite_horizon`).

        Raises:
            ValueError: concurrency below 1, or a speculative config without ``num_draft_tokens``.
        """
        algorithm = str(effective.get("speculative_algorithm") or "EAGLE3")
        steps = int(effective.get("num_steps") or 0) if algorithm != "none" else 0
        batch = int(concurrency if concurrency is not None else effective.get("concurrency") or 1)
        if batch < 1:
            raise ValueError(f"concurrency must be >= 1, got {batch}")
        topk = max(1, int(effective.get("topk") or 1))
        ndt = effective.get("num_draft_tokens")
        if steps == 0:
            topk, ndt = 1, 1  # the target alone: one token per forward
        elif not ndt:
            raise ValueError(
                "num_draft_tokens is missing: a plan's effective settings state it (the engine's "
                "speculative rules applied)"
            )
        tokens = effective.get("max_new_tokens") if finite_horizon else None
        return cls(
            wiring=acc.wiring_key(effective.get(IDS_KEY), algorithm),
            num_steps=steps,
            topk=topk,
            num_draft_tokens=int(ndt),
            batch=batch,
            context=context_keys(
                effective.get("env"), effective.get("server_args"), effective.get("server")
            ),
            tokens=int(tokens) if tokens else None,
            adaptive=bool(effective.get("speculative_adaptive")),
        )


@dataclass(frozen=True)
class Prediction:
    """Predicted throughput of one configuration at one concurrency."""

    tok_s: float  # output tokens per second, all requests of the batch together
    accept_length: float  # tokens per verify cycle per request (bonus included)
    low: float  # prediction interval of the measured tok/s (ThroughputModel.interval)
    high: float
    cycle_s: float = math.nan  # seconds per verify cycle of the batch (per-request costs amortised)
    baseline_tok_s: float = math.nan  # the target alone, same concurrency and context
    concurrency: int = 1
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.tok_s / self.baseline_tok_s

    def to_json(self) -> dict[str, Any]:
        """The prediction as JSON.

        Returns:
            Every field by name, and ``speedup``.
        """
        return {**asdict(self), "speedup": self.speedup}


@dataclass(frozen=True)
class Estimate:
    """Expected work of a configuration: point values and joint draws (internal, also used by
    adaptive)."""

    tokens: float  # per request
    cycles: float
    seconds: float  # for the batch
    token_draws: np.ndarray
    cycle_draws: np.ndarray
    second_draws: np.ndarray
