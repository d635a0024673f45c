"""Performance model: predict a configuration's tok/s before launching it (issue 16).

- :mod:`~bisect_eagle.perf.acceptance`: accept length from per-position acceptance (chains, SGLang's draft
  trees) and the per-wiring acceptance posterior (stage 1 prior, live counts).
- :mod:`~bisect_eagle.perf.horizon`: verify cycles and work per request, steady state or a finite generation.
- :mod:`~bisect_eagle.perf.cost`: seconds of that work from fitted step costs, context factors, concurrency.
- :mod:`~bisect_eagle.perf.model`: :class:`ThroughputModel` (``predict``, ``update``, ``error_report``).
- :mod:`~bisect_eagle.perf.adaptive`: SGLang's ``--speculative-adaptive`` policy as a reference line.
"""

from bisect_eagle.perf.acceptance import AcceptanceModel, chain_accept_length, tree_survival, wiring_key
from bisect_eagle.perf.cost import CostModel, context_keys
from bisect_eagle.perf.model import Config, ErrorReport, Prediction, ThroughputModel, metrics_from_result

__all__ = [
    "AcceptanceModel", "Config", "CostModel", "ErrorReport", "Prediction", "ThroughputModel", "chain_accept_length",
    "context_keys", "metrics_from_result", "tree_survival", "wiring_key",
]
