"""The throughput split of a study's best live trial: its measured accept length against what
stage 1 predicts for the same wiring and steps, and its verify cycles/s against what the study
needs (:mod:`bisect_eagle.perf.split`).

What it reads (the contract): the best live trial's ``accept_length``, ``output_tok_s`` and
effective settings (``eagle_aux_hidden_state_layer_ids``, ``num_steps``, ``topk``,
``num_draft_tokens``, ``speculative_algorithm``); the standalone run of the same layer ids (its
``verdict`` tag's ``per_position`` accuracies, read at its ``metric`` param, which the model takes
as its prior too), else the model's ``predicted_accept_length`` on the trial, whose floor is the low
end of its interval, ``predicted_accept_length_low`` (logged by accept-length studies), else the
stated margin. The need is the study's target tok/s when its criterion is ``output_tok_s``, else
the baseline's tok/s (speculation must at least match the target alone).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from bisect_eagle.keys import IDS_KEY
from bisect_eagle.perf.split import Split, explain, stage1_accept_length
from bisect_eagle.report.study import best_row, study_value, trial_label, trials_frame

if TYPE_CHECKING:
    from mlflow.entities import Run

    from bisect_eagle.tracking.runs import Tracking

STAGE1 = "the dump (stage 1)"
MODEL = "the model"


@dataclass(frozen=True)
class TrialSplit:
    """A live trial's split (:class:`~bisect_eagle.perf.split.Split`), its name and run."""

    trial: str
    run_id: str
    split: Split

    def to_json(self) -> dict[str, Any]:
        """The trial, the split's fields, its cycles/s, the cycles/s needed and its sentence.

        Returns:
            ``{"trial", "run_id", "side", "accept_length", "predicted_accept_length", "floor",
            "source", "output_tok_s", "needed_tok_s", "need", "cycles_s", "needed_cycles_s",
            "sentence"}``.
        """
        s = self.split
        return {
            "trial": self.trial,
            "run_id": self.run_id,
            "side": s.side,
            "accept_length": s.accept_length,
            "predicted_accept_length": s.predicted,
            "floor": s.floor,
            "source": s.source,
            "output_tok_s": s.tok_s,
            "needed_tok_s": s.needed_tok_s,
            "need": s.need,
            "cycles_s": s.cycles_s,
            "needed_cycles_s": s.needed_cycles_s,
            "sentence": s.sentence(),
        }


def need_of(parent: Run, frame: pd.DataFrame, *, metric: str) -> tuple[float | None, str]:
    """(the tok/s the study needs, what it is): its target for an ``output_tok_s`` criterion, else
    the baseline trial's tok/s (the study's own when the trial is not in ``frame``)."""
    if metric == "output_tok_s":
        return study_value(parent, "target", metric=metric), "the target"
    if "stage" in frame and "output_tok_s" in frame:
        values = frame.loc[frame["stage"] == "baseline", "output_tok_s"].dropna()
        if len(values):
            return float(values.iloc[0]), "the baseline"
    return parent.data.metrics.get("baseline_output_tok_s"), "the baseline"


def stage1_prediction(tracking: Tracking, frame: pd.DataFrame, best: pd.Series) -> float | None:
    """The accept length stage 1 predicts for ``best``'s wiring and steps; None without a standalone
    run of its ids (or when its algorithm reads no ids)."""
    ids = _ids(best.get(IDS_KEY))
    algorithm = str(best.get("speculative_algorithm") or "EAGLE3")
    if ids is None or algorithm != "EAGLE3" or "layer_ids" not in frame:
        return None
    stage1 = frame[(frame["stage"] == "standalone") & (frame["outcome"] == "ok")]
    rows = [r for _, r in stage1.iterrows() if _ids(r.get("layer_ids")) == ids]
    if not rows:
        return None
    run = tracking.get_run(str(rows[0]["run_id"]))
    metric = run.data.params.get("metric", "full_vocab")
    try:
        verdict = json.loads(run.data.tags["verdict"])
        per_position = [float(p[metric]) for p in verdict["per_position"]]
    except (KeyError, TypeError, ValueError):
        return None
    if not per_position or not all(math.isfinite(p) for p in per_position):
        return None
    return stage1_accept_length(
        per_position,
        num_steps=_int(best["num_steps"]) or 1,
        topk=_int(best.get("topk")) or 1,
        num_draft_tokens=_int(best.get("num_draft_tokens")),
    )


def best_split(
    tracking: Tracking, parent: Run, frame: pd.DataFrame, best: pd.Series | None, *, metric: str
) -> TrialSplit | None:
    """The split of the best live trial.

    Args:
        tracking: the study's store.
        parent: the study's parent run.
        frame: the study's trials table (:func:`~bisect_eagle.report.study.trials_frame`).
        best: the best live trial's row of ``frame`` (None: no live trial finished ok).
        metric: the study's criterion metric.

    Returns:
        The trial's split; None when it has no accept length or tok/s, drafted nothing, or the study
        has no tok/s to need.
    """
    if best is None or any(_missing(best.get(k)) for k in ("accept_length", "output_tok_s")):
        return None
    if (_int(best.get("num_steps")) or 0) < 1:
        return None
    needed, need = need_of(parent, frame, metric=metric)
    if needed is None:
        return None
    predicted, floor, source = stage1_prediction(tracking, frame, best), None, STAGE1
    if predicted is None and not _missing(best.get("predicted_accept_length")):
        predicted, source = float(best["predicted_accept_length"]), MODEL
        low = best.get("predicted_accept_length_low")
        floor = None if _missing(low) else float(low)
    split = explain(
        accept_length=float(best["accept_length"]),
        tok_s=float(best["output_tok_s"]),
        needed_tok_s=float(needed),
        need=need,
        predicted=predicted,
        floor=floor,
        source=source if predicted is not None else "",
    )
    return TrialSplit(trial_label(best), str(best["run_id"]), split)


def study_split(tracking: Tracking, parent: Run) -> TrialSplit | None:
    """The split of the best live trial (by the criterion metric) of the study of ``parent``, as
    :func:`best_split` gives it.

    Args:
        tracking: the study's store.
        parent: the study's parent run (its ``criterion.metric`` param is read).

    Returns:
        The best trial's split; None as :func:`best_split` says (no live trial finished ok, or it
        cannot be split).
    """
    metric = parent.data.params.get("criterion.metric", "output_tok_s")
    frame = trials_frame(tracking, parent.info.run_id)
    return best_split(tracking, parent, frame, best_row(frame, metric), metric=metric)


def _ids(value: object) -> list[int] | None:
    """Layer ids as logged (a JSON list in a param, or a list); None when absent or unreadable."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        return None
    return list(value)


def _int(value: object) -> int | None:
    """A logged integer setting (an MLflow param is a string); None when absent or not one."""
    try:
        return int(str(value))
    except ValueError:
        return None


def _missing(value: object) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))
