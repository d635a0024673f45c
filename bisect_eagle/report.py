"""After a study: its trials as a pandas table, the best config, and PNG plots of accept length and tok/s
per searched setting (written to a folder and logged to the study's parent run under ``report/``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bisect_eagle.errors import BadInput
from bisect_eagle.tracking import Tracking

PLOTTED = ("accept_length", "output_tok_s")
IDENTITY_COLUMNS = ("run_id", "run_name", "stage", "status", "outcome", "gate", "failure_class")


def find_parent(tracking: Tracking, study: str | None = None):
    """The parent run of ``study`` (default: the experiment's newest study)."""
    flt = "tags.role = 'study'" + (f" and tags.study = '{study}'" if study else "")
    runs = tracking.client.search_runs([tracking.experiment_id], filter_string=flt,
                                       order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        what = f"study {study!r}" if study else "any study"
        raise BadInput(f"experiment {tracking.experiment_name()!r} in {tracking.uri} has no parent run of {what}")
    return runs[0]


def trials_frame(tracking: Tracking, parent_run_id: str) -> pd.DataFrame:
    """One row per child run: identity columns, the settings (effective, as logged) and the metrics."""
    rows = []
    for run in tracking.child_runs(parent_run_id):
        tags = run.data.tags
        row = {"run_id": run.info.run_id, "run_name": run.info.run_name, "stage": tags.get("stage"),
               "status": run.info.status, "outcome": tags.get("outcome"), "gate": tags.get("gate"),
               "failure_class": tags.get("failure_class")}
        row.update({k: v for k, v in run.data.params.items() if not k.startswith("requested.")})
        row.update(run.data.metrics)
        rows.append(row)
    return pd.DataFrame(rows)


def varying_settings(live: pd.DataFrame) -> list[str]:
    """Setting columns that take more than one value among live trials."""
    skip = set(IDENTITY_COLUMNS)
    metrics = {c for c in live.columns if pd.api.types.is_numeric_dtype(live[c])}
    return [c for c in live.columns if c not in skip and c not in metrics and live[c].nunique(dropna=True) > 1]


def best_row(frame: pd.DataFrame, metric: str) -> pd.Series | None:
    """The live trial with the highest ``metric`` among those that finished ok."""
    if frame.empty or metric not in frame:
        return None
    ok = frame[(frame["stage"] == "live") & (frame["outcome"] == "ok")].dropna(subset=[metric])
    return None if ok.empty else ok.loc[ok[metric].idxmax()]


def plot_per_setting(live: pd.DataFrame, metric: str, settings: list[str], out: Path,
                     lines: dict[str, float]) -> Path:
    """One PNG: ``metric`` against each varying setting (a point per trial, a bar at the median)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(settings))
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), squeeze=False)
    for ax, name in zip(axes[0], settings or [None], strict=True):
        if name is None:
            ax.text(0.5, 0.5, "no setting varied", ha="center", va="center")
            continue
        values = live[[name, metric]].dropna()
        order = sorted(values[name].unique(), key=_sort_key)
        for i, v in enumerate(order):
            ys = values.loc[values[name] == v, metric]
            ax.bar(i, ys.median(), color="#9ecae1", width=0.6)
            ax.scatter([i] * len(ys), ys, color="#08519c", zorder=3, s=14)
        ax.set_xticks(range(len(order)), [str(v) for v in order], rotation=30, ha="right", fontsize=8)
        ax.set_xlabel(name.replace("eagle_aux_hidden_state_layer_ids", "layer ids"), fontsize=9)
        ax.set_ylabel(metric, fontsize=9)
        for label, y in lines.items():
            ax.axhline(y, linestyle="--", linewidth=1, color="#d62728" if label == "target" else "#636363",
                       label=label)
        if lines:
            ax.legend(fontsize=7)
    fig.suptitle(f"{metric} per setting (live trials)", fontsize=10)
    fig.tight_layout()
    path = out / f"{metric}_per_setting.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _sort_key(v: str) -> tuple:
    try:
        return (0, float(v), "")
    except ValueError:
        return (1, 0.0, str(v))


@dataclass
class Report:
    frame: pd.DataFrame
    best: pd.Series | None
    files: list[Path]
    metric: str


def write_report(tracking: Tracking, parent, out: Path) -> Report:
    """Trials table (CSV), best config (JSON) and plots into ``out``; all logged to the parent run."""
    out.mkdir(parents=True, exist_ok=True)
    pid = parent.info.run_id
    metric = parent.data.params.get("criterion.metric", "output_tok_s")
    frame = trials_frame(tracking, pid)
    files = [out / "trials.csv"]
    frame.to_csv(files[0], index=False)
    best = best_row(frame, metric)
    files.append(out / "best.json")
    files[-1].write_text(json.dumps(None if best is None else best.dropna().to_dict(), indent=2, default=str))
    live = frame[(frame["stage"] == "live") & (frame["outcome"] == "ok")] if not frame.empty else frame
    if not live.empty:
        settings = varying_settings(live)
        for m in PLOTTED:
            if m in live:
                lines = {k: v for k, v in parent.data.metrics.items() if k in ("baseline", "target")}
                files.append(plot_per_setting(live, m, settings, out, lines if m == metric else {}))
    tracking.log_files(pid, out, "report")
    return Report(frame, best, files, metric)
