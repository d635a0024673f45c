"""``bisect-eagle report``: a study's target, verdict and best run (and its throughput split:
the acceptance or the cost side), the throughput model's error, SGLang's adaptive speculation and
the best config per concurrency level, its live trials (fits 80 columns), and plots (also logged to
MLflow)."""

from __future__ import annotations

import math
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from bisect_eagle.cli.common import (
    RATIO_HEADER,
    URI_HELP,
    Activity,
    num,
    open_study_run,
    plural,
    print_json,
    times_baseline,
    trial_ref,
)
from bisect_eagle.cli.logs import quiet_libraries
from bisect_eagle.keys import IDS_KEY

# pandas and the report's modules are imported when used: the command speaks first
if TYPE_CHECKING:
    import pandas as pd

    from bisect_eagle.report.model import Adaptive, ModelView
    from bisect_eagle.report.split import TrialSplit
    from bisect_eagle.report.study import Report

SETTING_COLUMNS = (IDS_KEY, "num_steps", "topk", "num_draft_tokens")
SHORT = {IDS_KEY: "ids"}
WIDTH = 80


def setting_text(row: pd.Series, names: list[str]) -> str:
    """``ids=[1, 5, 9] steps=3``: the named settings of a trial, short names, nothing cut."""
    import pandas as pd

    return " ".join(
        f"{SHORT.get(n, n.removeprefix('num_'))}={row[n]}"
        for n in names
        if n in row and pd.notna(row[n])
    )


def wrapped(text: str, indent: str = "  ") -> list[str]:
    """``text`` as lines of at most 80 characters (continuations indented; words never cut)."""
    return textwrap.wrap(
        text, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False
    )


def summary_lines(parent, rep) -> list[str]:
    """The study, its verdict sentence (said once), the best config's tok/s against the baseline's,
    the best run with its metrics and settings."""
    import pandas as pd

    from bisect_eagle.report.study import trial_label

    metric, m = rep.metric, parent.data.metrics
    tags = parent.data.tags
    lines = [f"study {tags.get('study', parent.info.run_name)} (run {parent.info.run_id[:8]})"]
    if tags.get("verdict"):
        lines += wrapped(tags["verdict"])
    # a study still running (or stopped before its end): its target, and that it has no verdict yet
    else:
        from bisect_eagle.report.study import study_value

        baseline, target = (
            study_value(parent, kind, metric=metric) for kind in ("baseline", "target")
        )
        if target is not None:
            ratio = (
                f" ({times_baseline(target / baseline)}; baseline {metric} {num(baseline)})"
                if baseline
                else ""
            )
            lines += wrapped(f"target: {metric} >= {num(target)}{ratio}")
        lines.append(
            f"verdict: {'none yet, still running' if parent.info.status == 'RUNNING' else 'none'}"
        )
    speed = tags.get("speed") or speed_text(rep.best, rep.frame)
    if speed:
        lines += wrapped(speed)
    best = rep.best
    if best is None:
        return [*lines, "best: no live trial finished ok"]
    lines += wrapped(f"best: {trial_ref(trial_label(best), best['run_id'])}")
    shown = []
    for name in dict.fromkeys([metric, "accept_length", "output_tok_s"]):
        if name in best and pd.notna(best[name]):
            ratio = best.get(f"{name}_ratio_to_baseline")
            shown.append(
                f"{name} {num(best[name])}"
                + ("" if ratio is None or pd.isna(ratio) else f" ({times_baseline(ratio)})")
            )
    lines += wrapped("  " + ", ".join(shown), indent="    ")
    settings = [c for c in SETTING_COLUMNS if c in best and pd.notna(best[c])]
    lines += wrapped("  " + setting_text(best, settings), indent="    ")
    if m.get(f"best_{metric}") is None:
        lines.append("  (the study has not finished: these are its trials so far)")
    return lines


def speed_text(best: pd.Series | None, frame: pd.DataFrame) -> str | None:
    """The best config's output tok/s against the baseline trial's, for a study whose run has no
    ``speed`` tag (still running): said plainly when speculation is slower; None without both.

    Args:
        best: the best trial's row; None when there is none.
        frame: the study's trials (``stage`` and ``output_tok_s`` columns).

    Returns:
        The sentence, or None.
    """
    from bisect_eagle.search.study.outcome import speed_sentence

    if best is None or "output_tok_s" not in best or frame.empty or "stage" not in frame:
        return None
    base = (
        frame.loc[frame["stage"] == "baseline", "output_tok_s"].dropna()
        if "output_tok_s" in frame
        else []
    )
    if not len(base) or _missing(best["output_tok_s"]):
        return None
    return speed_sentence(
        {"output_tok_s": float(best["output_tok_s"]), "baseline_output_tok_s": float(base.iloc[0])}
    )


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def trial_lines(frame: pd.DataFrame, metric: str, *, settings: list[str]) -> list[str]:
    """Live trials, best first: the trial's name and run, value, ratio, the other headline metric,
    settings, and a failure's class (wrapped at 80 columns, never cut)."""

    from bisect_eagle.report.study import trial_label

    if frame.empty or "stage" not in frame:
        return []
    live = frame[frame["stage"] == "live"].copy()
    if live.empty:
        return []
    if metric in live:
        live = live.sort_values(metric, ascending=False, na_position="last")
    other = "accept_length" if metric == "output_tok_s" else "output_tok_s"
    lines = [
        f"live trials ({len(live)}), best first:",
        f"{'trial':<8} {'run':<8} {metric[:13]:>13} {RATIO_HEADER:>10} {other[:13]:>13}  settings",
    ]
    ratio = f"{metric}_ratio_to_baseline"
    for _, r in live.iterrows():
        cells = (
            f"{trial_label(r):<8} {str(r['run_id'])[:8]:<8} {num(r.get(metric)):>13} "
            f"{num(r.get(ratio)):>10} {num(r.get(other)):>13}  "
        )
        failure = r.get("failure_class")
        state = f" FAILED: {failure}" if isinstance(failure, str) else ""
        state = state or ("" if r.get("outcome") == "ok" else f" ({r.get('outcome')})")
        lines += wrapped(cells + setting_text(r, settings) + state, indent=" " * len(cells))
    return lines


