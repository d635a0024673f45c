"""``bisect-eagle reproduce RUN_ID``: run a logged trial again from its logged settings and compare metrics."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from bisect_eagle.cli.common import print_json
from bisect_eagle.cli.run import quiet_libraries, sigterm_as_exit


def compare(old: dict[str, float], new: dict[str, float]) -> list[dict[str, float | str | None]]:
    """Metrics both runs have, with the relative difference (new - old) / |old|."""
    rows = []
    for key in sorted(set(old) & set(new)):
        a, b = old[key], new[key]
        rows.append({"metric": key, "old": a, "new": b, "rel_diff": (b - a) / abs(a) if a else None})
    return rows


def reproduce(
    run_id: str = typer.Argument(..., help="MLflow run id of a live or baseline trial."),
    tracking_uri: str = typer.Option(None, help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else "
                                     "sqlite:///mlruns/mlflow.db)."),
    repeats: int = typer.Option(None, min=1, help="Measurements (median) instead of the study's search.repeats."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Re-run a logged trial from its logged settings and compare old and new metrics (secrets come from $ENV)."""
    from bisect_eagle.engines import make_engine
    from bisect_eagle.tracking import Tracking, resolve_tracking_uri
    from bisect_eagle.trials import TrialContext, run_live_trial, settings_of_run, spec_of_study

    quiet_libraries()
    sigterm_as_exit()
    tracking, run = Tracking.of_run(resolve_tracking_uri(tracking_uri), run_id)
    settings, parent_id = settings_of_run(tracking, run)
    spec = spec_of_study(tracking, parent_id)
    if repeats:
        spec.search.repeats = repeats
    parent = tracking.get_run(parent_id)
    with make_engine(spec) as engine:
        ctx = TrialContext(spec, tracking, parent.data.tags.get("study", ""), parent_id, engine=engine,
                           baseline=parent.data.metrics.get("baseline"), target=parent.data.metrics.get("target"),
                           baseline_tok_s=parent.data.metrics.get("baseline_output_tok_s"))
        record = run_live_trial(ctx, engine.plan(settings), stage="reproduce", parent_run_id=parent_id,
                                tags={"reproduces": run_id})
    rows = compare(dict(run.data.metrics), record.metrics)
    if as_json:
        print_json({"run_id": run_id, "new_run_id": record.run_id, "status": record.status,
                    "failure_class": record.failure_class, "metrics": rows})
        return
    table = Table(title=f"reproduce {run_id} -> {record.run_id} ({record.status})")
    for col in ("metric", "old", "new", "rel. diff"):
        table.add_column(col, justify="right")
    for r in rows:
        rel = "-" if r["rel_diff"] is None else f"{r['rel_diff']:+.1%}"
        table.add_row(str(r["metric"]), f"{r['old']:.4g}", f"{r['new']:.4g}", rel)
    Console().print(table)
    if record.failure_class:
        Console().print(f"failed ({record.failure_class}): {record.failure_detail}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("reproduce")(reproduce)
