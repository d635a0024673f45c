"""``bisect-eagle reproduce RUN_ID``: measure a logged trial again, beside a fresh baseline, and say
whether it reproduced: its ratio to the new baseline against the ratio it was logged with, within
``--tolerance``.

Its runs go to the experiment ``<spec name> / reproduce`` (apart from the search's trials): a parent
run whose description holds the verdict, and two children (the fresh baseline, the trial measured
again).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import typer

from bisect_eagle.cli.common import (
    URI_HELP,
    Activity,
    num,
    print_json,
    require_store,
    sigterm_as_exit,
    times_baseline,
)
from bisect_eagle.cli.logs import quiet_libraries


def compare(
    old: dict[str, float], new: dict[str, float], *, tolerance: float
) -> list[dict[str, float | str | bool | None]]:
    """Metrics both runs have, with the relative difference (new - old) / |old| and whether it is
    within ``tolerance`` (``within`` is None where the logged value is 0 and no relative difference
    exists)."""
    rows = []
    for key in sorted(set(old) & set(new)):
        a, b = old[key], new[key]
        rel = (b - a) / abs(a) if a else None
        rows.append(
            {
                "metric": key,
                "old": a,
                "new": b,
                "rel_diff": rel,
                "within": None if rel is None else abs(rel) <= tolerance,
            }
        )
    return rows


def changed_beyond(rows: list[dict[str, Any]], *, tolerance: float) -> str | None:
    """One line naming every metric that moved by more than ``tolerance`` (None when none did): the
    verdict is on the criterion's ratio, but a tok/s change beyond it is said, never passed over."""
    moved = [f"{r['metric']} {r['rel_diff']:+.1%}" for r in rows if r["within"] is False]
    if not moved:
        return None
    return f"changed by more than {100 * tolerance:g} %: " + ", ".join(moved)


def verdict(
    *, metric: str, old_ratio: float | None, new_ratio: float | None, tolerance: float
) -> dict[str, Any]:
    """Whether the trial's ratio to a fresh baseline matches the ratio it was logged with, within
    ``tolerance``.

    Args:
        metric: the metric's name, for the text.
        old_ratio: the logged ratio; None when missing.
        new_ratio: the fresh ratio; None when a trial failed.
        tolerance: the largest relative difference that reproduces (0.05 is 5 %).

    Returns:
        ``reproduced``, ``diff`` (relative, None without both ratios) and ``text``.
    """
    if old_ratio is None or new_ratio is None:
        return {
            "reproduced": False,
            "diff": None,
            "text": f"not reproduced: no {metric} ratio to compare (a trial or a baseline failed)",
        }
    diff = new_ratio / old_ratio - 1
    within = abs(diff) <= tolerance
    ratios = f"{metric} {times_baseline(new_ratio)} now, {times_baseline(old_ratio)} when logged"
    text = (
        f"reproduced within {100 * abs(diff):.1f} % ({ratios})"
        if within
        else f"not reproduced: off by {100 * diff:+.1f} %, more than {100 * tolerance:g} % "
        f"({ratios})"
    )
    return {"reproduced": within, "diff": diff, "text": text}


