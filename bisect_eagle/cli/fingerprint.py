"""``bisect-eagle fingerprint``: which target layer each dumped (or server-captured) hidden state
came from."""

from __future__ import annotations

import textwrap
from pathlib import Path

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from bisect_eagle.cli.common import Activity, print_json, resolve_paths
from bisect_eagle.keys import IDS_KEY


def _id(value: int | None) -> str:
    return "-" if value is None else str(value)


def fingerprint(
    scenario: str = typer.Option(
        None, help="Shipped scenario whose target, dump and draft to use (e.g. tiny)."
    ),
    dump: Path = typer.Option(
        None, help="Hidden-state dump directory (speculators legacy or SpecForge)."
    ),
    target: Path = typer.Option(
        None, help="Target model directory (Hugging Face, run with transformers)."
    ),
    draft: Path = typer.Option(
        None, help="Draft directory: also recommend the rule that feeds it its layers."
    ),
    server: str = typer.Option(
        None,
        help="URL of a running capture-only server whose aux states to match too (POST /generate "
        "with return_hidden_states).",
    ),
    spec: Path = typer.Option(
        None,
        "--spec",
        help="sglang spec: start its capture-only server (SGLang's "
        "--enable-return-aux-hidden-states) and match what the target captures.",
    ),
    capture_ids: str = typer.Option(
        None,
        "--capture-ids",
        help="With --spec: ids for --return-aux-hidden-state-layer-ids, e.g. 3,31,59 (default: "
        "SGLang's own).",
    ),
    sglang_python: str = typer.Option(
        None, "--sglang-python", help="Interpreter that has SGLang (with --spec)."
    ),
    samples: int = typer.Option(4, help="Dump samples to run through the target."),
    as_json: bool = typer.Option(
        False, "--json", help="Print one JSON object (matches, recommended, notes)."
    ),
) -> None:
    """Match each dumped hidden state to the target layer it came from, and recommend ids and
    wiring."""
    from bisect_eagle.errors import BadInput

    if samples < 1:
        raise BadInput(f"--samples {samples}: expected at least 1")
    if server is not None and not server.startswith(("http://", "https://")):
        raise BadInput(f"--server {server!r}: expected an http:// or https:// URL")
    with Activity() as activity:
        activity("checking the target, the dump and the draft (loading torch)")
        from bisect_eagle.artifacts import scenarios
        from bisect_eagle.spec.checks import validate_data

        p = resolve_paths(scenario, dump=dump, target=target)
        validate_data(target=p["target"], dump=p["dump"], draft=draft)
        if draft is None and scenario:
            draft = scenarios.get(scenario).draft
        activity.inputs_checked()
        activity(f"loading the target {p['target']} and the dump {p['dump']}")
        from bisect_eagle.inspect.layermatch import load
        from bisect_eagle.inspect.layermatch import match_layers as match

        model, reader, loaded = load(p["target"], p["dump"], draft=draft)
        if spec is not None:
            activity(f"starting the capture-only server of {spec} and matching what it captures")
            result = _with_capture_server(
                spec,
                capture_ids,
                sglang_python,
                model=model,
                reader=reader,
                draft=loaded,
                samples=samples,
            )
        else:
            activity(
                f"running the target over {samples} dumped sample(s) to match every tensor to a "
                "layer"
            )
            result = match(model, reader, samples=samples, draft=loaded, server_url=server)
    if as_json:
        print_json(result.to_json())
        return
    n = result.num_layers
    table = Table(
        title=f"{reader.fmt} dump {p['dump']} vs a {n}-layer target ({result.samples} samples, "
        f"{result.tokens} tokens)"
    )
    for col in (
        "tensor",
        "matches",
        "SGLang id",
        "vLLM id",
        "SpecForge id",
        "cosine",
        "norm ratio",
        "rel. error",
        "runner-up (cosine, rel. error)",
        "separation",
        "first values (tensor / target)",
    ):
        table.add_column(
            col,
            justify="left" if col in ("tensor", "matches") or col.startswith("runner") else "right",
        )
    for m in result.matches:
        table.add_row(
            f"{m.source} {m.position} ({m.role})",
            m.label,
            _id(m.ids["sglang"]),
            _id(m.ids["vllm"]),
            _id(m.ids["specforge"]),
            f"{m.similarity:.5f}",
            f"{m.norm_ratio:.3f}",
            f"{m.error:.4f}",
            f"{m.runner_up} ({m.runner_up_similarity:.4f}, {m.runner_up_error:.4f})",
            f"{m.separation:.0f}×",
            f"{m.first_values} / {m.target_first_values}",
        )
    console = Console()
    if (
        Measurement.get(console, console.options.update(max_width=10_000), table).maximum
        <= console.width
    ):
        console.print(table)
    else:  # too wide for this terminal: one block per tensor, every value whole
        _print_blocks(console, title=str(table.title), result=result)
    rec = result.recommended
    console.print(
        f"recommended SGLang eagle_config.{IDS_KEY}: {rec[IDS_KEY]}  (hidden_states "
        f"{rec['hidden_states']})"
    )
    console.print(
        f"rule for the draft: {rec['rule'] if rec['rule'] is not None else 'none fits (see notes)'}"
    )
    for note in result.notes:
        console.print(f"[yellow]note:[/yellow] {note}")


