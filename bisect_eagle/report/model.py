"""The throughput model's side of a study report, as data (``report`` draws and prints it): its
predictions against the measurements, SGLang's adaptive speculation as a reference, and the best
config per concurrency level.

What the search logs (the contract this module reads):

- each live trial child run: ``predicted_output_tok_s`` with ``_low``/``_high`` (an 80 % prediction
  interval of the measured tok/s) and ``predicted_accept_length`` beside the measured
  ``output_tok_s`` and ``accept_length``; trials measured before the model could predict lack them;
- the parent run: ``model_median_rel_error``, ``model_coverage``, ``model_predictions``,
  ``model_skipped``, ``predicted_adaptive_output_tok_s`` with ``_low``/``_high``
  (``--speculative-adaptive`` on the best config), and the artifact ``model.json`` (``error``,
  ``skipped``, ``adaptive``, ``per_concurrency``); ``model_predictions`` is logged whenever the
  model was on (``search.model.enabled``), so its absence means the study ran without the model.

The error and coverage the report states are computed from the child runs it plots, so the plot, its
title and the text agree with each other whether or not the study has finished.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from mlflow.entities import Run

    from bisect_eagle.tracking.runs import Tracking

PREDICTED = "predicted_output_tok_s"
MEASURED = "output_tok_s"
ADAPTIVE = "predicted_adaptive_output_tok_s"
ADAPTIVE_PARAM = "speculative_adaptive"
# the parent run's param: "True" when the search ran with the model
MODEL_ON = "search.model.enabled"
ARTIFACT = "model.json"
INTERVAL = "80 %"  # the model's prediction interval (central 10th to 90th percentile)


@dataclass(frozen=True)
class ModelError:
    """How well the predictions matched: ``n`` predicted trials, ``inside`` of them within their
    interval."""

    n: int
    inside: int
    median_rel_error: float


@dataclass(frozen=True)
class Adaptive:
    """SGLang's adaptive speculation on the best config: predicted (value and interval; None when
    the engine cannot run it or the model could not predict) and, when a trial with
    ``speculative_adaptive=true`` finished ok, the best such measurement."""

    predicted: float | None
    low: float | None
    high: float | None
    measured: float | None = None
    measured_run_id: str | None = None


@dataclass
class ModelView:
    """Everything the report shows about the model; ``artifact`` is ``model.json`` (None when not
    logged)."""

    points: pd.DataFrame
    error: ModelError | None
    artifact: dict[str, Any] | None
    adaptive: Adaptive | None
    skipped: int | None
    notes: list[str]


def live_ok(frame: pd.DataFrame) -> pd.DataFrame:
    """The live trials that finished ok."""
    if frame.empty or "stage" not in frame:
        return frame.iloc[:0]
    return frame[(frame["stage"] == "live") & (frame["outcome"] == "ok")]


def prediction_points(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per live trial (any outcome: a pruned trial was measured too) with a measured tok/s
    and a prediction with its interval, the runs the search's own ``model_median_rel_error`` counts:
    ``run_id``, ``measured``, ``predicted``, ``low``, ``high``, ``rel_error`` (``|predicted -
    measured| / measured``) and ``inside`` (``low <= measured <= high``)."""
    columns = [MEASURED, PREDICTED, f"{PREDICTED}_low", f"{PREDICTED}_high"]
    live = frame[frame["stage"] == "live"] if "stage" in frame else frame.iloc[:0]
    if live.empty or not set(columns) <= set(live.columns):
        return pd.DataFrame(
            columns=["run_id", "measured", "predicted", "low", "high", "rel_error", "inside"]
        )
    rows = live[["run_id", *columns]].dropna(subset=columns)
    points = pd.DataFrame(
        {
            "run_id": rows["run_id"],
            "measured": rows[MEASURED].astype(float),
            "predicted": rows[PREDICTED].astype(float),
            "low": rows[f"{PREDICTED}_low"].astype(float),
            "high": rows[f"{PREDICTED}_high"].astype(float),
        }
    ).reset_index(drop=True)
    points["rel_error"] = (points["predicted"] - points["measured"]).abs() / points["measured"]
    points["inside"] = (points["low"] <= points["measured"]) & (
        points["measured"] <= points["high"]
    )
    return points


def model_error(points: pd.DataFrame) -> ModelError | None:
    """The median relative error and the coverage of ``points`` (:func:`prediction_points`); None
    when empty."""
    if points.empty:
        return None
    return ModelError(
        n=len(points),
        inside=int(points["inside"].sum()),
        median_rel_error=float(points["rel_error"].median()),
    )


def is_adaptive(value: object) -> bool:
    """Whether a logged ``speculative_adaptive`` param is on (MLflow params are strings:
    ``True``)."""
    return str(value).strip().lower() in ("true", "1")


