"""``bisect-eagle live``: one live trial of the in-process engine (EAGLE-3 speculative or the target
alone).

The trial is measured with the target alone beside it (``--compare``, the default): on the local
engine paired on the same prompts, interleaved per prompt
(:meth:`~bisect_eagle.engines.base.Engine.run_paired`), on a server engine as a second launch. The
result is one table per draft position with the baseline beside it, the tokens-per-step histogram,
and the requests. ``--pin-acceptance`` pins acceptance (an accept length, or one unconditional rate
per draft position): the trial then measures the cost side alone. What the command is doing is said
on stderr with the elapsed clock while it waits (:class:`~bisect_eagle.cli.common.Activity`).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from bisect_eagle.cli.common import (
    VLLM_PYTHON_HELP,
    Activity,
    num,
    parse_set,
    print_json,
    resolve_paths,
    times_baseline,
    use_pythons,
)
from bisect_eagle.engines.base import PairedResult, TrialResult
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY

PIN_HELP = (
    "Pin acceptance: an accept length (e.g. 3.0: drafts accepted so that each verify step emits 3 "
    "tokens on average) or one unconditional rate per draft position ([1, 0.8, 0.5]); the trial "
    "then measures cost alone. Same as --set pinned_acceptance=[...]."
)


def _title(result: TrialResult) -> str:
    eff = result.effective
    title = (
        f"live trial ({result.engine}): {eff['speculative_algorithm']}, layer ids {eff[IDS_KEY]}, "
        f"num_steps {eff['num_steps']}, num_draft_tokens {eff['num_draft_tokens']}, topk "
        f"{eff['topk']}"
    )
    if result.acceptance == "pinned":
        title += f", acceptance pinned {eff['pinned_acceptance']}"
    return title


def _ratio(value: float, base: float | None) -> str:
    if base is None or not base or value != value or base != base:
        return "-"
    return times_baseline(value / base)


def _print_result(
    result: TrialResult, baseline: TrialResult | None, paired: PairedResult | None
) -> None:
    """The trial: warnings, its requests, the per-position acceptance with the baseline beside it,
    the histogram."""
    console = Console()
    for w in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {w}")
    if not result.ok:
        console.print(f"[red]failed ({result.failure_class}):[/red] {result.failure_detail}")
        return
    requests = Table(title=_title(result))
    for col in (
        "request",
        "prompt tokens",
        "completion tokens",
        "verify steps",
        "accept length",
        "latency s",
    ):
        requests.add_column(col, justify="right")
    for r in result.requests:
        requests.add_row(
            r.id,
            str(r.prompt_tokens),
            str(r.completion_tokens),
            str(r.verify_steps),
            f"{r.accept_length:.2f}",
            f"{r.latency_s:.3f}",
        )
    console.print(requests)
    console.print(
        _acceptance_table(result, baseline if baseline is not None and baseline.ok else None)
    )
    if paired is not None:
        console.print(
            f"paired on the same prompts: {paired.speedup:.2f}× the baseline's tok/s "
            f"({paired.confidence:.0%} interval {paired.lower:.2f}–{paired.upper:.2f}×)"
        )
    elif baseline is not None and not baseline.ok:
        console.print(
            f"[yellow]the baseline failed ({baseline.failure_class}):[/yellow] "
            f"{baseline.failure_detail}"
        )
    steps = sum(result.accept_length_hist.values())
    if steps:
        hist = Table(title="verify steps by tokens emitted (accepted drafts + 1)")
        hist.add_column("tokens per step", justify="right")
        counts = [(k, result.accept_length_hist[k]) for k in sorted(result.accept_length_hist)]
        for k, _ in counts:
            hist.add_column(str(k), justify="right")
        hist.add_row("steps", *(str(c) for _, c in counts))
        hist.add_row("share", *(f"{c / steps:.0%}" for _, c in counts))
        console.print(hist)
    console.print(
        f"wall {result.wall_s:.2f} s, of which {result.model_s:.2f} s inside model forwards"
    )


def _acceptance_table(result: TrialResult, baseline: TrialResult | None) -> Table:
    """Throughput, accept length and each draft position's acceptance, the baseline (the target
    alone) beside."""
    table = Table(
        title="the trial beside the baseline (the target alone); a draft is accepted given the one "
        "before it was (and of all verify steps)"
    )
    for col, justify in (
        ("", "left"),
        ("this trial", "right"),
        ("baseline", "right"),
        ("× baseline", "right"),
    ):
        table.add_column(col, justify=justify)
    base_tok = baseline.output_tok_s if baseline is not None else None
    table.add_row(
        "output tok/s",
        num(result.output_tok_s),
        num(base_tok) if baseline is not None else "not measured",
        _ratio(result.output_tok_s, base_tok),
    )
    table.add_row(
        "accept length",
        num(result.accept_length),
        num(baseline.accept_length) if baseline is not None else "1",
        _ratio(result.accept_length, 1.0),
    )
    running = 1.0
    for k, rate in enumerate(result.accept_rate_per_position):
        running *= rate if rate == rate else 0.0
        table.add_row(
            f"draft {k + 1} given {k}" if k else "draft 1 accepted",
            f"{rate:.2f} ({running:.2f} of all)" if k else f"{rate:.2f}",
            "-",
            "",
        )
    return table


def _print_plan(plan: TrialPlan) -> None:
    """A plan for a terminal: the command to paste, its environment, what was checked, warnings."""
    out = [
        f"# engine {plan.engine}, fingerprint {plan.fingerprint}; checked by "
        f"{plan.checked or 'its own rules'}"
    ]
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


def _engine_for(
    spec_path: Path | None,
    paths: dict[str, Path] | None,
    *,
    sglang_python: str | None,
    vllm_python: str | None,
    dry_run: bool,
) -> tuple:
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
    scenario: str = typer.Option(
        None, help="Shipped scenario whose target, draft and prompts to use (e.g. tiny)."
    ),
    target: Path = typer.Option(None, help="Target model directory (Hugging Face causal LM)."),
    draft: Path = typer.Option(
        None, help="EAGLE-3 draft directory (SpecForge/SGLang or speculators layout)."
    ),
    prompts: Path = typer.Option(
        None, help='Prompts JSONL: {"id": ..., "prompt": ...} or "messages" per line.'
    ),
    set_: list[str] = typer.Option(
        [],
        "--set",
        help="A live setting as key=value (YAML value), repeatable: --set num_steps=4 --set "
        f"{IDS_KEY}=[5,9,11].",
    ),
    baseline: bool = typer.Option(
        False, "--baseline", help="Run the target alone (no speculative decoding)."
    ),
    spec: Path = typer.Option(
        None, "--spec", help="Experiment spec: its engine (local or sglang) and fixed settings."
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print the trial's plan (effective settings, fingerprint; for sglang the exact "
        "command and environment); run nothing, write nothing.",
    ),
    sglang_python: str = typer.Option(
        None,
        "--sglang-python",
        help="Interpreter that has SGLang (its own environment); overrides engine.sglang.python.",
    ),
    vllm_python: str = typer.Option(None, "--vllm-python", help=VLLM_PYTHON_HELP),
    pin_acceptance: str = typer.Option(None, "--pin-acceptance", help=PIN_HELP),
    compare: bool = typer.Option(
        True,
        "--compare/--no-compare",
        help="Measure the target alone beside the trial (the local engine: on the same prompts, "
        "interleaved; a server engine: a second launch).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Run one live trial (in-process, or a spec's engine) and report tok/s, accept length and
    effective settings."""
    with Activity() as activity:
        activity("reading the settings")
        values = parse_set(set_)
        if baseline:
            if values.get("speculative_algorithm", "none") != "none":
                raise BadInput(
                    "--baseline conflicts with --set "
                    f"speculative_algorithm={values['speculative_algorithm']}"
                )
            values["speculative_algorithm"] = "none"
        if pin_acceptance is not None and "pinned_acceptance" in values:
            raise BadInput(
                "--pin-acceptance and --set pinned_acceptance pin the same thing; give one"
            )
        from bisect_eagle.artifacts.devices import check_device
        from bisect_eagle.spec.schema import settings_from, with_overrides

        # the local engine runs here; a spec's engine refuses its own
        if "device" in values and spec is None:
            check_device(values["device"], "--set device")
        paths = (
            None
            if spec is not None
            else resolve_paths(scenario, target=target, draft=draft, prompts=prompts)
        )
        activity(
            "checking the target, the draft and the prompts (loading torch)"
            if spec is None
            else f"loading the spec {spec} and checking its inputs"
        )
        engine, fixed = _engine_for(
            spec, paths, sglang_python=sglang_python, vllm_python=vllm_python, dry_run=dry_run
        )
        with engine:
            activity(f"planning the trial with the {engine.name} engine")
            settings = settings_from(with_overrides(fixed, values), "--set")
            if pin_acceptance is not None:
                settings = settings_from(
                    {
                        **with_overrides(fixed, values),
                        "pinned_acceptance": _profile(pin_acceptance, settings.num_steps),
                    },
                    "--pin-acceptance",
                )
            plan = engine.plan(settings)
            if dry_run:
                activity.close()
                if as_json:
                    print_json({"plan": plan.to_json()})
                else:
                    _print_plan(plan)
                if plan.refusal is not None:
                    raise BadInput(plan.refusal)
                return
            if plan.refusal is not None:
                raise BadInput(plan.refusal)
            activity.inputs_checked()
            engine.progress = activity
            activity(f"running the trial on the {engine.name} engine")
            result, base, paired = _measure(
                engine, plan, compare=compare and not plan.is_baseline, activity=activity
            )
    if as_json:
        out = result.to_json()
        if base is not None:
            out["baseline"] = {
                k: v for k, v in base.to_json().items() if k not in ("artifacts", "requests")
            }
            out["output_tok_s_ratio_to_baseline"] = (
                result.output_tok_s / base.output_tok_s if base.ok and base.output_tok_s else None
            )
        if paired is not None:
            out["paired"] = paired.to_json()
        print_json(out)
    else:
        _print_result(result, base, paired)
    if not result.ok:
        raise typer.Exit(1)


