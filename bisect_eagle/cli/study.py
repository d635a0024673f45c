"""What ``run`` and ``worker`` show of a study: the progress line while it runs, the outcome and the
exit code."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, ProgressColumn, SpinnerColumn, Task, TextColumn
from rich.progress import Progress as ProgressBar
from rich.table import Column, Table
from rich.text import Text

from bisect_eagle.cli.common import (
    RATIO_HEADER,
    STARTED,
    Activity,
    clock,
    load_spec_or_default,
    plural,
    print_json,
    sigterm_as_exit,
    times_baseline,
    trial_ref,
    use_pythons,
)
from bisect_eagle.cli.logs import quiet_libraries
from bisect_eagle.keys import IDS_KEY

if TYPE_CHECKING:
    from bisect_eagle.search.study import StudyOutcome, StudyProgress

EXIT_NOT_REACHED = 3


LIVE_STAGES = ("live", "confirm")  # the stages whose bar counts live trials
SAVING = "saving the study's answer: its run's verdict and description, the report's plots"
WIRING_STEP = re.compile(r"^standalone (\d+)/(\d+)\b")  # stage 1's "standalone i/N: <wiring>"


class Eta:
    """The time a study has left, recomputed whenever asked (the display asks on every refresh), not
    only when an event arrives: an estimate, or nothing.

    While live trials run, once some were measured, it is the trials still allowed × the mean time
    of those measured so far, less the time the current one has run. Nothing is estimated in stage
    1, the baseline or confirmation, for a trial running past the mean, or when the estimate runs
    past the wall budget (the budget ends the study first: an estimate of it would only restate the
    budget).
    """

    def __init__(self) -> None:
        self.at: float | None = None  # monotonic time of the last event
        self.stage = ""
        self.elapsed_s = 0.0  # the study's elapsed time at that event
        self.max_wall_s = 0.0
        self.done, self.total = 0, 0
        # (study time, trials done) when live trials began
        self.live_since: tuple[float, int] | None = None
        self.last_done_s: float | None = None  # study time at which ``done`` last grew

    def update(self, p: StudyProgress, now: float) -> None:
        """Take one progress event, received at monotonic time ``now``.

        Args:
            p: the event.
            now: ``time.monotonic()`` when it came.
        """
        self.at, self.stage, self.elapsed_s, self.max_wall_s, self.total = (
            now,
            p.stage,
            p.elapsed_s,
            p.max_wall_s,
            p.total,
        )
        if self.live_since is None and p.stage == "live":
            self.live_since = (p.elapsed_s, p.done)
        if p.done > self.done and self.live_since is not None:
            self.last_done_s = p.elapsed_s
        self.done = p.done

    def elapsed(self, now: float) -> float:
        """The study's elapsed seconds at monotonic time ``now``.

        Args:
            now: ``time.monotonic()`` now.

        Returns:
            Seconds (0 before the first event).
        """
        return 0.0 if self.at is None else self.elapsed_s + (now - self.at)

    def left(self, now: float) -> float | None:
        """The estimated seconds the study goes on at ``now``; None when there is no estimate."""
        if (
            self.at is None
            or self.stage != "live"
            or self.live_since is None
            or self.last_done_s is None
            or self.done <= self.live_since[1]
        ):
            return None
        elapsed = self.elapsed(now)
        per_trial = (self.last_done_s - self.live_since[0]) / (self.done - self.live_since[1])
        estimate = max(0, self.total - self.done) * per_trial - (elapsed - self.last_done_s)
        return estimate if 0 < estimate < self.max_wall_s - elapsed else None


class _Times(ProgressColumn):
    """``0:01:05 ~0:12:30 left`` while an estimate exists, ``0:01:05`` otherwise; the command's
    elapsed clock, frozen when the study ends. Rendered at every refresh of the bar."""

    def __init__(self, display: Display) -> None:
        super().__init__(table_column=Column(no_wrap=True))
        self.display = display

    def render(self, task: Task) -> Text:
        d = self.display
        now = d.ended_at or time.monotonic()
        left = None if d.ended_at else d.eta.left(now)
        shown = clock(now - d.since) + ("" if left is None else f" ~{clock(left)} left")
        return Text(shown, style="progress.elapsed")


class Display:
    """``run``'s progress on stderr: one line of at most 80 columns (stage, a bar for what it
    counts: stage 1's wirings, then live trials, best against target, the command's elapsed clock
    and an estimate of the time left when there is one), redrawn twice a second, and one line per
    event with its clock.

    Before the first event, :class:`~bisect_eagle.cli.common.Activity` says what the command does
    (loading the tool, opening the stores, starting the study); the bar takes over at the first
    event. At the end (:meth:`finish`) the bar is full, the spinner stopped, the clock frozen and
    nothing is said to be left. Off a terminal only the event lines are written (with the activity's
    heartbeat during a long trial), and the bar once, at the end.
    """

    REFRESH_PER_SECOND = 2

    def __init__(
        self, enabled: bool, *, activity: Activity | None = None, since: float = STARTED
    ) -> None:
        self.console = Console(stderr=True)
        self.enabled = enabled
        self.activity = activity
        self.since = since
        self.ended_at: float | None = None
        self.eta = Eta()
        text = Column(no_wrap=True)
        self.bar = ProgressBar(
            SpinnerColumn(finished_text="✓", table_column=Column(no_wrap=True, width=1)),
            TextColumn("[bold]{task.fields[stage]}", table_column=Column(no_wrap=True)),
            BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=4)),
            TextColumn("{task.fields[count]}", table_column=text),
            TextColumn("{task.fields[best]}", table_column=Column(no_wrap=True)),
            _Times(self),
            console=self.console,
            refresh_per_second=self.REFRESH_PER_SECOND,
            expand=True,
        )
        self.task = self.bar.add_task("search", total=None, stage="start", count="", best="")

    def __enter__(self) -> Display:
        # the bar appears with the first event: an input refused before one prints one line
        self.started = False
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started:
            self.bar.stop()

    def __call__(self, p: StudyProgress) -> None:
        if not self.enabled:
            return
        if not self.started and self.activity is not None and self.console.is_terminal:
            self.activity.close()  # the bar's line replaces the activity's
        self.eta.update(p, time.monotonic())
        # done's message is why the study stopped, which the verdict sentence says once
        if p.stage != "done":
            text = escape(event_text(p.stage, p.message))
            self.bar.console.print(
                f"[dim]{clock(time.monotonic() - self.since)} {p.stage:<10}[/dim] {text}"
            )
        if self.activity is not None:  # off a terminal: a heartbeat while the event's work goes on
            said = p.stage != "done"
            self.activity(
                f"{p.stage} {event_text(p.stage, p.message)}" if said else SAVING, said=said
            )
        step = WIRING_STEP.match(p.message) if p.stage == "standalone" else None
        if p.stage == "done":  # the study's run and plots are being written: pulsing until finish()
            total, completed, count = None, 0, ""
        elif p.stage in LIVE_STAGES or p.done:
            total, completed, count = max(p.total, 1), p.done, f"{p.done}/{p.total} trials"
        elif step:
            i, n = int(step.group(1)), int(step.group(2))
            total, completed, count = n, i - 1, f"wiring {i}/{n}"
        # before live trials (plan, gate, baseline): a pulsing bar, no count of trials not yet begun
        else:
            total, completed, count = None, 0, ""
        stage = "saving" if p.stage == "done" else p.stage
        self._show(
            total=total,
            completed=completed,
            stage=stage,
            count=count,
            best=best_text(p.best, p.target),
        )
        if not self.started:  # the bar's first frame shows this event
            self.bar.start()
            self.started = True

    def finish(self, out: StudyOutcome) -> None:
        """The study ended: the bar full, the spinner stopped, the clock frozen, no time left.

        Args:
            out: the study's outcome (its live trial count and best value are shown).
        """
        if not (self.enabled and self.started):
            return
        self.ended_at = time.monotonic()
        done = out.counts.get("live_measured", 0)
        best = None if out.best is None else out.best["value"]
        self._show(
            total=1,
            completed=1,
            stage="done",
            count=plural(done, "trial"),
            best=best_text(best, out.target),
        )

    def _show(self, *, total: int | None, completed: int, **fields: str) -> None:
        # rich's update keeps a total: a new task pulses
        if total is None and self.bar.tasks[0].total is not None:
            self.bar.remove_task(self.task)
            self.task = self.bar.add_task("search", total=None, **fields)
        self.bar.update(self.task, total=total, completed=completed, **fields)
        if self.started:
            self.bar.refresh()  # the line agrees with the event just printed


def best_text(best: float | None, target: float | None) -> str:
    """``best 4.60 / target 4.50``, ``best 242.1 / target 135.0`` (``-`` for a value not known
    yet)."""
    from bisect_eagle.search.study.outcome import value_text

    return (
        f"best {'-' if best is None else value_text(best)} / target "
        f"{'-' if target is None else value_text(target)}"
    )


def event_text(stage: str, message: str) -> str:
    """An event's message as shown after its stage column: a leading repeat of the stage's name is
    dropped ("standalone 1/5: [:-1]" under ``standalone`` reads "1/5: [:-1]")."""
    head, _, rest = message.partition(" ")
    return rest if head == stage and rest else message


def print_outcome(out: StudyOutcome, console: Console) -> None:
    """Gate table, live trials, verdict, what it cost, best config and where the runs are."""
    from bisect_eagle.trials.launches import Launches
    from bisect_eagle.trials.record import trial_name

    if out.gate:
        table = Table(title="stage 1: standalone accuracy per wiring")
        for col in ("wiring", "live ids", "accuracy", "sim. AL", "gate"):
            table.add_column(col, overflow="fold")
        for v in out.gate:
            table.add_row(
                escape(v["label"]),
                escape(",".join(str(i) for i in v["layer_ids"])),
                f"{v['accuracy']:.3f}",
                f"{v['simulated_accept_length']:.2f}",
                "pass" if v["passed"] else "reject",
            )
        console.print(table)
    live = [t for t in out.trials if t["value"] is not None or t["failure_class"]]
    if live:
        table = Table(title=f"stage 2: live trials ({out.metric})")
        # the name and the run id's 8 characters, one line each
        table.add_column("trial (run)", no_wrap=True)
        for col in ("params", out.metric, RATIO_HEADER, "state"):
            table.add_column(col, overflow="fold")
        for t in live:
            ratio = (
                f"{t['value'] / out.baseline:.2f}"
                if t["value"] is not None and out.baseline
                else "-"
            )
            value = f"{t['value']:.2f}" if t["value"] is not None else t["failure_class"] or "-"
            state = "duplicate" if t["duplicate"] else t["state"].lower()
            table.add_row(
                f"{trial_name('live', number=t['number'])}\n{(t['run_id'] or '')[:8]}",
                escape(_short(t["params"], t.get("requested"))),
                value,
                ratio,
                state,
            )
        console.print(table)
    if out.counts.get("skipped"):
        console.print(
            f"the throughput model skipped {out.counts['skipped']} proposed configs predicted "
            "below the target (bisect-eagle report: predicted vs measured)",
            markup=False,
        )
    head, _, rest = out.verdict.partition(":")  # the verdict sentence, said once
    console.print(f"[{'green' if out.target_reached else 'red'}]{escape(head)}[/]:{escape(rest)}")
    if out.speed_text:
        console.print(out.speed_text, markup=False)
    if out.launches:
        live = out.counts.get("live_measured", 0)
        console.print(
            f"cost: {plural(live, 'live trial')}, {Launches.from_json(out.launches).summary()}",
            markup=False,
        )
    if out.best:
        b = out.best
        ratio = f" ({times_baseline(b['value'] / out.baseline)})" if out.baseline else ""
        console.print(f"best: {trial_ref(best_name(out), b['run_id'])}", markup=False)
        console.print(f"  {out.metric} {b['value']:.2f}{ratio}", markup=False)
        for key, value in sorted(b["params"].items()):
            if value not in ({}, None):
                console.print(f"  {key}: {value}", markup=False)
    console.print(
        f"runs: tracking URI {out.tracking_uri}, experiment {out.experiment_id}, parent run "
        f"{out.parent_run_id[:8]} (study {out.study})",
        markup=False,
    )
    console.print(
        "see them (the study's run is the answer; tables and plots: bisect-eagle report):",
        markup=False,
    )
    console.print(f"  {ui_command(out.tracking_uri)}", markup=False, soft_wrap=True)


def best_name(out: StudyOutcome) -> str | None:
    """The name of the Optuna trial that measured the best run (``live 003``); None when no trial
    did (the best is a config measured outside the search, the baseline's)."""
    from bisect_eagle.trials.record import trial_name

    number = next(
        (
            t["number"]
            for t in out.trials
            if t["run_id"] == out.best["run_id"] and not t["duplicate"]
        ),
        None,
    )
    return None if number is None else trial_name("live", number=number)


def ui_command(uri: str) -> str:
    """The shortest ``bisect-eagle ui`` command that opens ``uri`` from here (a default store needs
    no flag).

    Args:
        uri: the tracking URI.

    Returns:
        The command line (a SQLite path under the working directory made relative).
    """
    from bisect_eagle.tracking.uris import default_tracking_uri, sqlite_path

    if uri == default_tracking_uri():
        return "bisect-eagle ui"
    db = sqlite_path(uri)
    if db is not None and db.is_relative_to(Path.cwd()):
        uri = f"sqlite:///{db.relative_to(Path.cwd())}"
    return f"bisect-eagle ui --tracking-uri {uri}"


def _short(params: dict[str, Any], requested: dict[str, Any] | None = None) -> str:
    """``ids=[1, 5, 9] num_draft_tokens=4 (asked default)``: effective values, the request beside
    one that differs."""

    def one(k: str, v: Any) -> str:
        asked = (requested or {}).get(k, v)
        beside = "" if asked == v else f" (asked {'default' if asked is None else asked})"
        return f"{k.replace(IDS_KEY, 'ids')}={v}{beside}"

    return " ".join(one(k, v) for k, v in params.items())


def finish(out: StudyOutcome, as_json: bool) -> None:
    """Print a study's outcome (one JSON object, or the summary); exit 3 when the target was not
    reached.

    Args:
        out: the study's outcome.
        as_json: print one JSON object instead of the summary.

    Raises:
        typer.Exit: code 3 when the target was not reached.
    """
    if as_json:
        print_json(out.to_json())
    else:
        print_outcome(out, Console())
    if not out.target_reached:
        raise typer.Exit(EXIT_NOT_REACHED)


def dry_run_command(
    *, spec: Path | None, sglang_python: str | None, vllm_python: str | None, as_json: bool
) -> None:
    """``run --dry-run``: the study's plan (:func:`bisect_eagle.search.study.dryrun.plan_study`),
    printed; exit 0, or 2 when the engine refuses every config. No store is opened and nothing is
    written.

    Args:
        spec: the spec's path; None for the embedded default.
        sglang_python: ``--sglang-python``; None keeps the spec's.
        vllm_python: ``--vllm-python``; None keeps the spec's.
        as_json: print one JSON object instead of the text.

    Raises:
        BadInput: a bad spec, or the engine refuses every config of a listed space.
    """
    quiet_libraries()
    # the prompts are read at launch, which a dry run never reaches
    s = load_spec_or_default(spec, live=False)
    use_pythons(s, sglang=sglang_python, vllm=vllm_python)
    from bisect_eagle.engines import make_engine
    from bisect_eagle.search.study.dryrun import plan_study

    p = plan_study(s, engine_factory=make_engine)
    if as_json:
        print_json(p.to_json())
        return
    console = Console()

    def say(text: str) -> None:
        """Print one line as it is (no markup, no highlighting).

        Args:
            text: the line.
        """
        console.print(text, markup=False, highlight=False)

    say(f"dry run of spec {s.name!r} on the {p.engine} engine: nothing runs, nothing is written")
    if p.wirings:
        say(
            f"stage 1 scores {plural(len(p.wirings), 'wiring')} offline; the ids of those that "
            "pass are launched:"
        )
        for w in p.wirings:
            say(f"  {w}")
    if p.baseline is not None:
        state = (
            f"refused: {p.baseline['refusal']}"
            if p.baseline["refusal"]
            else f"checked by {p.baseline['checked']}"
        )
        say(f"baseline (no speculation): plan {p.baseline['fingerprint']}, {state}")
    else:
        say(f"baseline: {s.baseline:g} (given by the spec; no baseline trial)")
    space = (
        f"{p.configs} configs"
        if p.listed
        else f"a sample of {p.configs} configs (the space cannot be listed)"
    )
    say(f"live space: {space}; {p.launchable} would launch, {sum(p.refused.values())} refused")
    for what, n in p.checked.items():
        say(f"  {plural(n, 'plan')} checked by {what}")
    for reason, n in p.refused.items():
        say(f"  {n} refused: {reason}")
    b = p.budget
    launches = (
        f", at most {plural(b['max_launches'], 'launch', 'launches')}" if b["max_launches"] else ""
    )
    say(
        f"budget: at most {plural(b['max_live_trials'], 'live trial')}{launches}, "
        f"{clock(b['max_wall_s'])} of wall time"
    )


def study_command(
    *,
    spec: Path | None,
    storage: str | None,
    tracking_uri: str | None,
    sglang_python: str | None,
    vllm_python: str | None,
    as_json: bool,
    join_wait_s: float | None = None,
    **options: Any,
) -> None:
    """The one body of ``run`` (a new or resumed study) and ``worker`` (joining one): exit 0
    reached, 3 not.

    Args:
        spec: the spec file, or None for the embedded tiny scenario.
        storage: the Optuna storage URL, or None for the spec's (``sqlite:///mlruns/optuna.db``).
        tracking_uri: the MLflow tracking URI; None: ``$MLFLOW_TRACKING_URI``, else the spec's
            (``run``) or the one the joined study was created with (``worker``).
        sglang_python: an interpreter with SGLang, overriding ``engine.sglang.python``.
        vllm_python: an interpreter with vLLM, overriding ``engine.vllm.python``.
        as_json: print one JSON object at the end instead of progress and a summary.
        join_wait_s: join an existing study, waiting up to this long for it (``worker``); None
            starts one.
        options: further :class:`~bisect_eagle.search.study.Options` fields (``resume``,
            ``study_name``, ...).
    """
    with Activity(enabled=not as_json) as activity:
        out = _run(
            activity,
            spec=spec,
            storage=storage,
            tracking_uri=tracking_uri,
            sglang_python=sglang_python,
            vllm_python=vllm_python,
            as_json=as_json,
            join_wait_s=join_wait_s,
            **options,
        )
    finish(out, as_json)


def _run(
    activity: Activity,
    *,
    spec: Path | None,
    storage: str | None,
    tracking_uri: str | None,
    sglang_python: str | None,
    vllm_python: str | None,
    as_json: bool,
    join_wait_s: float | None,
    **options: Any,
) -> StudyOutcome:
    """:func:`study_command`'s study, each step before its first event said on ``activity``; its
    outcome."""
    import os

    activity(f"loading the spec {spec or '(the embedded tiny scenario)'} and checking its inputs")
    sigterm_as_exit()
    s = load_spec_or_default(spec)
    use_pythons(s, sglang=sglang_python, vllm=vllm_python)
    from bisect_eagle.tracking.stores import check_stores
    from bisect_eagle.tracking.uris import resolve_tracking_uri

    if join_wait_s is None:
        tracking_uri = resolve_tracking_uri(tracking_uri, s.storage.tracking_uri)
    else:
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    # an unreachable store fails in seconds, before the heavy imports and the search
    check_stores(storage=storage or s.storage.optuna, tracking_uri=tracking_uri)
    activity("loading the search and the engine (Optuna, MLflow, torch)")
    quiet_libraries()
    from bisect_eagle.engines import make_engine
    from bisect_eagle.search.study import Options, join_study, resolve_storage, run_study
    from bisect_eagle.search.study.loop import BaselineFailed

    activity(
        "joining the study (its stores, its parent run)"
        if join_wait_s is not None
        else "starting the study: its stores, its parent run, stage 1's target, draft and dump"
    )
    with Display(enabled=not as_json, activity=activity) as display:

        def progress(p: StudyProgress) -> None:
            """Show one progress event (the first also marks the inputs checked).

            Args:
                p: the event.
            """
            # the study's first event: its inputs, the space's refusals too, are checked
            activity.inputs_checked()
            display(p)

        opts = Options(
            storage=resolve_storage(storage, s),
            tracking_uri=tracking_uri,
            progress=progress,
            **options,
        )
        try:
            if join_wait_s is None:
                out = run_study(s, options=opts, engine_factory=make_engine)
            else:
                out = join_study(s, options=opts, engine_factory=make_engine, wait_s=join_wait_s)
        except BaselineFailed as e:
            activity.close()
            Console(stderr=True).print(f"[red]error[/red]: {escape(str(e))}")
            raise typer.Exit(EXIT_NOT_REACHED) from None
        display.finish(out)
    return out
