"""``bisect-eagle bisect``: which settings, changed from a good to a bad configuration, make it fail."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bisect_eagle.cli.common import print_json


def _value(v: object) -> str:
    return escape(str(v))


def bisect(
    good: str = typer.Option(None, help="Good configuration: a spec file or the MLflow run id of a live trial."),
    bad: str = typer.Option(None, help="Bad configuration: a spec file or the MLflow run id of a live trial."),
    spec: Path = typer.Option(None, help="Spec for target, draft, prompts and engine (needed when both "
                                         "--good and --bad are run ids)."),
    metric: str = typer.Option(None, help="output_tok_s, accept_length (live probes) or standalone_accuracy "
                                          "(wiring only); default: the spec's criterion metric."),
    ratio: float = typer.Option(0.9, help="A probe is good when metric >= ratio × the good configuration's."),
    threshold: float = typer.Option(None, help="An absolute limit instead of --ratio."),
    noise_band: float = typer.Option(2.0, help="Probes within this many scaled MADs of the limit are "
                                               "unresolved (noise from --repeats)."),
    repeats: int = typer.Option(None, help="Measurements per probe (median, MAD); default: the spec's "
                                           "search.repeats."),
    set_: list[str] = typer.Option([], "--set", help="A setting forced in every probe, key=value (YAML value), "
                                                     "repeatable: --set num_prompts=2."),
    log: Path = typer.Option(None, help="Write the bisect log here (default: mlruns/bisect/bisect-<time>.log)."),
    replay: Path = typer.Option(None, help="Replay a bisect log (marks good/bad/skip may be edited); "
                                           "configurations not in it are probed."),
    tracking_uri: str = typer.Option(None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or "
                                                "sqlite:///mlruns/mlflow.db)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (culprits, probes, differences, "
                                                        "unresolved, ...)."),
) -> None:
    """Isolate the settings whose change from good to bad causes the failure (isolating delta debugging)."""
    from bisect_eagle.cli.live import parse_set
    from bisect_eagle.cli.run import quiet_libraries, sigterm_as_exit
    from bisect_eagle.search.bisect import BisectOptions, run_bisect

    quiet_libraries()
    sigterm_as_exit()
    opts = BisectOptions(good=good, bad=bad, spec=spec, metric=metric, ratio=ratio, threshold=threshold,
                         band=noise_band, repeats=repeats, overrides=parse_set(set_), tracking_uri=tracking_uri,
                         log_path=log, replay=replay)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    report = run_bisect(opts, progress=lambda m: err.print(escape(m), style="dim"))  # stdout stays one object
    if as_json:
        print_json(report.to_json())
    else:
        _print(report)
    if report.status != "isolated":
        raise typer.Exit(1)


def _print(report) -> None:
    console = Console(highlight=False, soft_wrap=True)
    table = Table(title=f"{len(report.differences)} settings differ: {report.good} (good) vs {report.bad} (bad)")
    for col in ("setting", "good", "bad", "culprit"):
        table.add_column(col)
    culprits = {c.name for c in report.culprits}
    for c in report.differences:
        table.add_row(escape(c.name), _value(c.values("good")), _value(c.values("bad")),
                      "[red]yes[/red]" if c.name in culprits else "")
    console.print(table)
    j = report.judge
    limit = "-" if j["limit"] is None else f"{j['limit']:.4g}"
    console.print(f"judged by {j['metric']} (limit {limit}, {j['repeats']} repeats, noise band {j['band']} "
                  f"MADs): {len(report.probes)} probes, {report.live_trials} measured, bound {report.probe_bound}")
    if report.unresolved:
        console.print(f"unresolved probes (skipped): {escape(str(report.unresolved))}")
    for note in report.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    if report.status == "isolated":
        for cause in report.causes:
            console.print(f"[bold red]culprit:[/bold red] {escape(' + '.join(cause))}")
    else:
        console.print(f"[yellow]{report.status}[/yellow]")
    console.print(f"log: {report.log} (replay with --replay); MLflow parent run {report.parent_run_id}")


def register(app: typer.Typer) -> None:
    app.command("bisect")(bisect)