def adaptive_reference(parent: Run, frame: pd.DataFrame) -> Adaptive | None:
    """The predicted adaptive reference of the parent run, with the best measured adaptive trial;
    None when the parent has no ``predicted_adaptive_output_tok_s`` and no adaptive trial was
    measured."""
    m = parent.data.metrics
    live = live_ok(frame)
    measured = None
    if ADAPTIVE_PARAM in live and MEASURED in live:
        adaptive = live[live[ADAPTIVE_PARAM].map(is_adaptive)].dropna(subset=[MEASURED])
        measured = None if adaptive.empty else adaptive.loc[adaptive[MEASURED].idxmax()]
    if ADAPTIVE not in m and measured is None:
        return None
    return Adaptive(
        predicted=m.get(ADAPTIVE),
        low=m.get(f"{ADAPTIVE}_low"),
        high=m.get(f"{ADAPTIVE}_high"),
        measured=None if measured is None else float(measured[MEASURED]),
        measured_run_id=None if measured is None else str(measured["run_id"]),
    )


def read_artifact(tracking: Tracking, run_id: str) -> tuple[dict[str, Any] | None, str | None]:
    """(``model.json`` of the run, None) — (None, None) when it was not logged, (None, why) when
    unreadable."""
    if ARTIFACT not in {a.path for a in tracking.client.list_artifacts(run_id)}:
        return None, None
    try:
        body = json.loads(tracking.read_text(run_id, ARTIFACT))
    except ValueError as e:
        return (
            None,
            f"{ARTIFACT} of the study's run is not JSON ({e}); its per-concurrency picks are not "
            "shown",
        )
    if not isinstance(body, dict):
        return (
            None,
            f"{ARTIFACT} of the study's run is not a JSON object; its per-concurrency picks are "
            "not shown",
        )
    return body, None


def model_view(tracking: Tracking, parent: Run, *, frame: pd.DataFrame) -> ModelView:
    """What the report shows of the model for the study of ``parent`` (``frame``: its trials table).
    A study run without the model (no ``model_predictions`` on ``parent``) gets no note about
    missing predictions."""
    points = prediction_points(frame)
    artifact, why = read_artifact(tracking, parent.info.run_id)
    notes = [] if why is None else [why]
    if points.empty and (
        parent.data.params.get(MODEL_ON) == "True" or "model_predictions" in parent.data.metrics
    ):
        notes.append("model: no live trial carries a prediction (no predicted-vs-measured plot)")
    skipped = parent.data.metrics.get("model_skipped")
    if skipped is None and artifact is not None and isinstance(artifact.get("skipped"), list):
        skipped = len(artifact["skipped"])
    return ModelView(
        points=points,
        error=model_error(points),
        artifact=artifact,
        adaptive=adaptive_reference(parent, frame),
        skipped=None if skipped is None else int(skipped),
        notes=notes,
    )


def best_measured(frame: pd.DataFrame, *, concurrency: object = None) -> float | None:
    """The highest measured tok/s among live trials that finished ok (at ``concurrency`` when
    given).

    Args:
        frame: the study's trials table (:func:`~bisect_eagle.report.study.trials_frame`).
        concurrency: only trials at this concurrency level (compared as text); None: every level.

    Returns:
        The highest output tok/s; None when no such trial measured one.
    """
    live = live_ok(frame)
    if MEASURED not in live:
        return None
    if concurrency is not None and "concurrency" in live:
        live = live[live["concurrency"].astype(str) == str(concurrency)]
    values = live[MEASURED].dropna()
    return None if values.empty else float(values.max())


def per_concurrency(artifact: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The model's best config per concurrency level (``model.json``), lowest level first.

    Args:
        artifact: the study's ``model.json`` (None: the study has none).

    Returns:
        The ``per_concurrency`` entries that are objects with a ``concurrency`` key, sorted by
        level; empty when there are none.
    """
    rows = (artifact or {}).get("per_concurrency") or []
    return sorted(
        (r for r in rows if isinstance(r, dict) and "concurrency" in r),
        key=lambda r: int(r["concurrency"]),
    )


def measured_per_concurrency(frame: pd.DataFrame) -> pd.DataFrame:
    """The best measured live trial (by tok/s) per ``concurrency`` level when live trials ran at
    more than one level (concurrency was searched); empty otherwise. Rows sorted by level.

    Args:
        frame: the study's trials table.

    Returns:
        One row of ``frame`` per level, its columns kept.
    """
    live = live_ok(frame)
    if live.empty or "concurrency" not in live or MEASURED not in live:
        return live.iloc[:0]
    live = live.dropna(subset=["concurrency", MEASURED])
    if live["concurrency"].nunique() < 2:
        return live.iloc[:0]
    best = live.loc[live.groupby("concurrency")[MEASURED].idxmax()]
    return (
        best.assign(_level=best["concurrency"].astype(float))
        .sort_values("_level")
        .drop(columns="_level")
    )


def adaptive_lines(
    adaptive: Adaptive | None,
) -> tuple[dict[str, float], tuple[str, float, float] | None]:
    """The throughput plot's adaptive references: horizontal lines (predicted, measured) and the
    predicted interval as a band (label, low, high)."""
    if adaptive is None:
        return {}, None
    lines = {}
    if adaptive.predicted is not None:
        lines["SGLang adaptive (predicted)"] = adaptive.predicted
    if adaptive.measured is not None:
        lines["SGLang adaptive (measured)"] = adaptive.measured
    band = None
    if adaptive.predicted is not None and adaptive.low is not None and adaptive.high is not None:
        band = (f"adaptive predicted {INTERVAL} interval", adaptive.low, adaptive.high)
    return lines, band