def _print_blocks(console: Console, *, title: str, result) -> None:
    """The match table as one block of short lines per tensor, wrapped to the console's width
    (nothing cut)."""
    width = max(40, console.width)

    def say(text: str, indent: str = "") -> None:
        """Print ``text`` wrapped to the width, continuations indented two more spaces.

        Args:
            text: the text.
            indent: the prefix of the first line.
        """
        for line in textwrap.wrap(
            text, width=width, initial_indent=indent, subsequent_indent=indent + "  "
        ):
            console.print(line, markup=False, highlight=False, soft_wrap=True)

    say(title)
    for m in result.matches:
        console.print("")
        say(f"{m.source} {m.position} ({m.role}): {m.label}")
        say(
            f"ids: SGLang {_id(m.ids['sglang'])} · vLLM {_id(m.ids['vllm'])} · SpecForge "
            f"{_id(m.ids['specforge'])}",
            "  ",
        )
        say(
            f"cosine {m.similarity:.5f} · norm ratio {m.norm_ratio:.3f} · rel. error {m.error:.4f} "
            f"· separation {m.separation:.0f}×",
            "  ",
        )
        say(
            f"runner-up: {m.runner_up} (cosine {m.runner_up_similarity:.4f}, rel. error "
            f"{m.runner_up_error:.4f})",
            "  ",
        )
        say(f"first values: {m.first_values}", "  ")
        say(f"target's:     {m.target_first_values}", "  ")
    console.print("")


def _with_capture_server(
    spec_path: Path,
    capture_ids: str | None,
    sglang_python: str | None,
    *,
    model,
    reader,
    draft,
    samples: int,
):
    """Start the spec's capture-only server, match its captures with the dump's, stop it."""
    import tempfile

    from bisect_eagle.errors import BadInput
    from bisect_eagle.inspect.capture_server import capture_server
    from bisect_eagle.inspect.layermatch import match_layers
    from bisect_eagle.spec.load import load_spec

    s = load_spec(spec_path)
    if sglang_python:
        s.engine.sglang.python = sglang_python
    try:
        ids = (
            None
            if capture_ids is None
            else [int(i) for i in capture_ids.replace(" ", "").split(",")]
        )
    except ValueError:
        raise BadInput(
            f"--capture-ids {capture_ids!r}: expected integers separated by commas, e.g. 3,31,59"
        ) from None
    with (
        tempfile.TemporaryDirectory(prefix="bisect-eagle-capture-") as logs,
        capture_server(s, ids=ids, log_dir=Path(logs)) as url,
    ):
        return match_layers(model, reader, samples=samples, draft=draft, server_url=url)


def register(app: typer.Typer) -> None:
    """Add the ``fingerprint`` command to the command line.

    Args:
        app: the ``bisect-eagle`` application.
    """
    app.command("fingerprint")(fingerprint)