def _profile(value: str, num_steps: int) -> list[float]:
    """``--pin-acceptance``'s value as a profile: an accept length (a number) or a list of rates."""
    import yaml

    from bisect_eagle.spec.settings import profile_for_accept_length

    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        parsed = None
    if isinstance(parsed, (int, float)) and not isinstance(parsed, bool):
        return profile_for_accept_length(float(parsed), num_steps)
    if isinstance(parsed, list):
        return parsed
    raise BadInput(
        f"--pin-acceptance {value!r}: expected an accept length (3.0) or one unconditional rate "
        "per draft position ([1, 0.8, 0.5])"
    )


def _measure(
    engine, plan: TrialPlan, *, compare: bool, activity: Activity
) -> tuple[TrialResult, TrialResult | None, PairedResult | None]:
    """(the trial, the baseline beside it or None, the paired comparison or None)."""
    if not compare:
        return engine.run(plan), None, None
    from bisect_eagle.spec.settings import LiveSettings

    asked = {
        k: v
        for k, v in plan.settings.model_dump(exclude_unset=True).items()
        if k != "pinned_acceptance"
    }
    base_plan = engine.plan(LiveSettings.model_validate({**asked, "speculative_algorithm": "none"}))
    if base_plan.refusal is not None:
        return engine.run(plan), None, None
    activity(f"measuring the trial and the baseline (the target alone) on the {engine.name} engine")
    paired = engine.run_paired(plan, base_plan)
    if paired is not None:
        return paired.candidate, paired.baseline, paired
    result = engine.run(plan)
    activity(f"measuring the baseline (the target alone) on the {engine.name} engine")
    return result, engine.run(base_plan), None


def register(app: typer.Typer) -> None:
    """Add the ``live`` command to the command line.

    Args:
        app: the ``bisect-eagle`` application.
    """
    app.command("live")(live)
