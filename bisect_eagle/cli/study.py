"""What ``run`` and ``worker`` show of a study: the progress line while it runs, the outcome and the exit code."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as ProgressBar
from rich.table import Table

from bisect_eagle.cli.common import (
    RATIO_HEADER,
    load_spec_or_default,
    print_json,
    quiet_libraries,
    sigterm_as_exit,
    times_baseline,
    use_pythons,
)

if TYPE_CHECKING:
    from bisect_eagle.search.study import StudyOutcome, StudyProgress

EXIT_NOT_REACHED = 3


class Display:
    """A rich progress line on stderr: stage, live trial i of N, best against the target, elapsed, time left."""

    def __init__(self, enabled: bool):
        self.console = Console(stderr=True)
        self.enabled = enabled
        self.bar = ProgressBar(
            SpinnerColumn(), TextColumn("[bold]{task.fields[stage]:<10}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("live trials  best {task.fields[best]} / target {task.fields[target]}"),
            TimeElapsedColumn(), TextColumn("left {task.fields[left]}"), console=self.console,
        )
        self.task = self.bar.add_task("search", total=1, stage="start", best="-", target="-", left="-")

    def __enter__(self) -> Display:
        self.started = False  # the bar appears with the first event: an input refused before one prints one line
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started:
            self.bar.stop()

    def __call__(self, p: StudyProgress) -> None:
        if not self.enabled:
            return
        if not self.started:
            self.bar.start()
            self.started = True
        self.bar.console.print(f"[dim]{p.stage:<10}[/dim] {escape(p.message)}")
        left = max(0.0, p.max_wall_s - p.elapsed_s)
        self.bar.update(self.task, total=max(p.total, 1), completed=p.done, stage=p.stage,
                        best="-" if p.best is None else f"{p.best:.2f}",
                        target="-" if p.target is None else f"{p.target:.2f}", left=f"{left:.0f}s")


def print_outcome(out: StudyOutcome, console: Console) -> None:
    """Gate table, live trials, verdict, best config and where the runs are."""
    if out.gate:
        table = Table(title="stage 1: standalone accuracy per wiring")
        for col in ("wiring", "live ids", "accuracy", "sim. AL", "gate"):
            table.add_column(col, overflow="fold")
        for v in out.gate:
            table.add_row(escape(v["label"]), escape(",".join(str(i) for i in v["layer_ids"])), f"{v['accuracy']:.3f}",
                          f"{v['simulated_accept_length']:.2f}", "pass" if v["passed"] else "reject")
        console.print(table)
    live = [t for t in out.trials if t["value"] is not None or t["failure_class"]]
    if live:
        table = Table(title=f"stage 2: live trials ({out.metric})")
        for col in ("trial", "params", out.metric, RATIO_HEADER, "state", "run"):
            table.add_column(col, overflow="fold")
        for t in live:
            ratio = f"{t['value'] / out.baseline:.2f}" if t["value"] is not None and out.baseline else "-"
            value = f"{t['value']:.2f}" if t["value"] is not None else t["failure_class"] or "-"
            state = "duplicate" if t["duplicate"] else t["state"].lower()
            table.add_row(str(t["number"]), escape(_short(t["params"])), value, ratio, state, (t["run_id"] or "")[:8])
        console.print(table)
    if out.counts.get("skipped"):
        console.print(f"the throughput model skipped {out.counts['skipped']} proposed configs predicted below the "
                      "target (bisect-eagle report: predicted vs measured)", markup=False)
    if out.target_reached:
        console.print(f"[green]target reached[/green]: {escape(out.verdict)}")
    else:
        console.print(f"[red]target not reached[/red]: {escape(out.stop_reason)}; {escape(out.verdict)}")
    if out.baseline is not None:
        tok_s = f" ({out.baseline_output_tok_s:.1f} tok/s)" if out.baseline_output_tok_s else ""
        console.print(f"baseline {out.metric} {out.baseline:.2f}{tok_s}, target {out.target:.2f}")
    if out.best:
        b = out.best
        ratio = f" ({times_baseline(b['value'] / out.baseline)})" if out.baseline else ""
        tok_s = b["metrics"].get("output_tok_s")
        tok_ratio = b["metrics"].get("output_tok_s_ratio_to_baseline")
        extra = ""
        if tok_s and out.metric != "output_tok_s":
            extra = f", {tok_s:.1f} tok/s" + (f" ({times_baseline(tok_ratio)})" if tok_ratio else "")
        console.print(f"best: {out.metric} {b['value']:.2f}{ratio}{extra} (run {b['run_id']})")
        for key, value in sorted(b["params"].items()):
            if value not in ({}, None):
                console.print(f"  {key}: {value}", markup=False)
    console.print(f"runs: tracking URI {out.tracking_uri}, experiment {out.experiment_id}, "
                  f"parent run {out.parent_run_id} (study {out.study})")
    console.print("see them (the study's run is the answer; tables and plots: bisect-eagle report):", markup=False)
    console.print(f"  {ui_command(out.tracking_uri)}", markup=False, soft_wrap=True)


def ui_command(uri: str) -> str:
    """The shortest ``bisect-eagle ui`` command that opens ``uri`` from here (a default store needs no flag)."""
    from bisect_eagle.tracking.runs import default_tracking_uri, sqlite_path

    if uri == default_tracking_uri():
        return "bisect-eagle ui"
    db = sqlite_path(uri)
    if db is not None and db.is_relative_to(Path.cwd()):
        uri = f"sqlite:///{db.relative_to(Path.cwd())}"
    return f"bisect-eagle ui --tracking-uri {uri}"


def _short(params: dict[str, Any]) -> str:
    return " ".join(f"{k.replace('eagle_aux_hidden_state_layer_ids', 'ids')}={v}" for k, v in params.items())


def finish(out: StudyOutcome, as_json: bool) -> None:
    """Print a study's outcome (one JSON object, or the summary); exit 3 when the target was not reached."""
    if as_json:
        print_json(out.to_json())
    else:
        print_outcome(out, Console())
    if not out.target_reached:
        raise typer.Exit(EXIT_NOT_REACHED)


