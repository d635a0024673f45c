"""``bisect-eagle bisect``: which settings, changed from a good to a bad configuration, make it
fail.

Two answers, printed separately: every *breaking set* (changes that, applied to the good
configuration, break it), each with its probability and the probe that verified it, and the *repair
set* (changes that, reverted from the bad configuration, repair it); a change hidden at one end by
another setting says so ("hidden by"), and a repair that needs a masked change and its masker
together says so in one line. The last line names the experiment and the ``bisect-eagle ui`` command
that opens it.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from bisect_eagle.bisect.judge import MAX_LAUNCHES
from bisect_eagle.cli.common import URI_HELP, plural, print_json


def _value(v: object) -> str:
    return escape(str(v))


class _Status:
    """The bisect's progress on stderr: each event a line; on a terminal, below them, a status line
    with the latest event and the elapsed time (H:MM:SS, the clock of ``run``'s progress), redrawn
    every second, so a probe that measures for minutes is never silence."""

    def __init__(self, console: Console):
        self.console = console
        self.bar: Progress | None = None
        if console.is_terminal:
            self.bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}", style="dim"),
                TextColumn("elapsed"),
                TimeElapsedColumn(),
                console=console,
                refresh_per_second=2,
            )
            self.task = self.bar.add_task("bisect: reading the configurations", total=None)

    def __call__(self, message: str) -> None:
        if self.bar is None:
            self.console.print(escape(message), style="dim")
            return
        self.bar.console.print(escape(message), style="dim")
        width = max(20, self.console.width - 20)
        short = message if len(message) <= width else message[: width - 1] + "…"
        self.bar.update(self.task, description=escape(short))

    def __enter__(self) -> _Status:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def bisect(
    good: str = typer.Option(
        None,
        help="Good configuration: a spec file or the MLflow run id of a live trial (or a unique "
        "prefix of it, at least 6 characters).",
    ),
    bad: str = typer.Option(
        None,
        help="Bad configuration: a spec file or the MLflow run id of a live trial (or a unique "
        "prefix of it, at least 6 characters).",
    ),
    spec: Path = typer.Option(
        None,
        help="Spec for target, draft, prompts and engine (needed when both --good and --bad are "
        "run ids).",
    ),
    metric: str = typer.Option(
        None,
        help="output_tok_s, accept_length (live probes) or standalone_accuracy (wiring only); "
        "default: the spec's criterion metric.",
    ),
    ratio: float = typer.Option(
        0.9, help="A probe is good when metric >= ratio × the good configuration's."
    ),
    threshold: float = typer.Option(None, help="An absolute limit instead of --ratio."),
    confidence: float = typer.Option(
        0.95,
        help="1 - the chance of any false culprit in the whole bisect: each verdict is taken at "
        "level (1 - confidence) / --max-launches.",
    ),
    repeats: int = typer.Option(
        None,
        help="First samples of each endpoint (they estimate the noise; 1 turns noise handling "
        "off); default: max(3, the spec's search.repeats).",
    ),
    max_samples: int = typer.Option(
        8, help="Launch budget of one probe (an endpoint's is twice this)."
    ),
    max_launches: int = typer.Option(
        MAX_LAUNCHES,
        help="bisect.max_launches: the bisect's launch budget; it stops there, saying what is "
        "still unknown.",
    ),
    sides: bool = typer.Option(
        True,
        "--sides/--no-sides",
        help="Probe each breaking set once more with acceptance pinned to the good "
        "configuration's: does it act on acceptance or on cost (live metrics).",
    ),
    set_: list[str] = typer.Option(
        [],
        "--set",
        help="A setting forced in every probe, key=value (YAML value), repeatable: --set "
        "num_prompts=2.",
    ),
    log: Path = typer.Option(
        None, help="Write the bisect log here (default: mlruns/bisect/bisect-<time>.log)."
    ),
    replay: Path = typer.Option(
        None,
        help="Replay a bisect log (marks good/bad/skip may be edited); configurations not in it "
        "are probed.",
    ),
    tracking_uri: str = typer.Option(None, help=URI_HELP),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="Print one JSON object (breaking_sets, repair_set, sets with their probability, "
        "unknown, verification, changes with masked_by, interactions, probes, error_control, ...).",
    ),
) -> None:
    """Isolate the changes that break the good configuration and those whose reversal repairs the
    bad one."""
    from bisect_eagle.bisect.run import BisectOptions, run_bisect
    from bisect_eagle.cli.common import parse_set, sigterm_as_exit
    from bisect_eagle.cli.logs import quiet_libraries

    quiet_libraries()
    sigterm_as_exit()
    opts = BisectOptions(
        good=good,
        bad=bad,
        spec=spec,
        metric=metric,
        ratio=ratio,
        threshold=threshold,
        confidence=confidence,
        repeats=repeats,
        max_samples=max_samples,
        max_launches=max_launches,
        sides=sides,
        overrides=parse_set(set_),
        tracking_uri=tracking_uri,
        log_path=log,
        replay=replay,
    )
    with _Status(Console(stderr=True, highlight=False)) as status:  # stdout stays one object
        report = run_bisect(opts, progress=status)
    if as_json:
        print_json(report.to_json())
    else:
        _print(report)
    if report.status.value != "isolated":
        raise typer.Exit(1)


def _print(report) -> None:
    from bisect_eagle.cli.study import ui_command

    console = Console(highlight=False)
    n = len(report.changes)
    console.print(
        f"{plural(n, 'setting')} {'differs' if n == 1 else 'differ'} as the engine runs them: "
        f"{escape(report.good)} (good) vs {escape(report.bad)} (bad)"
    )
    table = Table(caption="breaks: in breaking set N (below); repair: in the repair set")
    table.add_column(
        "setting", no_wrap=True, min_width=max((len(c.name) for c in report.changes), default=7)
    )
    for col in ("good", "bad", "breaks", "repair"):  # a header never wraps inside a word
        table.add_column(col, overflow="fold", min_width=len(col))
    repair = set(report.repair or [])
    for c in report.changes:
        sets = ",".join(str(i) for i, b in enumerate(report.breaking, 1) if c.name in b)
        table.add_row(
            escape(c.name),
            _value(c.values("good")),
            _value(c.values("bad")),
            f"[red]{sets}[/red]" if sets else "",
            "[red]yes[/red]" if c.name in repair else "",
        )
    console.print(table)
    for c in report.changes:
        for side, by in c.masked_by.items():
            console.print(
                f"hidden: {escape(c.name)} is inert alone in the {side} configuration, masked "
                f"there by {escape(', '.join(by) or 'a combination of the others')}"
            )
    j, ec = report.judge, report.error_control
    limit = "-" if j["limit"] is None else f"{j['limit']:.4g}"
    of = (
        f"{j['ratio']:g} × the good configuration's"
        if j.get("threshold") is None
        else "the threshold"
    )
    noise = j["noise"]
    spread = (
        f"noise {100 * noise['sd_log']:.2f}% a launch over {noise['dof']} dof"
        if noise["dof"]
        else "no noise estimate: one launch each, the value decides"
    )
    console.print(
        f"judged by {j['metric']}, the geometric mean of each configuration's launches, against "
        f"the limit {limit} ({of}); {spread}"
    )
    if ec:
        console.print(
            f"error control: each verdict at level {ec['level']:.2g} = {ec['familywise']:g} / "
            f"{ec['looks']} looks ({ec['looks_used']} used): the chance of any false culprit is at "
            f"most {ec['familywise']:g}"
        )
    console.print(
        f"cost: {plural(len(report.probes), 'probe')}, {plural(report.live_trials, 'plan')} "
        f"measured ({report.launches} {report.launch_unit}) against about "
        f"{report.expected_launches} expected and a budget of {report.max_launches}; without "
        f"unresolved probes this search needs at most {report.probe_bound} probes"
    )
    if report.unresolved:
        console.print(f"unresolved probes (skipped): {escape(str(report.unresolved))}")
    for note in report.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    checks = {(v["check"], tuple(v["changes"])): v for v in report.verification}
    for i, s in enumerate(report.sets, 1):
        cause = s["changes"]
        console.print(
            "[bold red]breaks the good configuration when applied to it:[/bold red] "
            f"{escape(' + '.join(cause))} (set {i}, probability "
            f"{s['probability']:.3f}){_verified(checks.get(('breaking', tuple(cause))))}"
        )
        if s.get("side"):
            console.print(f"  acts on [bold]{s['side']}[/bold]: {escape(s['side_detail'])}")
    for u in report.unknown:
        console.print(
            "[yellow]not known:[/yellow] another breaking set may lie within "
            f"{escape(' + '.join(u))}"
        )
    if report.repair is not None:
        console.print(
            "[bold red]repairs the bad configuration when reverted from it:[/bold red] "
            f"{escape(' + '.join(report.repair))}"
            f"{_verified(checks.get(('repair', tuple(report.repair))))}"
        )
    for line in report.interactions:
        console.print(f"[bold yellow]interaction:[/bold yellow] {escape(line)}")
    if report.status.value != "isolated":
        console.print(f"[yellow]{report.status.value}[/yellow]")
    console.print(f"log (replay with --replay): {escape(report.log)}")
    console.print(
        f"MLflow: the bisect's run {report.parent_run_id}, its probes as child runs; open them "
        "with:"
    )
    console.print(
        f"experiment {escape(repr(report.experiment))}: {escape(ui_command(report.tracking_uri))}"
    )


def _verified(check: dict | None) -> str:
    """`` (verified: probe N measured BAD, 71.2)``: the probe that checked an answer."""
    if check is None:
        return " [yellow](not verified)[/yellow]"
    value = "" if check["value"] is None else f", {check['value']:.4g}"
    text = escape(f"probe {check['probe']} measured {check['outcome']}{value}")
    if check["ok"]:
        return f" (verified: {text})"
    return f" [yellow](NOT verified, expected {check['expected']}: {text})[/yellow]"


def register(app: typer.Typer) -> None:
    """Add the ``bisect`` command to the command line.

    Args:
        app: the ``bisect-eagle`` application.
    """
    app.command("bisect")(bisect)
