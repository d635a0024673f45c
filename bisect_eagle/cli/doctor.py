"""``bisect-eagle doctor``: static checks of a spec before any GPU time; exit 1 when an error is
found. With ``--split``, also the throughput split of the spec's logged study: which side,
acceptance or cost, explains its best live trial's gap (:mod:`bisect_eagle.report.split`).

Every finding and its fix are wrapped to the terminal's width (``COLUMNS``; 80 when not a
terminal).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from bisect_eagle.cli.common import (
    URI_HELP,
    VLLM_PYTHON_HELP,
    open_study,
    plural,
    print_json,
    use_pythons,
)
from bisect_eagle.errors import BadInput

STYLE = {"error": "red", "warning": "yellow", "info": "cyan"}


def wrap(text: str, width: int, *, indent: str) -> list[str]:
    """``text`` as lines of at most ``width`` characters, continuations indented by ``indent``;
    words are kept whole unless one alone is wider than a line (a long path), which is then split,
    never cut.

    Args:
        text: the text to wrap.
        width: the line width (at least the indent plus 20 is used).
        indent: the prefix of every line but the first.

    Returns:
        The lines; ``[""]`` for an empty text.
    """
    return textwrap.wrap(
        text,
        max(width, len(indent) + 20),
        subsequent_indent=indent,
        break_on_hyphens=False,
        drop_whitespace=True,
    ) or [""]


def doctor(
    spec: Path = typer.Argument(..., help="Experiment spec (YAML)."),
    sglang_version: str = typer.Option(
        None,
        help="SGLang version the spec will run on (default: the installed one); some layer ids "
        "break on some versions.",
    ),
    sglang_python: str = typer.Option(
        None,
        "--sglang-python",
        help="Interpreter that has SGLang (its own environment); overrides engine.sglang.python.",
    ),
    vllm_python: str = typer.Option(None, "--vllm-python", help=VLLM_PYTHON_HELP),
    split: bool = typer.Option(
        False,
        "--split",
        help="Also say which side of the throughput, acceptance or cost, explains the gap of the "
        "best live trial of the spec's logged study.",
    ),
    study_name: str = typer.Option(None, help="With --split: the study (default: the newest)."),
    tracking_uri: str = typer.Option(None, help="With --split: " + URI_HELP),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object (ok, counts, findings)."
    ),
) -> None:
    """Check a spec's draft, ids, wiring and speculative settings; exit 1 on any error, 2 on
    unreadable input."""
    from bisect_eagle.doctor import by_severity, diagnose, split_finding, summary
    from bisect_eagle.spec.checks import check_spec_inputs
    from bisect_eagle.spec.load import load_spec

    if not split and (study_name or tracking_uri):
        raise BadInput(
            "--study-name and --tracking-uri name the study that --split reads: give --split too"
        )
    s = load_spec(spec, check_inputs=False)  # what the diagnosis explains is not refused before it
    measured, added = None, []
    if split:  # the study is read first: a missing store is refused before the diagnosis
        from bisect_eagle.report.split import study_split

        tracking, parent = open_study(s, tracking_uri=tracking_uri, study_name=study_name)
        study = parent.data.tags.get("study", parent.info.run_name)
        measured = study_split(tracking, parent)
        where = f"study {study}"
        if measured is not None:
            where += f", {measured.trial} (run {measured.run_id[:8]})"
        added.append(split_finding(None if measured is None else measured.split, where=where))
    use_pythons(s, sglang=sglang_python, vllm=vllm_python)  # the plan check then asks that engine
    findings = by_severity([*diagnose(s, sglang_version=sglang_version), *added])
    report = summary(findings)
    if report["ok"]:
        # what no finding explains (a missing path, a bad dump) is still refused: exit 2
        check_spec_inputs(s)
    if as_json:
        extra = {"split": None if measured is None else measured.to_json()} if split else {}
        print_json({"spec": str(spec), **report, **extra})
    else:
        console = Console(highlight=False)
        for f in findings:
            lines = wrap(
                f"{f.severity} [{f.code}] {f.where}: {f.message}", console.width, indent="    "
            )
            first = Text(lines[0])
            first.stylize(STYLE[f.severity], 0, len(f.severity))
            console.print(first, soft_wrap=True)
            for line in lines[1:]:
                console.print(line, markup=False, soft_wrap=True)
            for line in wrap(f"    fix: {f.fix}", console.width, indent=" " * 9):
                console.print(line, style="dim", markup=False, soft_wrap=True)
        c = report["counts"]
        for line in wrap(
            f"{spec}: {plural(c['error'], 'error')}, {plural(c['warning'], 'warning')}, "
            f"{plural(c['info'], 'note')}",
            console.width,
            indent="  ",
        ):
            console.print(line, markup=False, soft_wrap=True)
    if not report["ok"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the ``doctor`` command to the command line.

    Args:
        app: the ``bisect-eagle`` application.
    """
    app.command("doctor")(doctor)
