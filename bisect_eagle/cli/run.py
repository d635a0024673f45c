"""``bisect-eagle run``: the staged search of a spec (default: the embedded tiny scenario), logged
to MLflow.

Exit 0 when the target was reached and confirmed, 3 when not (or when the baseline trial failed: one
line says why, and the study's parent run ends FAILED with the failure class). Every ratio to the
baseline is printed in one notation, after the metric it divides (``accept_length 4.62 (4.62×
baseline)``).
"""

from __future__ import annotations

from pathlib import Path

import typer

from bisect_eagle.cli.common import VLLM_PYTHON_HELP
from bisect_eagle.cli.study import dry_run_command, study_command


def run(
    spec: Path = typer.Argument(
        None, help="Experiment spec YAML (default: the embedded tiny scenario spec)."
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue the spec's latest study (or --study-name) after the process was killed; "
        "finished trials are not repeated.",
    ),
    storage: str = typer.Option(
        None,
        help="Optuna storage URL (default sqlite:///mlruns/optuna.db; postgresql://... for several "
        "nodes).",
    ),
    tracking_uri: str = typer.Option(
        None,
        help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db).",
    ),
    study_name: str = typer.Option(
        None, help="Study name (default: the spec's name and the start time)."
    ),
    max_live_trials: int = typer.Option(None, min=1, help="Override search.max_live_trials."),
    max_wall_s: float = typer.Option(None, min=1, help="Override search.max_wall_s."),
    sglang_python: str = typer.Option(
        None,
        "--sglang-python",
        help="Interpreter that has SGLang (its own environment); overrides engine.sglang.python.",
    ),
    vllm_python: str = typer.Option(None, "--vllm-python", help=VLLM_PYTHON_HELP),
    as_json: bool = typer.Option(
        False, "--json", help="Print only one JSON object at the end (no progress)."
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Plan every live config of the space with the engine and say what the study would "
        "launch, refuse (and why) and what checked the plans; run nothing, write nothing.",
    ),
) -> None:
    """Gate wirings by standalone accuracy, then search live settings to the target (exit 0 reached,
    3 not)."""
    if dry_run:
        dry_run_command(
            spec=spec, sglang_python=sglang_python, vllm_python=vllm_python, as_json=as_json
        )
        return
    study_command(
        spec=spec,
        storage=storage,
        tracking_uri=tracking_uri,
        sglang_python=sglang_python,
        vllm_python=vllm_python,
        as_json=as_json,
        study_name=study_name,
        resume=resume,
        max_live_trials=max_live_trials,
        max_wall_s=max_wall_s,
    )


def register(app: typer.Typer) -> None:
    """Add the ``run`` command to the command line.

    Args:
        app: the ``bisect-eagle`` application.
    """
    app.command("run")(run)
