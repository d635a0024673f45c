"""The study's throughput model at its end: how well it predicted, what it skipped, what it would
deploy.

:func:`summarize` writes the parent run's model metrics and its ``model.json`` from the
:class:`~bisect_eagle.search.study.guide.ModelGuide` that steered the study.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from bisect_eagle.search.study.guide import ModelGuide
from bisect_eagle.tracking.runs import Tracking

PREDICTED = (
    "predicted_output_tok_s",
    "predicted_output_tok_s_low",
    "predicted_output_tok_s_high",
    "predicted_accept_length",
)


def summarize(
    guide: ModelGuide,
    *,
    tracking: Tracking,
    parent_run_id: str,
    skipped: list[dict[str, Any]],
    listed: Mapping[str, tuple[dict[str, Any], dict[str, Any]]] | None,
    best: Mapping[str, Any] | None,
    adaptive: Mapping[str, Any] | None,
) -> tuple[dict[str, float], dict[str, Any]]:
    """The study's model at its end: parent-run metrics and the ``model.json`` artifact.

    ``best``: the outcome's best trial (``fingerprint``, ``params`` = effective settings) or None;
    ``adaptive``: the engine's plan (effective settings) of the best config with SGLang's
    ``--speculative-adaptive``, None when the engine refuses it or SGLang turns it off. In
    ``model.json``: ``error``, the relative error of each live run's ``predicted_output_tok_s``
    (made before it ran) against its measured tok/s and the share inside the 80 % interval;
    ``skipped``, the configs never launched (their params and forecast); ``adaptive``, that plan
    predicted; ``per_concurrency``, the best config the final model predicts at each concurrency
    level of the listed configs (the best trial's own level when the space cannot be listed), with
    the baseline's prediction at that level and the run that measured it, if any.
    """
    runs = [r for r in tracking.child_runs(parent_run_id) if r.data.tags.get("stage") == "live"]
    guide.learn_runs(tracking, [r.info.run_id for r in runs])
    pairs = [
        r.data.metrics
        for r in runs
        if {*PREDICTED[:3], "output_tok_s"} <= set(r.data.metrics)
        and r.data.metrics["output_tok_s"] > 0
    ]
    errors = sorted(
        abs(m["predicted_output_tok_s"] - m["output_tok_s"]) / m["output_tok_s"] for m in pairs
    )
    inside = [
        m["predicted_output_tok_s_low"] <= m["output_tok_s"] <= m["predicted_output_tok_s_high"]
        for m in pairs
    ]
    error: dict[str, float] = {"n": len(errors)}
    metrics = {"model_predictions": float(len(errors)), "model_skipped": float(len(skipped))}
    if errors:
        error.update(
            median_rel_error=float(np.median(errors)),
            mean_rel_error=float(np.mean(errors)),
            p90_rel_error=float(np.quantile(errors, 0.9)),
            coverage=sum(inside) / len(inside),
        )
        metrics.update(
            model_median_rel_error=error["median_rel_error"], model_coverage=error["coverage"]
        )
    reference = None
    if adaptive is not None and guide.ready:
        with contextlib.suppress(ValueError):
            p = guide.model.predict(adaptive)
            reference = {
                "params": dict(adaptive),
                "predicted_output_tok_s": p.tok_s,
                "low": p.low,
                "high": p.high,
            }
            metrics.update(
                predicted_adaptive_output_tok_s=p.tok_s,
                predicted_adaptive_output_tok_s_low=p.low,
                predicted_adaptive_output_tok_s_high=p.high,
            )
    measured = {
        r.data.tags.get("fingerprint"): r.info.run_id for r in runs if r.info.status == "FINISHED"
    }
    configs = (
        dict(listed)
        if listed
        else ({best["fingerprint"]: ({}, dict(best["params"]))} if best else {})
    )
    per_level = _per_concurrency(guide, configs, measured) if guide.ready else []
    return metrics, {
        "error": error,
        "skipped": skipped,
        "adaptive": reference,
        "per_concurrency": per_level,
    }


def _per_concurrency(
    guide: ModelGuide,
    configs: Mapping[str, tuple[dict[str, Any], dict[str, Any]]],
    measured: Mapping[str | None, str],
) -> list[dict[str, Any]]:
    """The predicted best of ``configs`` (fingerprint -> (sampled, effective)) at each of their
    concurrency levels, beside the target alone at that level."""
    levels: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    for fp, (_, effective) in configs.items():
        levels.setdefault(int(effective.get("concurrency") or 1), []).append((fp, effective))
    out = []
    for level, items in sorted(levels.items()):
        scored = []
        for fp, effective in items:
            with contextlib.suppress(ValueError):
                scored.append((guide.model.predict(effective, concurrency=level), fp, effective))
        if not scored:
            continue
        p, fp, effective = max(scored, key=lambda x: x[0].tok_s)
        out.append(
            {
                "concurrency": level,
                "best_params": dict(effective),
                "predicted_output_tok_s": p.tok_s,
                "low": p.low,
                "high": p.high,
                "baseline_predicted_output_tok_s": p.baseline_tok_s,
                "measured_run_id": measured.get(fp),
            }
        )
    return out
