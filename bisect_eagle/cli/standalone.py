"""``bisect-eagle standalone``: accuracy of a draft on a hidden-state dump under one wiring rule."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from bisect_eagle.cli.common import print_json, resolve_paths


def standalone(
    scenario: str = typer.Option(
        None, help="Shipped scenario whose draft, dump and target to use (e.g. tiny)."
    ),
    draft: Path = typer.Option(
        None, help="EAGLE-3 draft directory (SpecForge/SGLang or speculators layout)."
    ),
    dump: Path = typer.Option(
        None, help="Hidden-state dump directory (speculators legacy or SpecForge)."
    ),
    target: Path = typer.Option(
        None, help="Target model directory (embedding, final norm, LM head)."
    ),
    rule: str = typer.Option(
        "[:-1]", help="Which dump tensors feed fc: [:-1], [1:], [0,1,2], [emb,0,1] ..."
    ),
    samples: int = typer.Option(0, help="Evaluate only the first N samples (0 = all)."),
    steps: int = typer.Option(3, help="Teacher-forced draft steps for per-position accuracy."),
    device: str = typer.Option("cpu", help="Torch device for the draft: cpu, cuda, cuda:N, mps."),
    skip_bad: bool = typer.Option(
        False,
        "--skip-bad",
        help="Skip bad dump samples (unreadable, malformed, NaN/inf, token ids outside the "
        "vocabulary) and count them.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Standalone accuracy of a draft on its training dump under a wiring rule (no server)."""
    from bisect_eagle.artifacts.devices import check_device
    from bisect_eagle.artifacts.draft import load_draft
    from bisect_eagle.artifacts.dumps import DumpReader
    from bisect_eagle.artifacts.target import TargetHead
    from bisect_eagle.artifacts.wiring import parse_rule
    from bisect_eagle.errors import BadInput
    from bisect_eagle.spec.checks import validate_data
    from bisect_eagle.trials.accuracy import evaluate

    if samples < 0:
        raise BadInput(f"--samples: expected a count >= 0 (0 = all), found {samples}")
    if steps < 1:
        raise BadInput(f"--steps: expected a number of draft steps >= 1, found {steps}")
    check_device(device, "--device")
    p = resolve_paths(scenario, draft=draft, dump=dump, target=target)
    try:
        parsed = parse_rule(rule)
    except BadInput as e:
        raise BadInput(f"--rule: {e}") from None
    validate_data(target=p["target"], draft=p["draft"], dump=p["dump"], skip_bad=skip_bad)
    loaded = load_draft(p["draft"], target=p["target"], device=device)
    head = TargetHead.load(p["target"])
    reader = DumpReader(p["dump"], skip_bad=skip_bad, vocab_size=head.vocab_size)
    result = evaluate(loaded, reader, head=head, rule=parsed, samples=samples or None, steps=steps)
    if as_json:
        print_json(result.to_json())
        return
    table = Table(
        title=f"standalone accuracy, rule {result.rule} -> dump states {result.selection}"
    )
    for col in ("step", "draft vocab", "full vocab", "tokens"):
        table.add_column(col, justify="right")
    for k, pos in enumerate(result.per_position):
        table.add_row(
            str(k), f"{pos['draft_vocab']:.2%}", f"{pos['full_vocab']:.2%}", str(pos["tokens"])
        )
    console = Console()
    console.print(table)
    console.print(
        f"samples {result.samples}, tokens {result.tokens}, simulated accept length "
        f"{result.simulated_accept_length:.2f} (+1 bonus token for SGLang's AL)"
    )
    if result.skipped_files:
        console.print(f"[yellow]skipped {len(result.skipped_files)} bad dump files[/yellow]")
    console.print(f"alignment: {result.alignment}", style="dim")


def register(app: typer.Typer) -> None:
    """Add the ``standalone`` command to the command line.

    Args:
        app: the ``bisect-eagle`` application.
    """
    app.command("standalone")(standalone)
