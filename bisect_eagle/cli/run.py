"""``bisect-eagle run``: the staged search of a spec (default: the embedded tiny scenario), logged to MLflow.

Exit 0 when the target was reached and confirmed, 3 when not (or when the baseline trial failed: one line says
why, and the study's parent run ends FAILED with the failure class). Every ratio printed names the metric it
divides (``accept_length ÷ baseline``, ``tok/s ÷ baseline``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from bisect_eagle.cli.common import load_spec_or_default, quiet_libraries, sigterm_as_exit
from bisect_eagle.cli.study import EXIT_NOT_REACHED, Display, finish

if TYPE_CHECKING:
    pass



def run(
    spec: Path = typer.Argument(None, help="Experiment spec YAML (default: the embedded tiny scenario spec)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the spec's latest study (or --study-name) "
                                "after the process was killed; finished trials are not repeated."),
    storage: str = typer.Option(None, help="Optuna storage URL (default sqlite:///mlruns/optuna.db; "
                                "postgresql://... for several nodes)."),
    tracking_uri: str = typer.Option(None, help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else "
                                     "sqlite:///mlruns/mlflow.db)."),
    study_name: str = typer.Option(None, help="Study name (default: the spec's name and the start time)."),
    max_live_trials: int = typer.Option(None, min=1, help="Override search.max_live_trials."),
    max_wall_s: float = typer.Option(None, min=1, help="Override search.max_wall_s."),
    sglang_python: str = typer.Option(None, "--sglang-python", help="Interpreter that has SGLang (its own "
                                      "environment); overrides engine.sglang.python."),
    as_json: bool = typer.Option(False, "--json", help="Print only one JSON object at the end (no progress)."),
) -> None:
    """Gate wirings by standalone accuracy, then search live settings to the target (exit 0 reached, 3 not)."""
    from bisect_eagle.engines import make_engine
    from bisect_eagle.search.study import Options, resolve_storage, run_study
    from bisect_eagle.search.study.loop import BaselineFailed
    from bisect_eagle.tracking.runs import resolve_tracking_uri

    quiet_libraries()
    sigterm_as_exit()
    s = load_spec_or_default(spec)
    if sglang_python:
        s.engine.sglang.python = sglang_python
    from bisect_eagle.tracking.stores import check_stores

    check_stores(storage=storage or s.storage.optuna,  # an unreachable store fails in seconds, before the search
                 tracking_uri=resolve_tracking_uri(tracking_uri, s.storage.tracking_uri))
    with Display(enabled=not as_json) as display:
        opts = Options(storage=resolve_storage(storage, s),
                       tracking_uri=resolve_tracking_uri(tracking_uri, s.storage.tracking_uri),
                       study_name=study_name, resume=resume, max_live_trials=max_live_trials,
                       max_wall_s=max_wall_s, progress=display)
        try:
            out = run_study(s, options=opts, engine_factory=make_engine)
        except BaselineFailed as e:
            Console(stderr=True).print(f"[red]error[/red]: {escape(str(e))}")
            raise typer.Exit(EXIT_NOT_REACHED) from None
    finish(out, as_json)


def register(app: typer.Typer) -> None:
    app.command("run")(run)