def study_command(*, spec: Path | None, storage: str | None, tracking_uri: str | None, sglang_python: str | None,
                  vllm_python: str | None, as_json: bool, join_wait_s: float | None = None, **options: Any) -> None:
    """The one body of ``run`` (a new or resumed study) and ``worker`` (joining one): exit 0 reached, 3 not.

    Args:
        spec: the spec file, or None for the embedded tiny scenario.
        storage: the Optuna storage URL, or None for the spec's (``sqlite:///mlruns/optuna.db``).
        tracking_uri: the MLflow tracking URI; None: ``$MLFLOW_TRACKING_URI``, else the spec's (``run``) or the
            one the joined study was created with (``worker``).
        sglang_python: an interpreter with SGLang, overriding ``engine.sglang.python``.
        vllm_python: an interpreter with vLLM, overriding ``engine.vllm.python``.
        as_json: print one JSON object at the end instead of progress and a summary.
        join_wait_s: join an existing study, waiting up to this long for it (``worker``); None starts one.
        options: further :class:`~bisect_eagle.search.study.Options` fields (``resume``, ``study_name``, ...).
    """
    import os

    from bisect_eagle.tracking.runs import resolve_tracking_uri
    from bisect_eagle.tracking.stores import check_stores

    quiet_libraries()
    sigterm_as_exit()
    s = load_spec_or_default(spec)
    use_pythons(s, sglang=sglang_python, vllm=vllm_python)
    if join_wait_s is None:
        tracking_uri = resolve_tracking_uri(tracking_uri, s.storage.tracking_uri)
    else:
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    # an unreachable store fails in seconds, before the heavy imports and the search
    check_stores(storage=storage or s.storage.optuna, tracking_uri=tracking_uri)

    from bisect_eagle.engines import make_engine
    from bisect_eagle.search.study import Options, join_study, resolve_storage, run_study
    from bisect_eagle.search.study.loop import BaselineFailed

    with Display(enabled=not as_json) as display:
        opts = Options(storage=resolve_storage(storage, s), tracking_uri=tracking_uri, progress=display, **options)
        try:
            if join_wait_s is None:
                out = run_study(s, options=opts, engine_factory=make_engine)
            else:
                out = join_study(s, options=opts, engine_factory=make_engine, wait_s=join_wait_s)
        except BaselineFailed as e:
            Console(stderr=True).print(f"[red]error[/red]: {escape(str(e))}")
            raise typer.Exit(EXIT_NOT_REACHED) from None
    finish(out, as_json)