def split_lines(split: TrialSplit | None) -> list[str]:
    """The best live trial's throughput split (:mod:`bisect_eagle.report.split`): which side
    explains its gap to what the study needs, with the numbers; nothing without one."""
    if split is None:
        return []
    head = f"throughput split of {split.trial} (tok/s = accept length × verify cycles/s):"
    return [*wrapped(head), *wrapped("  " + split.split.sentence(), indent="    ")]


def model_lines(rep: Report, *, settings: list[str]) -> list[str]:
    """The throughput model: its error over the trials it predicted and the configs it skipped,
    SGLang's adaptive speculation against the best measured config (at the adaptive config's
    concurrency when ``model.json`` names it), and the best config per concurrency level."""
    from bisect_eagle.report.model import INTERVAL, best_measured

    view = rep.model
    lines = [line for note in view.notes for line in wrapped(note)]
    skipped = (
        ""
        if view.skipped is None
        else f"{plural(view.skipped, 'config')} skipped as predicted below the target"
    )
    if view.error is not None:
        e = view.error
        lines += wrapped(
            f"model: median error {100 * e.median_rel_error:.1f} % over {plural(e.n, 'trial')}, "
            f"{e.inside}/{e.n} inside the {INTERVAL} interval" + (f"; {skipped}" if skipped else "")
        )
    elif skipped:
        lines += wrapped(f"model: {skipped}")
    adaptive_params = ((view.artifact or {}).get("adaptive") or {}).get("params") or {}
    best = best_measured(rep.frame, concurrency=adaptive_params.get("concurrency"))
    lines += adaptive_text(view.adaptive, best=best)
    return lines + concurrency_lines(view.artifact, rep.frame, settings=settings)


def adaptive_text(adaptive: Adaptive | None, *, best: float | None) -> list[str]:
    """SGLang's ``--speculative-adaptive`` on the best config (predicted, and measured when a trial
    ran it), and whether the best measured config beats it (above its interval), loses (below) or
    cannot tell."""
    from bisect_eagle.report.model import INTERVAL

    if adaptive is None:
        return []
    lines = []
    if adaptive.predicted is not None:
        interval = (
            ""
            if adaptive.low is None or adaptive.high is None
            else f" ({INTERVAL} interval {num(adaptive.low)} to {num(adaptive.high)})"
        )
        text = (
            "SGLang adaptive (--speculative-adaptive) on the best config: predicted "
            f"{num(adaptive.predicted)} tok/s{interval}"
        )
        if best is not None and interval:
            text += f"; the best measured config ({num(best)}) " + (
                "beats it"
                if best > adaptive.high
                else "loses to it"
                if best < adaptive.low
                else "is inside that interval: no clear winner"
            )
        elif best is not None:
            text += (
                f"; the best measured config: {num(best)} ({best / adaptive.predicted:.2f}× the "
                "prediction)"
            )
        lines += wrapped(text)
    if adaptive.measured is not None:
        lines += wrapped(
            f"SGLang adaptive measured: {num(adaptive.measured)} tok/s (run "
            f"{adaptive.measured_run_id[:8]})"
        )
    return lines


def params_text(params: dict, names: list[str]) -> str:
    """A config's params as ``steps=3 topk=1``: the searched settings among them, else all."""
    shown = [n for n in names if n in params] or list(params)
    return " ".join(f"{SHORT.get(n, n.removeprefix('num_'))}={params[n]}" for n in shown)


