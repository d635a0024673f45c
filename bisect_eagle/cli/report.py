"""``bisect-eagle report``: a study's trials as a table, its best config, and plots (also logged to MLflow)."""

from __future__ import annotations

from pathlib import Path

import typer

from bisect_eagle.cli.common import print_json
from bisect_eagle.cli.run import load_spec_or_default, quiet_libraries

SHOWN = ("run_name", "stage", "status", "gate", "standalone_accuracy", "accept_length", "output_tok_s",
         "ratio_to_baseline", "output_tok_s_ratio_to_baseline", "failure_class")


def open_study_run(spec: Path | None, tracking_uri: str | None, study_name: str | None):
    """(tracking, parent run) of a spec's study (default: its newest)."""
    from bisect_eagle.report import find_parent
    from bisect_eagle.tracking import Tracking, resolve_tracking_uri

    s = load_spec_or_default(spec)
    tracking = Tracking.open(resolve_tracking_uri(tracking_uri, s.storage.tracking_uri), s.name)
    return tracking, find_parent(tracking, study_name)


def report(
    spec: Path = typer.Argument(None, help="The study's spec YAML (default: the embedded tiny scenario spec)."),
    study_name: str = typer.Option(None, help="Study to report (default: the spec's newest)."),
    tracking_uri: str = typer.Option(None, help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else "
                                     "sqlite:///mlruns/mlflow.db)."),
    out: Path = typer.Option(None, help="Folder for trials.csv, best.json and the PNGs "
                             "(default mlruns/reports/<study>)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Tabulate a study's trials, show the best config and plot accept length and tok/s per setting."""
    import pandas as pd

    from bisect_eagle.report import write_report

    quiet_libraries()
    tracking, parent = open_study_run(spec, tracking_uri, study_name)
    study = parent.data.tags.get("study", parent.info.run_name)
    folder = out or Path.cwd() / "mlruns" / "reports" / study
    rep = write_report(tracking, parent, folder)
    best = None if rep.best is None else rep.best.dropna().to_dict()
    if as_json:
        print_json({"study": study, "parent_run_id": parent.info.run_id, "metric": rep.metric, "best": best,
                    "files": [str(f) for f in rep.files], "trials": rep.frame.to_dict(orient="records")})
        return
    cols = [c for c in SHOWN if c in rep.frame.columns]
    settings = [c for c in ("eagle_aux_hidden_state_layer_ids", "num_steps", "topk", "num_draft_tokens")
                if c in rep.frame.columns]
    with pd.option_context("display.width", 400, "display.max_columns", 40, "display.max_rows", 1000,
                           "display.float_format", "{:.3f}".format):
        typer.echo(rep.frame[cols[:1] + settings + cols[1:]].fillna("").to_string(index=False))
    if best is not None:
        typer.echo(f"\nbest ({rep.metric}): run {best['run_id']}")
        shown = dict.fromkeys([*settings, rep.metric, "accept_length", "output_tok_s", "ratio_to_baseline",
                               "output_tok_s_ratio_to_baseline"])
        for key in shown:
            if key in best:
                typer.echo(f"  {key}: {best[key]}")
    else:
        typer.echo("\nno live trial finished ok")
    typer.echo(f"\nwrote {', '.join(str(f) for f in rep.files)} (also logged to run {parent.info.run_id} "
               "under report/)")


def register(app: typer.Typer) -> None:
    app.command("report")(report)
