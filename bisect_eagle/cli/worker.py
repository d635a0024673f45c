"""``bisect-eagle worker``: join a study that ``bisect-eagle run`` created, from another process or node."""

from __future__ import annotations

from pathlib import Path

import typer

from bisect_eagle.cli.common import load_spec_or_default, quiet_libraries, sigterm_as_exit
from bisect_eagle.cli.study import Display, finish


def worker(
    spec: Path = typer.Argument(None, help="The study's spec YAML (default: the embedded tiny scenario spec)."),
    storage: str = typer.Option(None, help="The study's Optuna storage URL (default sqlite:///mlruns/optuna.db)."),
    tracking_uri: str = typer.Option(None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else the "
                                     "one the study was created with)."),
    study_name: str = typer.Option(None, help="Study to join (default: the spec's latest)."),
    wait_s: float = typer.Option(1800, min=0, help="How long to wait for the study (its `run` may still be "
                                 "starting), its stage 1 and baseline."),
    sglang_python: str = typer.Option(None, "--sglang-python", help="Interpreter that has SGLang (its own "
                                      "environment); overrides engine.sglang.python."),
    as_json: bool = typer.Option(False, "--json", help="Print only one JSON object at the end (no progress)."),
) -> None:
    """Join a study's live search: shared budget and stop, never a config another worker ran (exit 0/3)."""
    import os

    from bisect_eagle.tracking.stores import check_stores

    quiet_libraries()
    sigterm_as_exit()
    s = load_spec_or_default(spec)
    if sglang_python:
        s.engine.sglang.python = sglang_python
    tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    check_stores(storage=storage or s.storage.optuna, tracking_uri=tracking_uri)  # seconds, before the heavy imports

    from bisect_eagle.engines import make_engine
    from bisect_eagle.search.study import Options, join_study, resolve_storage

    with Display(enabled=not as_json) as display:
        opts = Options(storage=resolve_storage(storage, s),
                       tracking_uri=tracking_uri,
                       study_name=study_name, progress=display)
        out = join_study(s, options=opts, engine_factory=make_engine, wait_s=wait_s)
    finish(out, as_json)


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)
