"""The ``vllm`` engine: one vLLM server per live trial, planned and checked by the installed vLLM
itself.

Modules (``engine.vllm`` is :class:`bisect_eagle.spec.schema.VllmServer`): :mod:`.planner` (the
trial plan), :mod:`.oracle` /
:mod:`.oracle_script` (vLLM's own parser and engine-args resolution, run in vLLM's interpreter),
:mod:`.ids` (aux layer ids in vLLM's convention, where vLLM reads them), :mod:`.launch` (argv,
environment, per-trial draft copy), :mod:`.client` (HTTP), :mod:`.metrics` (vLLM's Prometheus
counters), :mod:`.readback` (what the live server reports), :mod:`.failures` (failure classes),
:mod:`.engine` (the trial itself).
"""

from bisect_eagle.engines.vllm.engine import VllmEngine
from bisect_eagle.engines.vllm.failures import classify_failure

__all__ = ["VllmEngine", "classify_failure"]
