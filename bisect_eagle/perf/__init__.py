"""Performance model: predict a configuration's tok/s before launching it (issue 16).

- :mod:`~bisect_eagle.perf.acceptance`: accept length from per-position acceptance (chains, SGLang's
  draft trees) and the per-wiring acceptance posterior (stage 1 prior, live counts).
- :mod:`~bisect_eagle.perf.horizon`: verify cycles and work per request, steady state or a finite
  generation.
- :mod:`~bisect_eagle.perf.cost`: seconds of that work from fitted step costs, context factors,
  concurrency.
- :mod:`~bisect_eagle.perf.prior`: the cold prior of a draft step's cost, from what is known before
  any trial.
- :mod:`~bisect_eagle.perf.model`: :class:`ThroughputModel` (``predict``, ``predict_adaptive``,
  ``update``, ``error_report``); its value types (:class:`Config`, :class:`Prediction`) in
  :mod:`~bisect_eagle.perf.values`.
- :mod:`~bisect_eagle.perf.adaptive`: SGLang's ``--speculative-adaptive`` policy, simulated (the
  model's reference line for it).
- :mod:`~bisect_eagle.perf.benchmark`: :class:`Benchmark`, how an engine measures (what the model
  mirrors).

The names below load their module on first use, so ``bisect_eagle.perf.benchmark`` (which engines
import) costs no numpy or scipy import.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "AcceptanceModel": "acceptance",
    "chain_accept_length": "acceptance",
    "tree_survival": "acceptance",
    "wiring_key": "acceptance",
    "Benchmark": "benchmark",
    "STEADY_STATE": "benchmark",
    "CostModel": "cost",
    "context_keys": "cost",
    "Config": "values",
    "ErrorReport": "accuracy",
    "Prediction": "values",
    "ThroughputModel": "model",
    "metrics_from_result": "model",
    "ColdPrior": "prior",
    "Deployment": "prior",
    "ModelSize": "prior",
}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
