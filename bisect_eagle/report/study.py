"""After a study: its trials as a pandas table, the best config, and PNG plots (written to a folder
and logged to the study's parent run under ``report/``): accept length and output tok/s per searched
setting with the baseline and target lines (and SGLang's adaptive speculation as a reference), the
throughput model's predictions against the measurements, and stage-1 accuracy per wiring against the
gate. After a bisect: its probes against the limit."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.report.model import INTERVAL, ModelError, ModelView, adaptive_lines, model_view
from bisect_eagle.tracking.runs import Tracking
from bisect_eagle.trials.record import TRIAL_TAG, run_metrics

PLOTTED = ("accept_length", "output_tok_s")
IDENTITY_COLUMNS = (
    "run_id",
    "run_name",
    "trial",
    "stage",
    "status",
    "outcome",
    "gate",
    "failure_class",
)
SHORT = {IDS_KEY: "ids"}  # column names as a terminal or a plot shows them


def find_parent(tracking: Tracking, study: str | None = None):
    """The parent run of ``study`` (default: the experiment's newest study).

    Args:
        tracking: the store, on the study's experiment.
        study: the study's name (its ``study`` tag); None: the newest study of the experiment.

    Returns:
        The newest MLflow run tagged ``role=study`` (and that study).

    Raises:
        BadInput: the experiment has no such parent run.
    """
    flt = "tags.role = 'study'" + (f" and tags.study = '{study}'" if study else "")
    runs = tracking.client.search_runs(
        [tracking.experiment_id],
        filter_string=flt,
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    if not runs:
        what = f"study {study!r}" if study else "any study"
        raise BadInput(
            f"experiment {tracking.experiment_name()!r} in {tracking.uri} has no parent run of "
            f"{what}"
        )
    return runs[0]


def study_value(parent, kind: str, *, metric: str) -> float | None:
    """The parent run's ``baseline`` or ``target`` of ``metric`` (``baseline_<metric>``, else
    ``baseline``).

    Args:
        parent: the study's parent run.
        kind: ``"baseline"`` or ``"target"``.
        metric: the metric's name (the study's criterion metric).

    Returns:
        The logged value; None when the parent run has neither metric.
    """
    m = parent.data.metrics
    return m.get(f"{kind}_{metric}", m.get(kind))


def trials_frame(tracking: Tracking, parent_run_id: str) -> pd.DataFrame:
    """One row per child run: identity columns (``trial``: the trial's one name, ``live 003``), the
    settings (effective, as logged) and the trial's own metrics (MLflow's ``system/*`` samples left
    out).

    Args:
        tracking: the study's store.
        parent_run_id: the study's parent run.

    Returns:
        The table, one row per child run oldest first (``requested.*`` params left out); empty (no
        columns) when the study has no child run.
    """
    rows = []
    for run in tracking.child_runs(parent_run_id):
        tags = run.data.tags
        row = {
            "run_id": run.info.run_id,
            "run_name": run.info.run_name,
            "trial": tags.get(TRIAL_TAG),
            "stage": tags.get("stage"),
            "status": run.info.status,
            "outcome": tags.get("outcome"),
            "gate": tags.get("gate"),
            "failure_class": tags.get("failure_class"),
        }
        row.update({k: v for k, v in run.data.params.items() if not k.startswith("requested.")})
        row.update(run_metrics(run))
        rows.append(row)
    return pd.DataFrame(rows)


def varying_settings(live: pd.DataFrame) -> list[str]:
    """Setting columns that take more than one value among live trials, less those that follow from
    an earlier one (``num_draft_tokens`` is ``num_steps + 1`` at topk 1: the same panel twice).

    Args:
        live: the live trials' rows of :func:`trials_frame`.

    Returns:
        The setting columns (not identity or numeric columns), in column order.
    """
    skip = set(IDENTITY_COLUMNS)
    metrics = {c for c in live.columns if pd.api.types.is_numeric_dtype(live[c])}
    varying = [
        c
        for c in live.columns
        if c not in skip and c not in metrics and live[c].nunique(dropna=True) > 1
    ]
    kept: list[str] = []
    for name in varying:
        if not any(_same_partition(live, name, other) for other in kept):
            kept.append(name)
    return kept


def _same_partition(frame: pd.DataFrame, a: str, b: str) -> bool:
    """Whether each value of ``a`` goes with one value of ``b`` and the reverse (one setting
    determines the other)."""
    pair = frame[[a, b]].astype(str)
    return bool(
        (pair.groupby(a)[b].nunique() == 1).all() and (pair.groupby(b)[a].nunique() == 1).all()
    )


def best_row(frame: pd.DataFrame, metric: str) -> pd.Series | None:
    """The live trial with the highest ``metric`` among those that finished ok.

    Args:
        frame: the study's trials table (:func:`trials_frame`).
        metric: the column to maximise (the study's criterion metric).

    Returns:
        The best row; None when the table is empty, lacks ``metric``, or no live trial finished ok
        with a value of it.
    """
    if frame.empty or metric not in frame:
        return None
    ok = frame[(frame["stage"] == "live") & (frame["outcome"] == "ok")].dropna(subset=[metric])
    return None if ok.empty else ok.loc[ok[metric].idxmax()]


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_per_setting(
    live: pd.DataFrame,
    metric: str,
    *,
    settings: list[str],
    out: Path,
    lines: dict[str, float],
    band: tuple[str, float, float] | None = None,
) -> Path:
    """One PNG: ``metric`` against each varying setting (a point per trial, a bar at the median),
    with horizontal lines (e.g. ``{"baseline": 3.0, "target": 4.5}``; red for ``target``, purple for
    the ``adaptive`` references, dotted when ``predicted``) and an optional shaded ``band`` (label,
    low, high)."""
    plt = pyplot()
    n = max(1, len(settings))
    # constrained layout: rotated tick labels, legends and a suptitle
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.8), squeeze=False, layout="constrained")
    for ax, name in zip(axes[0], settings or [None], strict=True):
        # every trial had the same settings: one point per trial, named as the trial is
        if name is None:
            values = live.dropna(subset=[metric])
            ax.scatter(range(len(values)), values[metric], color="#08519c", zorder=3, s=18)
            ax.set_xticks(
                range(len(values)),
                [trial_label(r) for _, r in values.iterrows()],
                rotation=30,
                ha="right",
                fontsize=8,
            )
            ax.set_xlabel("live trial (no setting varied)", fontsize=9)
        else:
            values = live[[name, metric]].dropna()
            order = sorted(values[name].unique(), key=_sort_key)
            for i, v in enumerate(order):
                ys = values.loc[values[name] == v, metric]
                ax.bar(i, ys.median(), color="#9ecae1", width=0.6)
                ax.scatter([i] * len(ys), ys, color="#08519c", zorder=3, s=14)
            ax.set_xticks(
                range(len(order)), [str(v) for v in order], rotation=30, ha="right", fontsize=8
            )
            ax.set_xlabel(SHORT.get(name, name), fontsize=9)
        ax.set_ylabel(metric, fontsize=9)
        for label, y in lines.items():
            ax.axhline(
                y,
                linestyle=":" if "predicted" in label else "--",
                linewidth=1.2,
                color=_line_color(label),
                label=f"{label} {y:.1f}" if abs(y) >= 100 else f"{label} {y:.3g}",
            )
        if band is not None:
            ax.axhspan(band[1], band[2], color=_line_color(band[0]), alpha=0.12, label=band[0])
        if lines:
            ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"{metric} per setting (live trials that finished ok)", fontsize=10)
    path = out / f"{metric}_per_setting.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def trial_label(row: pd.Series) -> str:
    """A trials-table row as a person reads it: the trial's name (``live 003``), else its run id's
    first 8 characters (a run logged before trials were named).

    Args:
        row: a row of :func:`trials_frame` (``trial`` and ``run_id`` are read).

    Returns:
        The label.
    """
    name = row.get("trial")
    return name if isinstance(name, str) and name else str(row["run_id"])[:8]


def _line_color(label: str) -> str:
    """Red for the target, purple for SGLang's adaptive speculation, grey for the rest (the
    baseline)."""
    return (
        "#d62728" if label.startswith("target") else "#756bb1" if "adaptive" in label else "#636363"
    )


def plot_gate(stage1: pd.DataFrame, out: Path, *, margin: float | None = None) -> Path:
    """One PNG: stage-1 accuracy per wiring (green: passed the gate, grey: rejected) and the gate's
    threshold (``gate_threshold``, else ``gate_reference`` - ``margin``)."""
    plt = pyplot()
    rows = stage1.sort_values("standalone_accuracy")
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(rows) + 1.6))
    labels = [str(n).removeprefix("standalone ") for n in rows["run_name"]]
    colors = ["#31a354" if g == "pass" else "#bdbdbd" for g in rows["gate"]]
    ax.barh(range(len(rows)), rows["standalone_accuracy"], color=colors)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    for i, v in enumerate(rows["standalone_accuracy"]):
        ax.text(v, i, f" {v:.3f}", va="center", fontsize=7)
    threshold = None
    if "gate_threshold" in rows and rows["gate_threshold"].notna().any():
        threshold = float(rows["gate_threshold"].dropna().iloc[0])
    elif margin is not None and "gate_reference" in rows and rows["gate_reference"].notna().any():
        threshold = float(rows["gate_reference"].dropna().iloc[0]) - margin
    if threshold is not None:
        ax.axvline(
            threshold, color="#d62728", linestyle="--", linewidth=1.2, label=f"gate {threshold:.3f}"
        )
        ax.legend(fontsize=7, loc="lower right")
    ax.set_xlabel("standalone accuracy (green: goes live)", fontsize=9)
    ax.set_xlim(0, min(1.0, float(rows["standalone_accuracy"].max()) * 1.15 + 0.02))
    fig.suptitle("stage 1: accuracy per wiring", fontsize=10)
    fig.tight_layout()
    path = out / "standalone_accuracy_per_wiring.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_probes(probes: list[dict], *, judge: dict, out: Path) -> Path:
    """One PNG of a bisect: each probe's samples and median against the judge's limit (red: BAD,
    green: GOOD).

    Args:
        probes: the bisect report's probes in order (``outcome``, ``applied``, and optionally
            ``median`` and ``samples``).
        judge: the report's judge (``limit`` and ``metric`` are read when present).
        out: the PNG file to write.

    Returns:
        ``out``.
    """
    plt = pyplot()
    colors = {"GOOD": "#31a354", "BAD": "#d62728"}
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(probes) + 2), 4.2))
    for i, p in enumerate(probes):
        color = colors.get(p["outcome"], "#969696")
        if p.get("median") is not None:
            ax.bar(i, p["median"], color=color, alpha=0.35, width=0.6)
        samples = p.get("samples") or []
        ax.scatter([i] * len(samples), samples, color=color, s=14, zorder=3)
    labels = [f"{i + 1}: {_applied(p['applied'])}" for i, p in enumerate(probes)]
    ax.set_xticks(range(len(probes)), labels, rotation=35, ha="right", fontsize=7)
    if judge.get("limit") is not None:
        ax.axhline(
            judge["limit"],
            color="#636363",
            linestyle="--",
            linewidth=1.2,
            label=f"limit {judge['limit']:.4g}",
        )
        ax.legend(fontsize=7, loc="best")
    ax.set_ylabel(judge.get("metric", "value"), fontsize=9)
    fig.suptitle("bisect probes (green: good, red: bad, grey: unresolved)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_predicted(
    points: pd.DataFrame, *, error: ModelError, target: float | None, out: Path
) -> Path:
    """One PNG: each trial's measured tok/s (x) against its prediction (y) with the interval as an
    error bar (green: the measurement inside it, red: outside), the line y = x and the target (both
    axes)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.6, 5.0))
    for inside, color in ((True, "#31a354"), (False, "#d62728")):
        sel = points[points["inside"] == inside]
        if not sel.empty:
            yerr = [
                (sel["predicted"] - sel["low"]).clip(lower=0),
                (sel["high"] - sel["predicted"]).clip(lower=0),
            ]
            ax.errorbar(
                sel["measured"],
                sel["predicted"],
                yerr=yerr,
                fmt="o",
                color=color,
                ms=4,
                capsize=3,
                label=f"{'inside' if inside else 'outside'} the {INTERVAL} interval ({len(sel)})",
            )
    values = [
        *points["measured"],
        *points["low"],
        *points["high"],
        *([target] if target is not None else []),
    ]
    lo, hi = min(values), max(values)
    pad = 0.05 * (hi - lo or hi or 1.0)
    ax.plot(
        [lo - pad, hi + pad],
        [lo - pad, hi + pad],
        color="#636363",
        linewidth=1,
        label="predicted = measured",
    )
    if target is not None:
        ax.axvline(
            target, color="#d62728", linestyle="--", linewidth=1.2, label=f"target {target:.4g}"
        )
        ax.axhline(target, color="#d62728", linestyle="--", linewidth=1.2)
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_xlabel("measured output tok/s", fontsize=9)
    ax.set_ylabel(f"predicted output tok/s ({INTERVAL} interval)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(
        f"predicted vs measured: median error {100 * error.median_rel_error:.1f} %, "
        f"{error.inside}/{error.n} inside the {INTERVAL} interval",
        fontsize=10,
    )
    fig.tight_layout()
    path = out / "predicted_vs_measured_output_tok_s.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _applied(names: list[str]) -> str:
    """A probe's changes as a tick label: ``+num_steps,topk``, or their count when that is long."""
    text = "+" + ",".join(names) if names else "good"
    return text if len(text) <= 40 else f"+{len(names)} changes"


def _sort_key(v: str) -> tuple:
    try:
        return (0, float(v), "")
    except ValueError:
        return (1, 0.0, str(v))


@dataclass
class Report:
    """What :func:`write_report` wrote, with the model's side of the study
    (:mod:`bisect_eagle.report.model`)."""

    frame: pd.DataFrame
    best: pd.Series | None
    files: list[Path]
    metric: str
    model: ModelView


def _lines(frame: pd.DataFrame, parent, metric: str, plotted: str) -> dict[str, float]:
    """The baseline (the baseline trial's value, else the study's) and, for the criterion metric,
    the target."""
    lines: dict[str, float] = {}
    base = frame[frame["stage"] == "baseline"] if "stage" in frame else frame.iloc[:0]
    if plotted in base and base[plotted].notna().any():
        lines["baseline"] = float(base[plotted].dropna().iloc[0])
    elif plotted == metric and study_value(parent, "baseline", metric=metric) is not None:
        lines["baseline"] = float(study_value(parent, "baseline", metric=metric))
    if plotted == metric and study_value(parent, "target", metric=metric) is not None:
        lines["target"] = float(study_value(parent, "target", metric=metric))
    return lines


def write_report(tracking: Tracking, parent, *, out: Path | None) -> Report:
    """Trials table (CSV), best config (JSON) and plots into ``out``, all logged to the parent run
    unless the store is read-only (``tracking.read_only``).

    Args:
        tracking: the study's store.
        parent: the study's parent run (:func:`find_parent`).
        out: the folder to write into (created when absent), logged under the run's ``report/``;
            None: the report's data alone, no file written.

    Returns:
        The report: the trials table, the best row (None when no live trial finished ok), the files
        written, the criterion metric and the model's view.
    """
    pid = parent.info.run_id
    metric = parent.data.params.get("criterion.metric", "output_tok_s")
    frame = trials_frame(tracking, pid)
    if out is None:
        return Report(
            frame, best_row(frame, metric), [], metric, model_view(tracking, parent, frame=frame)
        )
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "trials.csv"]
    frame.to_csv(files[0], index=False)
    best = best_row(frame, metric)
    files.append(out / "best.json")
    files[-1].write_text(
        json.dumps(None if best is None else best.dropna().to_dict(), indent=2, default=str)
    )
    live = (
        frame[(frame["stage"] == "live") & (frame["outcome"] == "ok")] if not frame.empty else frame
    )
    model = model_view(tracking, parent, frame=frame)
    if not live.empty:
        settings = varying_settings(live)
        for m in PLOTTED:
            if m in live:
                lines = _lines(frame, parent, metric, m)
                references, band = (
                    adaptive_lines(model.adaptive) if m == "output_tok_s" else ({}, None)
                )
                files.append(
                    plot_per_setting(
                        live,
                        m,
                        settings=settings,
                        out=out,
                        lines={**lines, **references},
                        band=band,
                    )
                )
    if model.error is not None:
        files.append(
            plot_predicted(
                model.points,
                error=model.error,
                out=out,
                target=parent.data.metrics.get("target_output_tok_s"),
            )
        )
    stage1 = frame[frame["stage"] == "standalone"] if not frame.empty else frame
    if not stage1.empty and "standalone_accuracy" in stage1:
        margin = parent.data.params.get("gate.margin")
        files.append(plot_gate(stage1, out, margin=None if margin is None else float(margin)))
    if not tracking.read_only:
        tracking.log_files(pid, out, artifact_path="report")
    return Report(frame, best, files, metric, model)