def reproduce(
    run_id: str = typer.Argument(
        ...,
        help="MLflow run id of a live trial, or any unique prefix of it (at least 6 characters, "
        "e.g. the 8 every table shows).",
    ),
    tracking_uri: str = typer.Option(None, help=URI_HELP),
    repeats: int = typer.Option(
        None, min=1, help="Measurements (median) instead of the study's search.repeats."
    ),
    tolerance: float = typer.Option(
        0.1,
        min=0,
        help="Largest relative difference of the ratio to the baseline that counts as reproduced.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Measure a logged trial again beside a fresh baseline; say whether its gain over the baseline
    reproduced."""
    with Activity() as activity, contextlib.ExitStack() as held:
        activity("loading the tool (MLflow)")
        quiet_libraries()
        sigterm_as_exit()
        run, tracking, parent, base, record, metric = _measure(
            activity, run_id, tracking_uri=tracking_uri, repeats=repeats, held=held
        )
        from bisect_eagle.tracking.runs import NOTE
        from bisect_eagle.trials.record import ratio_name

        activity("recording the verdict")
        run_id = run.info.run_id
        got = verdict(
            metric=metric,
            old_ratio=run.data.metrics.get(
                ratio_name(metric), run.data.metrics.get("ratio_to_baseline")
            ),
            new_ratio=record.metrics.get(ratio_name(metric)),
            tolerance=tolerance,
        )
        tracking.log(
            parent,
            metrics={"ratio_diff": got["diff"]} if got["diff"] is not None else {},
            tags={
                "outcome": "reproduced" if got["reproduced"] else "not reproduced",
                NOTE: got["text"],
            },
        )
        tracking.finish(parent, "FINISHED")
    rows = compare(dict(run.data.metrics), record.metrics, tolerance=tolerance)
    moved = changed_beyond(rows, tolerance=tolerance)
    if as_json:
        print_json(
            {
                "run_id": run_id,
                "new_run_id": record.run_id,
                "baseline_run_id": base.run_id,
                "status": record.status,
                "failure_class": record.failure_class,
                "verdict": got,
                "tolerance": tolerance,
                "metrics": rows,
                "changed_beyond_tolerance": moved,
            }
        )
        return
    print(
        f"{'metric':<34} {'logged':>10} {'now':>10} {'diff':>8} {'±' + format(tolerance, '.0%'):>9}"
    )
    for r in rows:
        rel = "-" if r["rel_diff"] is None else f"{r['rel_diff']:+.1%}"
        said = {True: "within", False: "BEYOND", None: "-"}[r["within"]]
        print(f"{r['metric']!s:<34} {num(r['old']):>10} {num(r['new']):>10} {rel:>8} {said:>9}")
    if record.failure_class:
        print(f"failed ({record.failure_class}): {record.failure_detail}")
    print(got["text"])
    if moved:
        print(moved)
    print(f"runs: {tracking.experiment_name()!r}, run {parent[:8]}")


def _measure(
    activity: Activity,
    run_id: str,
    *,
    tracking_uri: str | None,
    repeats: int | None,
    held: contextlib.ExitStack,
):
    """Measure a fresh baseline and the logged trial again, as children of a new reproduce run, each
    step said on ``activity``: (the logged run, the reproduce experiment's tracking, its parent run
    id, the baseline's record, the trial's new record, the criterion metric). Once the inputs are
    checked, the store is held on ``held`` (:func:`~bisect_eagle.tracking.stores.store_lock`: one
    measuring command per local store), and the runs a killed reproduce left RUNNING are ended
    KILLED."""
    from bisect_eagle.search.study.parent import resolved_spec
    from bisect_eagle.tracking.runs import Tracking
    from bisect_eagle.tracking.stores import store_lock
    from bisect_eagle.tracking.uris import resolve_tracking_uri
    from bisect_eagle.trials.context import TrialContext
    from bisect_eagle.trials.record import deployment_tags, settings_of_run, spec_of_study

    uri = resolve_tracking_uri(tracking_uri)
    require_store(uri)
    activity(f"reading run {run_id[:8]} and its study's spec")
    store, run = Tracking.of_run(uri, run_id)
    run_id = run.info.run_id  # the whole id of a prefix
    settings, parent_id = settings_of_run(store, run)
    spec = spec_of_study(store, parent_id)
    if repeats:
        spec.search.repeats = repeats
    activity.inputs_checked()
    held.enter_context(store_lock(store.uri))
    activity(f"starting the {spec.engine.kind} engine (loading torch)")
    from bisect_eagle.engines import make_engine
    from bisect_eagle.trials.live import run_live_trial

    tracking = Tracking.open(
        store.uri,
        f"{spec.name} / reproduce",
        description=(
            f"bisect-eagle reproduce: trials of spec {spec.name!r} measured again beside a fresh "
            "baseline."
        ),
    )
    tracking.end_orphans(detail="the reproduce running this was killed (its process is gone)")
    parent = tracking.start_run(
        f"reproduce {run.info.run_name}",
        tags={"role": "reproduce", "reproduces": run_id, **deployment_tags(spec)},
    )
    tracking.log_texts(parent, {"spec.resolved.json": json.dumps(resolved_spec(spec), indent=2)})
    with tracking.run_guard(parent), make_engine(spec) as engine:
        ctx = TrialContext(spec, tracking, f"reproduce-{parent[:8]}", parent, engine=engine)
        n = spec.search.repeats
        activity(f"1/2 measuring a fresh baseline (no speculation, {n} run{'s' if n != 1 else ''})")
        base_settings = spec.fixed_settings().model_copy(update={"speculative_algorithm": "none"})
        base = run_live_trial(
            ctx, engine.plan(base_settings), stage="baseline", parent_run_id=parent
        )
        if base.status == "ok":
            ctx.baseline, ctx.baseline_tok_s = (
                base.metrics[spec.criterion.metric],
                base.metrics["output_tok_s"],
            )
        activity(f"2/2 measuring run {run_id[:8]} again ({run.info.run_name})")
        record = run_live_trial(
            ctx,
            engine.plan(settings),
            stage="reproduce",
            parent_run_id=parent,
            tags={"reproduces": run_id},
        )
    return run, tracking, parent, base, record, spec.criterion.metric


def register(app: typer.Typer) -> None:
    """Add the ``reproduce`` command to the command line.

    Args:
        app: the ``bisect-eagle`` application.
    """
    app.command("reproduce")(reproduce)
