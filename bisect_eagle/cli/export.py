"""``bisect-eagle export [RUN_ID]``: the runnable SGLang launch command, its environment and the draft
``config.json`` patch of a logged trial (default: the best trial of the spec's newest study)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from bisect_eagle.cli.common import print_json
from bisect_eagle.cli.run import quiet_libraries


def export_plan(tracking, run, port: int) -> dict[str, Any]:
    """argv, environment and draft patch of a logged trial with its effective settings (what was measured)."""
    from bisect_eagle.engines.sglang_launch import draft_config_patch, launch_command
    from bisect_eagle.settings import apply_speculative_rules
    from bisect_eagle.trials import settings_of_run, spec_of_study

    settings, parent_id = settings_of_run(tracking, run)
    spec = spec_of_study(tracking, parent_id)
    effective, warnings = apply_speculative_rules(settings)
    draft = None if settings.is_baseline else Path(spec.draft)
    argv, env = launch_command(effective, spec.engine.sglang, Path(spec.target), draft, port)
    ids = effective.eagle_aux_hidden_state_layer_ids
    return {"run_id": run.info.run_id, "argv": argv, "command": shlex.join(argv), "env": env,
            "draft_config": None if draft is None else str(draft / "config.json"),
            "draft_config_patch": None if draft is None or ids is None else draft_config_patch(sorted(ids)),
            "warnings": warnings}


def export(
    run_id: str = typer.Argument(None, help="MLflow run id of a live trial (default: the best of the newest study)."),
    spec: Path = typer.Option(None, help="Spec whose newest study's best trial to export (default: the embedded "
                              "tiny scenario spec)."),
    study_name: str = typer.Option(None, help="Study whose best trial to export (default: the spec's newest)."),
    tracking_uri: str = typer.Option(None, help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else "
                                     "sqlite:///mlruns/mlflow.db)."),
    port: int = typer.Option(30000, min=1, max=65535, help="Port for the exported server."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Print what to run to serve a trial's config with SGLang: command, environment and draft config patch."""
    from bisect_eagle.errors import BadInput
    from bisect_eagle.report import best_row, trials_frame
    from bisect_eagle.tracking import Tracking, resolve_tracking_uri

    quiet_libraries()
    uri = resolve_tracking_uri(tracking_uri)
    if run_id is None:
        from bisect_eagle.cli.report import open_study_run

        tracking, parent = open_study_run(spec, tracking_uri, study_name)
        best = best_row(trials_frame(tracking, parent.info.run_id), parent.data.params.get("criterion.metric",
                                                                                           "output_tok_s"))
        if best is None:
            raise BadInput(f"study {parent.data.tags.get('study')!r} has no live trial that finished ok; "
                           "give a RUN_ID")
        run_id = str(best["run_id"])
        uri = tracking.uri
    tracking, run = Tracking.of_run(uri, run_id)
    plan = export_plan(tracking, run, port)
    if as_json:
        print_json(plan)
        return
    console = Console()
    console.print(f"# SGLang launch for trial {run_id}", markup=False)
    for key, value in sorted(plan["env"].items()):
        console.print(f"export {key}={shlex.quote(value)}", markup=False)
    console.print(plan["command"], markup=False, soft_wrap=True)
    if plan["draft_config_patch"] is not None:
        console.print(f"\n# merge into {plan['draft_config']} (or a copy of the draft directory; SGLang reads the "
                      "ids only from eagle_config):", markup=False)
        console.print(json.dumps(plan["draft_config_patch"], indent=2), markup=False)
    for w in plan["warnings"]:
        console.print(f"# note: {w}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("export")(export)
