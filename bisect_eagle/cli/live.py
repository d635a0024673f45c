"""``bisect-eagle live``: one live trial of the in-process engine (EAGLE-3 speculative or the target alone)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

from bisect_eagle.cli.common import print_json, resolve_paths
from bisect_eagle.engines.base import Engine, TrialResult
from bisect_eagle.errors import BadInput
from bisect_eagle.settings import LiveSettings


def parse_set(items: list[str]) -> dict[str, Any]:
    """``key=value`` flags to a mapping; values are YAML scalars or lists (``[5,9,11]``, ``4``, ``bfloat16``)."""
    values: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"--set {item!r}: expected key=value, e.g. --set num_steps=4")
        try:
            values[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise BadInput(f"--set {item!r}: value is not a YAML scalar or list ({e.problem})") from None
    return values


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


def _run_planned(engine: Engine, settings: LiveSettings) -> TrialResult:
    """Plan, refuse with the engine's reason (exit 2), or run."""
    plan = engine.plan(settings)
    if plan.refusal is not None:
        raise BadInput(plan.refusal)
    return engine.run(plan)


def _run_spec(spec_path: Path, values: dict[str, Any], dry_run: bool, as_json: bool) -> TrialResult | None:
    """One trial of a spec's engine with its fixed settings and the ``--set`` overrides (None after a dry run)."""
    from bisect_eagle.engines import default_log_dir, make_engine
    from bisect_eagle.spec import load_spec, settings_from

    s = load_spec(spec_path)
    settings = settings_from({**s.engine.settings, **values}, "--set")
    if dry_run:
        if s.engine.kind != "sglang":
            raise BadInput(f"{spec_path}: --dry-run shows server launches; key 'engine.kind' is {s.engine.kind!r}")
        from bisect_eagle.engines.sglang import dry_run as plan_launches

        plan = plan_launches(s, [settings], default_log_dir(s))
        if as_json:
            print_json(plan.to_json())
        else:
            typer.echo(plan.text(), nl=False)
        return None
    with make_engine(s) as engine:
        return _run_planned(engine, settings)


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
    dry_run: bool = typer.Option(False, "--dry-run", help="sglang engine: print the exact server command and "
                                 "environment; launch nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Run one live trial (in-process, or a spec's engine) and report tok/s, accept length and effective settings."""
    values = parse_set(set_)
    if baseline:
        if values.get("speculative_algorithm", "none") != "none":
            raise BadInput(f"--baseline conflicts with --set speculative_algorithm={values['speculative_algorithm']}")
        values["speculative_algorithm"] = "none"
    if spec is not None:
        result = _run_spec(spec, values, dry_run, as_json)
        if result is None:
            return
    else:
        if dry_run:
            raise BadInput("--dry-run shows the server launches of a spec with engine.kind sglang; give --spec FILE")
        from bisect_eagle.engines.local import LocalEngine
        from bisect_eagle.spec import settings_from

        p = resolve_paths(scenario, target=target, draft=draft, prompts=prompts)
        settings = settings_from(values, "--set")
        with LocalEngine(p["target"], p["draft"], p["prompts"]) as engine:
            result = _run_planned(engine, settings)
    if as_json:
        print_json(result.to_json())
    else:
        _print_result(result)
    if not result.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("live")(live)
