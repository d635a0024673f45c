"""``bisect-eagle worker``: join a study that ``bisect-eagle run`` created, from another process or
node."""

from __future__ import annotations

from pathlib import Path

import typer

from bisect_eagle.cli.common import VLLM_PYTHON_HELP
from bisect_eagle.cli.study import study_command


def worker(
    spec: Path = typer.Argument(
        None, help="The study's spec YAML (default: the embedded tiny scenario spec)."
    ),
    storage: str = typer.Option(
        None, help="The study's Optuna storage URL (default sqlite:///mlruns/optuna.db)."
    ),
    tracking_uri: str = typer.Option(
        None,
        help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else the one the study was "
        "created with).",
    ),
    study_name: str = typer.Option(None, help="Study to join (default: the spec's latest)."),
    wait_s: float = typer.Option(
        1800,
        min=0,
        help="How long to wait for the study (its `run` may still be starting), its stage 1 and "
        "baseline.",
    ),
    sglang_python: str = typer.Option(
        None,
        "--sglang-python",
        help="Interpreter that has SGLang (its own environment); overrides engine.sglang.python.",
    ),
    vllm_python: str = typer.Option(None, "--vllm-python", help=VLLM_PYTHON_HELP),
    as_json: bool = typer.Option(
        False, "--json", help="Print only one JSON object at the end (no progress)."
    ),
) -> None:
    """Join a study's live search: shared budget and stop, never a config another worker ran (exit
    0/3)."""
    study_command(
        spec=spec,
        storage=storage,
        tracking_uri=tracking_uri,
        sglang_python=sglang_python,
        vllm_python=vllm_python,
        as_json=as_json,
        join_wait_s=wait_s,
        study_name=study_name,
    )


def register(app: typer.Typer) -> None:
    """Add the ``worker`` command to the command line.

    Args:
        app: the ``bisect-eagle`` application.
    """
    app.command("worker")(worker)
