"""What a running vLLM server reports about itself, overlaid on the plan's effective settings.

The plan already holds what vLLM's resolution decided (:mod:`.oracle`); the live server confirms it:

- ``GET /v1/models``: the served model and its ``max_model_len``;
- ``GET /version``: vLLM's version;
- the server log: ``Using auxiliary layers from speculative config: (2, 6, 10)``
  (``vllm/v1/worker/gpu_model_runner.py:5243``), the aux layer ids the model runner really captures
  (vLLM logs nothing when it falls back to the model's default layers).

A value the server runs differently from the plan becomes a warning on the trial.
"""

from __future__ import annotations

import re
from typing import Any

_AUX = re.compile(r"Using auxiliary layers from speculative config: \(([-\d,\s]*)\)")


def log_aux_layers(log: str) -> list[int] | None:
    """The aux layer ids vLLM's model runner logged (the last such line), or None when it logged
    none."""
    found = _AUX.findall(log)
    if not found:
        return None
    return [int(x) for x in found[-1].replace(" ", "").split(",") if x]


def effective_from_server(
    planned: dict[str, Any], *, models: list[dict], version: str | None, log: str, baseline: bool
) -> dict[str, Any]:
    """The plan's effective settings overlaid with what the server reports running.

    Args:
        planned: the plan's effective settings.
        models: ``/v1/models`` ``data``.
        version: ``/version``.
        log: the server log so far.
        baseline: a no-speculation trial (no aux layers to read back).

    Returns:
        A new dict: ``server`` with the served model, ``max_model_len`` and version, and the aux
        layer ids the log shows (``vllm_aux_layer_ids``).
    """
    out = dict(planned)
    server = dict(out.get("server") or {})
    if models:
        server["served_model"] = models[0].get("id")
        if isinstance(models[0].get("max_model_len"), int):
            server["max_model_len"] = models[0]["max_model_len"]
    if version:
        server["version"] = version
    out["server"] = server
    if not baseline:
        ids = log_aux_layers(log)
        if ids is not None:
            out["vllm_aux_layer_ids"] = ids
    return out


def readback_differences(planned: dict[str, Any], effective: dict[str, Any]) -> list[str]:
    """Warnings where vLLM runs other than planned: the aux layers its log shows, the server
    fields ``/v1/models`` reports.

    Args:
        planned: the plan's effective settings.
        effective: :func:`effective_from_server` of the running server and its log.

    Returns:
        One warning per difference.
    """
    notes = []
    want, got = planned.get("vllm_aux_layer_ids"), effective.get("vllm_aux_layer_ids")
    if want is not None and got != want:
        notes.append(
            f"vLLM captures aux layers {got}, planned {want} (read back from the server log)"
        )
    for key, want in (planned.get("server") or {}).items():
        got = (effective.get("server") or {}).get(key, want)
        if want is not None and got != want:
            notes.append(
                f"server reports {key} = {got!r}, planned {want!r} (read back from /v1/models)"
            )
    return notes
