"""``bisect-eagle live``: one live trial of the in-process engine (EAGLE-3 speculative or the target alone)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from bisect_eagle.cli.common import VLLM_PYTHON_HELP, parse_set, print_json, resolve_paths, use_pythons
from bisect_eagle.engines.base import TrialResult
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.errors import BadInput


def _print_result(result: TrialResult) -> None:
    console = Console()
    eff = result.effective
    title = (f"live trial ({result.engine}): {eff['speculative_algorithm']}, layer ids "
             f"{eff['eagle_aux_hidden_state_layer_ids']}, num_steps {eff['num_steps']}, "
             f"num_draft_tokens {eff['num_draft_tokens']}, topk {eff['topk']}")
    for w in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")
    if not result.ok:
        console.print(f"[red]failed ({result.failure_class}):[/red] {result.failure_detail}")
        return
    table = Table(title=title)
    for col in ("request", "prompt tokens", "completion tokens", "verify steps", "accept length", "latency s"):
        table.add_column(col, justify="right")
    for r in result.requests:
        table.add_row(r.id, str(r.prompt_tokens), str(r.completion_tokens), str(r.verify_steps),
                      f"{r.accept_length:.2f}", f"{r.latency_s:.3f}")
    console.print(table)
    rates = ", ".join(f"{x:.2f}" for x in result.accept_rate_per_position) or "-"
    console.print(f"output {result.output_tok_s:.1f} tok/s, accept length {result.accept_length:.2f}, "
                  f"accept rate per position [{rates}], histogram {result.accept_length_hist}")
    console.print(f"wall {result.wall_s:.2f} s, of which {result.model_s:.2f} s inside model forwards")


def _print_plan(plan: TrialPlan) -> None:
    """A plan for a terminal: the command to paste, its environment, what was checked, warnings."""
    out = [f"# engine {plan.engine}, fingerprint {plan.fingerprint}; checked by {plan.checked or 'its own rules'}"]
    if plan.refusal:
        out.append(f"# REFUSED: {plan.refusal}")
    out += [f"export {k}={shlex.quote(v)}" for k, v in sorted((plan.env or {}).items())]
    if plan.argv is not None:
        out.append(shlex.join(plan.argv))
    if plan.config_patch is not None:
        out.append(f"# the trial's draft copy gets config.json {json.dumps(plan.config_patch)}")
    out += [f"# effective {k} = {json.dumps(v)}" for k, v in plan.effective.items()]
    out += [f"# warning: {w}" for w in plan.warnings]
    typer.echo("\n".join(out))


def _engine_for(spec_path: Path | None, paths: dict[str, Path] | None, *, sglang_python: str | None,
                vllm_python: str | None,
                dry_run: bool) -> tuple:
    """(engine, fixed settings of the spec) for a spec file, or the local engine for plain paths.

    Every input is checked first (a dry run of an sglang spec may name paths of another machine).
    """
    from bisect_eagle.spec.checks import check_live_inputs

    if spec_path is None:
        from bisect_eagle.artifacts.prompts import check_prompts
        from bisect_eagle.engines.local import LocalEngine
        from bisect_eagle.spec.checks import validate_data

        validate_data(target=paths["target"], draft=paths["draft"])
        check_prompts(paths["prompts"], 1, what="one live trial")
        return LocalEngine(paths["target"], paths["draft"], paths["prompts"]), {}
    from bisect_eagle.engines import make_engine
    from bisect_eagle.spec.load import load_spec

    s = load_spec(spec_path)
    if not dry_run:
        check_live_inputs(s)
    use_pythons(s, sglang=sglang_python, vllm=vllm_python)
    return make_engine(s), dict(s.engine.settings)


def live(
    scenario: str = typer.Option(None, help="Shipped scenario whose target, draft and prompts to use (e.g. tiny)."),
    target: Path = typer.Option(None, help="Target model directory (Hugging Face causal LM)."),
    draft: Path = typer.Option(None, help="EAGLE-3 draft directory (SpecForge/SGLang or speculators layout)."),
    prompts: Path = typer.Option(None, help='Prompts JSONL: {"id": ..., "prompt": ...} or "messages" per line.'),
    set_: list[str] = typer.Option(
        [], "--set", help="A live setting as key=value (YAML value), repeatable: --set num_steps=4 "
        "--set eagle_aux_hidden_state_layer_ids=[5,9,11]."),
    baseline: bool = typer.Option(False, "--baseline", help="Run the target alone (no speculative decoding)."),
    spec: Path = typer.Option(None, "--spec", help="Experiment spec: its engine (local or sglang) and fixed settings."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the trial's plan (effective settings, "
                                 "fingerprint; for sglang the exact command and environment); run nothing, write "
                                 "nothing."),
    sglang_python: str = typer.Option(None, "--sglang-python", help="Interpreter that has SGLang (its own "
                                      "environment); overrides engine.sglang.python."),
    vllm_python: str = typer.Option(None, "--vllm-python", help=VLLM_PYTHON_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Run one live trial (in-process, or a spec's engine) and report tok/s, accept length and effective settings."""
    values = parse_set(set_)
    if baseline:
        if values.get("speculative_algorithm", "none") != "none":
            raise BadInput(f"--baseline conflicts with --set speculative_algorithm={values['speculative_algorithm']}")
        values["speculative_algorithm"] = "none"
    from bisect_eagle.artifacts.devices import check_device
    from bisect_eagle.spec.schema import settings_from, with_overrides

    if "device" in values and spec is None:  # the local engine runs here; a spec's engine refuses its own
        check_device(values["device"], "--set device")
    paths = None if spec is not None else resolve_paths(scenario, target=target, draft=draft, prompts=prompts)
    engine, fixed = _engine_for(spec, paths, sglang_python=sglang_python, vllm_python=vllm_python,
                                dry_run=dry_run)
    with engine:
        plan = engine.plan(settings_from(with_overrides(fixed, values), "--set"))
        if dry_run:
            if as_json:
                print_json({"plan": plan.to_json()})
            else:
                _print_plan(plan)
            if plan.refusal is not None:
                raise BadInput(plan.refusal)
            return
        if plan.refusal is not None:
            raise BadInput(plan.refusal)
        result = engine.run(plan)
    if as_json:
        print_json(result.to_json())
    else:
        _print_result(result)
    if not result.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("live")(live)