def concurrency_lines(
    artifact: dict | None, frame: pd.DataFrame, *, settings: list[str]
) -> list[str]:
    """The model's best config per concurrency level (``model.json``) and, when concurrency was
    searched, the best measured trial per level."""
    from bisect_eagle.report.model import INTERVAL, measured_per_concurrency, per_concurrency

    lines = []
    predicted = per_concurrency(artifact)
    if predicted:
        lines.append("best config per concurrency (predicted by the model):")
    for r in predicted:
        interval = (
            f" ({INTERVAL}: {num(r.get('low'))} to {num(r.get('high'))})"
            if r.get("low") is not None
            else ""
        )
        value, base = r.get("predicted_output_tok_s"), r.get("baseline_predicted_output_tok_s")
        ratio = f", {times_baseline(value / base, base)}" if value and base else ""
        ran = (
            f"; measured in run {r['measured_run_id'][:8]}"
            if r.get("measured_run_id")
            else "; not measured"
        )
        lines += wrapped(
            f"  concurrency {r['concurrency']}: {num(value)} tok/s{interval}{ratio}; "
            f"{params_text(r.get('best_params') or {}, settings)}{ran}",
            indent="    ",
        )
    if any(not r.get("measured_run_id") for r in predicted):
        lines += wrapped(
            "  deploy a measured config (the best above: bisect-eagle export); a predicted one "
            "that was not measured is one to measure next (bisect-eagle live --set ...), not to "
            "deploy",
            indent="    ",
        )
    measured = measured_per_concurrency(frame)
    if not measured.empty:
        lines.append("best measured per concurrency:")
    for _, r in measured.iterrows():
        lines += wrapped(
            f"  concurrency {r['concurrency']}: {num(r['output_tok_s'])} tok/s, run "
            f"{str(r['run_id'])[:8]}; "
            f"{setting_text(r, [n for n in settings if n != 'concurrency'])}",
            indent="    ",
        )
    return lines


def model_json(view: ModelView) -> dict:
    """The model's side of the report for ``--json``: error, skipped count, adaptive reference,
    ``model.json`` and one record per predicted trial."""
    return {
        "error": None if view.error is None else asdict(view.error),
        "skipped": view.skipped,
        "adaptive": None if view.adaptive is None else asdict(view.adaptive),
        "artifact": view.artifact,
        "points": view.points.to_dict(orient="records"),
        "notes": view.notes,
    }


def report(
    spec: Path = typer.Argument(
        None, help="The study's spec YAML (default: the embedded tiny scenario spec)."
    ),
    study_name: str = typer.Option(None, help="Study to report (default: the spec's newest)."),
    tracking_uri: str = typer.Option(None, help=URI_HELP),
    out: Path = typer.Option(
        None, help="Folder for trials.csv, best.json and the PNGs (default: mlruns/reports/STUDY)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """State a study's verdict, its tok/s against the baseline and its best run; list its live
    trials; plot them."""
    with Activity() as activity:
        activity("loading the tool (MLflow, Optuna, pandas)")
        quiet_libraries()
        tracking, parent = open_study_run(
            spec, tracking_uri=tracking_uri, study_name=study_name, activity=activity
        )
        study = parent.data.tags.get("study", parent.info.run_name)
        folder = out or (None if tracking.read_only else Path.cwd() / "mlruns" / "reports" / study)
        activity(
            f"reading the runs of study {study!r}"
            + ("" if tracking.read_only else ", drawing its plots and logging them to its run")
        )
        from bisect_eagle.report.study import varying_settings, write_report

        rep = write_report(tracking, parent, out=folder)
        from bisect_eagle.report.split import best_split

        split = best_split(tracking, parent, rep.frame, rep.best, metric=rep.metric)
    best = None if rep.best is None else rep.best.dropna().to_dict()
    if as_json:
        print_json(
            {
                "study": study,
                "parent_run_id": parent.info.run_id,
                "metric": rep.metric,
                "best": best,
                "verdict": parent.data.tags.get("outcome"),
                "verdict_text": parent.data.tags.get("verdict"),
                "speed_text": parent.data.tags.get("speed") or speed_text(rep.best, rep.frame),
                "files": [str(f) for f in rep.files],
                "read_only": tracking.read_only,
                "model": model_json(rep.model),
                "split": None if split is None else split.to_json(),
                "trials": rep.frame.to_dict(orient="records"),
            }
        )
        return
    frame = rep.frame
    live_ok = (
        frame[(frame["stage"] == "live") & (frame["outcome"] == "ok")] if not frame.empty else frame
    )
    settings = (
        varying_settings(live_ok)
        if len(live_ok) > 1
        else [c for c in SETTING_COLUMNS if c in frame]
    )
    model = model_lines(rep, settings=settings)
    lines = [
        *summary_lines(parent, rep),
        *split_lines(split),
        "",
        *model,
        *([""] if model else []),
        *trial_lines(frame, rep.metric, settings=settings),
        "",
    ]
    if tracking.read_only:
        lines.append(
            f"the store {tracking.uri} is read-only here: nothing logged to it"
            + ("; --out DIR writes the trials table and the plots" if folder is None else "")
        )
    if folder is not None:
        logged = "" if tracking.read_only else " (also logged to the study's run, under report/)"
        lines += [f"wrote{logged}:", f"  {folder}/", *(f"    {f.name}" for f in rep.files)]
    for line in lines:
        print(line)


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to the command line.

    Args:
        app: the ``bisect-eagle`` application.
    """
    app.command("report")(report)
