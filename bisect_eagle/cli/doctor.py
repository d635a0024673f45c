"""``bisect-eagle doctor``: static checks of a spec before any GPU time; exit 1 when an error is found."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from bisect_eagle.cli.common import VLLM_PYTHON_HELP, plural, print_json, use_pythons

STYLE = {"error": "red", "warning": "yellow", "info": "cyan"}


def doctor(
    spec: Path = typer.Argument(..., help="Experiment spec (YAML)."),
    sglang_version: str = typer.Option(None, help="SGLang version the spec will run on (default: the installed "
                                                  "one); some layer ids break on some versions."),
    sglang_python: str = typer.Option(None, "--sglang-python", help="Interpreter that has SGLang (its own "
                                      "environment); overrides engine.sglang.python."),
    vllm_python: str = typer.Option(None, "--vllm-python", help=VLLM_PYTHON_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (ok, counts, findings)."),
) -> None:
    """Check a spec's draft, ids, wiring and speculative settings; exit 1 on any error, 2 on unreadable input."""
    from bisect_eagle.doctor import diagnose, summary
    from bisect_eagle.spec.checks import check_spec_inputs
    from bisect_eagle.spec.load import load_spec

    s = load_spec(spec, check_inputs=False)  # what the diagnosis explains is not refused before it
    use_pythons(s, sglang=sglang_python, vllm=vllm_python)  # the plan check then asks that engine
    findings = diagnose(s, sglang_version=sglang_version)
    report = summary(findings)
    if report["ok"]:
        check_spec_inputs(s)  # what no finding explains (a missing path, a bad dump) is still refused: exit 2
    if as_json:
        print_json({"spec": str(spec), **report})
    else:
        console = Console(highlight=False, soft_wrap=True)
        for f in findings:
            console.print(f"[{STYLE[f.severity]}]{f.severity}[/] {escape(f'[{f.code}] {f.where}: {f.message}')}")
            console.print(f"    fix: {escape(f.fix)}", style="dim")
        c = report["counts"]
        console.print(f"{spec}: {plural(c['error'], 'error')}, {plural(c['warning'], 'warning')}, "
                      f"{plural(c['info'], 'note')}")
    if not report["ok"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
