"""``bisect-eagle export [RUN_ID]``: the runnable launch command (its engine's: SGLang, vLLM), its
environment and the draft ``config.json`` patch of a logged trial (default: the best trial of the
spec's newest study).

A trial that failed or was killed, or a plan the engine refuses, is not printed as a command to
deploy: exit 3 and the reason on stderr (``--force``: printed, marked, exit 0)."""

from __future__ import annotations

import json
import shlex
import textwrap
from pathlib import Path
from typing import Any

import typer

from bisect_eagle.cli.common import (
    URI_HELP,
    VLLM_PYTHON_HELP,
    Activity,
    print_json,
    require_store,
    use_pythons,
)
from bisect_eagle.cli.logs import quiet_libraries


def export_plan(
    tracking, run, *, port: int, sglang_python: str | None = None, vllm_python: str | None = None
) -> dict[str, Any]:
    """How to serve a logged live trial: its engine's export
    (:meth:`~bisect_eagle.engines.base.Engine.export`) of the settings it requested and the
    effective settings of its plan (what was measured), with its ``run_id``.

    Args:
        tracking: the run's store.
        run: the MLflow run of a live, baseline or reproduce trial.
        port: the exported server's port.
        sglang_python: an interpreter that has SGLang (its parser checks the command); default the
            spec's.
        vllm_python: an interpreter that has vLLM (likewise).

    Returns:
        ``run_id`` and the keys of the engine's export.

    Raises:
        BadInput: the run's settings or spec cannot be read back, or its engine cannot export it.
    """
    from bisect_eagle.engines import engine_class
    from bisect_eagle.trials.record import effective_of, settings_of_run, spec_of_study

    settings, parent_id = settings_of_run(tracking, run)
    spec = spec_of_study(tracking, parent_id)
    use_pythons(spec, sglang=sglang_python, vllm=vllm_python)
    out = engine_class(spec.engine.kind).export(
        spec, settings, effective=effective_of(tracking, run), port=port
    )
    return {"run_id": run.info.run_id, **out}


def export(
    run_id: str = typer.Argument(
        None,
        help="MLflow run id of a live trial, or any unique prefix of it (at least 6 characters); "
        "default: the best of the newest study.",
    ),
    spec: Path = typer.Option(
        None,
        help="Spec whose newest study's best trial to export (default: the embedded tiny scenario "
        "spec).",
    ),
    study_name: str = typer.Option(
        None, help="Study whose best trial to export (default: the spec's newest)."
    ),
    tracking_uri: str = typer.Option(None, help=URI_HELP),
    port: int = typer.Option(30000, min=1, max=65535, help="Port for the exported server."),
    sglang_python: str = typer.Option(
        None,
        "--sglang-python",
        help="Interpreter that has SGLang; its parser checks the exported command.",
    ),
    vllm_python: str = typer.Option(None, "--vllm-python", help=VLLM_PYTHON_HELP),
    force: bool = typer.Option(
        False,
        "--force",
        help="Print the command of a trial that failed or was killed, or of a plan its engine "
        "refuses (exit 0); marked as such.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Print what to run to serve a trial's config: command, environment and draft config patch
    (exit 3 when the trial failed or its engine refuses the plan, unless --force)."""
    with Activity() as activity:
        activity("loading the tool (MLflow)")
        quiet_libraries()
        plan, run_id, blocked = _plan(
            activity,
            run_id,
            spec=spec,
            study_name=study_name,
            tracking_uri=tracking_uri,
            port=port,
            sglang_python=sglang_python,
            vllm_python=vllm_python,
        )
    if as_json:
        print_json(plan)
    else:
        _print(plan, run_id, marked=blocked)
    if blocked and not force:
        typer.echo(
            f"error: {blocked[0]}; not a command to deploy (--force prints it as exit 0)", err=True
        )
        raise typer.Exit(3)


def _plan(
    activity: Activity,
    run_id: str | None,
    *,
    spec: Path | None,
    study_name: str | None,
    tracking_uri: str | None,
    port: int,
    sglang_python: str | None,
    vllm_python: str | None,
) -> tuple[dict[str, Any], str, list[str]]:
    """(export plan, the run's whole id, why it is not a command to deploy), each step said on
    ``activity``."""
    from bisect_eagle.errors import BadInput
    from bisect_eagle.tracking.redact import redact_url
    from bisect_eagle.tracking.uris import resolve_tracking_uri

    uri = resolve_tracking_uri(tracking_uri)
    if run_id is None:
        from bisect_eagle.cli.common import open_study_run

        tracking, parent = open_study_run(
            spec, tracking_uri=tracking_uri, study_name=study_name, activity=activity
        )
        activity(f"finding the best trial of study {parent.data.tags.get('study')!r}")
        from bisect_eagle.report.study import best_row, trials_frame

        best = best_row(
            trials_frame(tracking, parent.info.run_id),
            parent.data.params.get("criterion.metric", "output_tok_s"),
        )
        if best is None:
            raise BadInput(
                f"study {parent.data.tags.get('study')!r} has no live trial that finished ok; give "
                "a RUN_ID"
            )
        run_id = str(best["run_id"])
        uri = tracking.uri
    require_store(uri)
    activity(f"reading run {run_id[:8]} from {redact_url(uri)} (loading MLflow)")
    from bisect_eagle.tracking.runs import Tracking
    from bisect_eagle.trials.record import trial_failure

    tracking, run = Tracking.of_run(uri, run_id)
    run_id = run.info.run_id  # the whole id of a prefix
    activity.inputs_checked()
    activity(
        f"planning run {run_id[:8]}'s trial with its study's engine (its parser checks the command)"
    )
    failure = trial_failure(run)
    plan = export_plan(
        tracking, run, port=port, sglang_python=sglang_python, vllm_python=vllm_python
    )
    plan["trial_failure"] = failure
    blocked = [
        f"run {run_id[:8]}: {failure}" if failure else None,
        f"run {run_id[:8]}: the engine refuses this launch: {plan['refusal']}"
        if plan.get("refusal")
        else None,
    ]
    return plan, run_id, [b for b in blocked if b]


def _print(plan: dict[str, Any], run_id: str, *, marked: list[str]) -> None:
    for text in marked:
        comment(f"WARNING: {text}")
    comment(f"launch for trial {run_id[:8]}")
    comment(f"checked by: {plan['checked']}")
    comment("environment:" if plan["env"] else "environment: nothing beyond your own")
    for key, value in sorted(plan["env"].items()):
        shown = value if value.startswith("$") else shlex.quote(value)
        print(f"export {key}={shown}")
    comment("command (one line):")
    if plan.get("interpreter_note"):
        comment(plan["interpreter_note"])
    print(plan["command"])  # never wrapped: it is copied and pasted
    if plan["draft_config_patch"] is not None:
        print()
        comment(
            plan.get("draft_note")
            or f"merge into {plan['draft_config']} (or into a copy of the draft directory, where "
            "this engine reads the ids):"
        )
        print(json.dumps(plan["draft_config_patch"], indent=2))
    for w in plan["warnings"]:
        comment(f"note: {w}")


def comment(text: str) -> None:
    """``text`` as shell comment lines of at most 80 characters (every line starts with ``#``)."""
    for line in textwrap.wrap(text, 78, break_long_words=False, break_on_hyphens=False):
        print(f"# {line}")


def register(app: typer.Typer) -> None:
    """Add the ``export`` command to the command line.

    Args:
        app: the ``bisect-eagle`` application.
    """
    app.command("export")(export)
