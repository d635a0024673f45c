"""``bisect-eagle export [RUN_ID]``: the runnable SGLang launch command, its environment and the draft
``config.json`` patch of a logged trial (default: the best trial of the spec's newest study)."""

from __future__ import annotations

import json
import shlex
import textwrap
from pathlib import Path
from typing import Any

import typer

from bisect_eagle.cli.common import URI_HELP, print_json, quiet_libraries


def export_plan(tracking, run, *, port: int, sglang_python: str | None = None) -> dict[str, Any]:
    """The sglang plan of a logged trial (what was measured), for serving it with SGLang: argv, env, draft patch.

    The argv is the one the installed SGLang accepts (flags adapted and checked by its own parser when it can
    run here), with the layer ids in their meaningful order; secret values are never printed (``$NAME``).
    """
    from bisect_eagle.engines.sglang import SglangEngine
    from bisect_eagle.spec.settings import apply_speculative_rules
    from bisect_eagle.trials.record import settings_of_run, spec_of_study

    settings, parent_id = settings_of_run(tracking, run)
    spec = spec_of_study(tracking, parent_id)
    server = spec.engine.sglang
    if sglang_python:
        server = server.model_copy(update={"python": sglang_python})
    explicit = settings.model_dump(exclude_unset=True)
    if spec.engine.kind == "local" and "dtype" not in settings.model_fields_set:
        explicit["dtype"] = settings.dtype  # the local trial ran in its dtype; say so rather than let SGLang pick
    if not settings.is_baseline:  # what was measured: the speculative rules applied (topk == 1 forces the count)
        explicit["num_draft_tokens"] = apply_speculative_rules(settings)[0].num_draft_tokens
    settings = settings.model_validate(explicit)
    engine = SglangEngine(server, target=Path(spec.target), draft=Path(spec.draft), prompts=None,
                          log_dir=Path(spec.draft).parent)
    with engine:
        plan = engine.planner.plan(settings, port=port, trial_dir=Path(spec.draft).parent / "trial")
    argv = list(plan.argv or [])
    if "--speculative-draft-model-path" in argv:
        argv[argv.index("--speculative-draft-model-path") + 1] = str(spec.draft)
    env = {k: (f"${k}" if v == "<redacted>" else v) for k, v in (plan.env or {}).items()}
    return {"run_id": run.info.run_id, "argv": argv, "command": shlex.join(argv), "env": env,
            "draft_config": None if settings.is_baseline else str(Path(spec.draft) / "config.json"),
            "draft_config_patch": plan.config_patch, "checked": plan.checked, "refusal": plan.refusal,
            "fingerprint": plan.fingerprint, "warnings": list(plan.warnings)}


def export(
    run_id: str = typer.Argument(None, help="MLflow run id of a live trial (default: the best of the newest study)."),
    spec: Path = typer.Option(None, help="Spec whose newest study's best trial to export (default: the embedded "
                              "tiny scenario spec)."),
    study_name: str = typer.Option(None, help="Study whose best trial to export (default: the spec's newest)."),
    tracking_uri: str = typer.Option(None, help=URI_HELP),
    port: int = typer.Option(30000, min=1, max=65535, help="Port for the exported server."),
    sglang_python: str = typer.Option(None, "--sglang-python", help="Interpreter that has SGLang; its parser "
                                      "checks the exported command."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Print what to run to serve a trial's config with SGLang: command, environment and draft config patch."""
    from bisect_eagle.errors import BadInput
    from bisect_eagle.report.study import best_row, trials_frame
    from bisect_eagle.tracking.runs import Tracking, resolve_tracking_uri

    quiet_libraries()
    uri = resolve_tracking_uri(tracking_uri)
    if run_id is None:
        from bisect_eagle.cli.common import open_study_run

        tracking, parent = open_study_run(spec, tracking_uri=tracking_uri, study_name=study_name)
        best = best_row(trials_frame(tracking, parent.info.run_id), parent.data.params.get("criterion.metric",
                                                                                           "output_tok_s"))
        if best is None:
            raise BadInput(f"study {parent.data.tags.get('study')!r} has no live trial that finished ok; "
                           "give a RUN_ID")
        run_id = str(best["run_id"])
        uri = tracking.uri
    tracking, run = Tracking.of_run(uri, run_id)
    plan = export_plan(tracking, run, port=port, sglang_python=sglang_python)
    if as_json:
        print_json(plan)
        return
    comment(f"SGLang launch for trial {run_id}")
    comment(f"checked by: {plan['checked']}")
    comment("environment:" if plan["env"] else "environment: nothing beyond your own")
    for key, value in sorted(plan["env"].items()):
        shown = value if value.startswith("$") else shlex.quote(value)
        print(f"export {key}={shown}")
    comment("command (one line):")
    print(plan["command"])  # never wrapped: it is copied and pasted
    if plan["draft_config_patch"] is not None:
        print()
        comment(f"merge into {plan['draft_config']} (or a copy of the draft directory; SGLang reads the ids only "
                "from eagle_config):")
        print(json.dumps(plan["draft_config_patch"], indent=2))
    for w in plan["warnings"]:
        comment(f"note: {w}")


def comment(text: str) -> None:
    """``text`` as shell comment lines of at most 80 characters (every line starts with ``#``)."""
    for line in textwrap.wrap(text, 78, break_long_words=False, break_on_hyphens=False):
        print(f"# {line}")


def register(app: typer.Typer) -> None:
    app.command("export")(export)
