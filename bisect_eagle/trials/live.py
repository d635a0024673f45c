"""One trial as one path: the engine's plan -> cache lookup -> engine -> result -> one MLflow child run.

:func:`run_live_trial` is the one call: the caller (a study's loop, a bisect's prober, ``reproduce``) has the plan
(:meth:`TrialContext.plan <bisect_eagle.trials.context.TrialContext.plan>`) and takes its own decisions before it;
nothing here calls back up. Identity is the plan's fingerprint (:mod:`bisect_eagle.engines.plan`): the engine's
effective settings, so two requests an engine runs identically are one trial. The child run is created before the
engine starts, so a killed trial leaves a RUNNING run that resuming marks FAILED; an interrupted trial (Ctrl-C,
SIGTERM) ends KILLED. A plan the engine refuses is recorded as a ``bad_arguments`` trial without running anything.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping

from bisect_eagle.engines.base import TrialResult
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.stats import median_mad
from bisect_eagle.tracking.runs import flat_params
from bisect_eagle.trials.context import TrialContext
from bisect_eagle.trials.record import (
    NUMBER_TAG,
    TRIAL_TAG,
    TrialRecord,
    _effective_tag,
    deployment_tags,
    find_cached,
    live_trial_name,
    log_result,
    ratio_name,
    run_name,
    scrubber_for,
    trial_name,
)


def aggregate(results: list[TrialResult], metric: str) -> tuple[dict[str, float], TrialResult]:
    """Median metrics over repeats (with MAD of the criterion metric) and the median run itself."""
    med, mad = median_mad([getattr(r, metric) for r in results])
    rep = min(results, key=lambda r: abs(getattr(r, metric) - med))
    metrics = dict(rep.metrics())
    metrics[metric] = med
    metrics[f"{metric}_mad"] = mad
    metrics["repeats"] = float(len(results))
    for other in ("output_tok_s", "accept_length"):
        if other != metric:
            metrics[other] = statistics.median(getattr(r, other) for r in results)
    return metrics, rep


def _measure(ctx: TrialContext, plan: TrialPlan, rounds: int = 1) -> tuple[list[TrialResult], float, bool]:
    """Run the engine ``repeats`` times (fewer when the first one fails or is pruned), each a launch measuring
    ``rounds`` benchmark rounds (:meth:`~bisect_eagle.engines.base.Engine.run_rounds`); (results, s, pruned)."""
    search = ctx.spec.search
    settings = plan.settings
    if ctx.engine is None:
        raise RuntimeError("live trials need an engine in the trial context")
    results: list[TrialResult] = []
    engine_s = 0.0
    for i in range(search.repeats):
        t0, cpu0 = time.perf_counter(), time.process_time()
        try:
            result = ctx.engine.run(plan) if rounds == 1 else ctx.engine.run_rounds(plan, rounds=rounds)
        finally:  # an interrupted run was a launch too
            seconds = time.perf_counter() - t0
            engine_s += seconds
            ctx.meter.add(seconds, cpu_s=time.process_time() - cpu0)
        results.append(result)
        if not result.ok:
            return results, engine_s, False
        below = search.prune_below is not None and ctx.target is not None and i == 0 and not settings.is_baseline
        if below and getattr(result, ctx.metric) < search.prune_below * ctx.target:
            return results, engine_s, True
    return results, engine_s, False


def run_live_trial(
    ctx: TrialContext,
    plan: TrialPlan,
    *,
    stage: str,
    parent_run_id: str,
    number: int | None = None,
    tags: dict[str, str] | None = None,
    label: str | None = None,
    rounds: int = 1,
    reuse: bool = False,
    start_metrics: Mapping[str, float] | None = None,
) -> TrialRecord:
    """Measure ``plan`` as one child run of ``parent_run_id``: ``repeats`` launches, each of ``rounds`` benchmark
    rounds on an engine whose rounds share a launch.

    Args:
        ctx: the study's shared context; :attr:`~bisect_eagle.trials.context.TrialContext.run_id` is set to the
            child run as soon as it exists (a caller whose trial raised reads it there).
        plan: the engine's plan (its fingerprint is the trial's identity).
        stage: the run's ``stage`` tag (``live``, ``baseline``, ``confirm``, ``reproduce``).
        parent_run_id: the parent run.
        number: a study's Optuna trial number (also tagged ``trial_number``).
        tags: more tags (a confirmation's ``confirm_pair`` / ``confirm_role`` / ``confirm_of``).
        label: names the run instead of the stage (a bisect's ``probe 04 +num_steps``).
        rounds: benchmark rounds per launch (:meth:`~bisect_eagle.engines.base.Engine.run_rounds`).
        reuse: first look for a finished trial of the plan's fingerprint under ``parent_run_id`` and return it
            (``cached``) without running anything.
        start_metrics: metrics logged on the run when it starts (a study's forecast of it, made before it ran).

    Returns:
        The trial's record. The run is named from ``stage``, ``number``, ``label`` and, for stage ``confirm``, the
        confirmation ``tags`` (:func:`~bisect_eagle.trials.record.trial_name`; a candidate is named after the
        study's live trial of its ``confirm_of`` fingerprint). A refused plan becomes a FAILED ``bad_arguments``
        run at once (nothing runs) and a failed record. A failed run's name ends with its failure class
        (``... [failed: oom]``).
    """
    if reuse and (cached := find_cached(ctx.tracking, plan.fingerprint, parent_run_id=parent_run_id)) is not None:
        return cached
    start = time.perf_counter()
    effective, fp = plan.effective, plan.fingerprint
    params = flat_params(effective)
    params.update({f"requested.{k}": v for k, v in flat_params(plan.requested).items() if params.get(k) != v})
    tags = dict(tags or {})
    of = (live_trial_name(ctx.tracking, tags["confirm_of"], parent_run_id=parent_run_id)
          if stage == "confirm" and tags.get("confirm_role") == "candidate" else None)
    name = trial_name(stage, number=number, label=label, tags=tags, of=of)
    if number is not None:
        tags[NUMBER_TAG] = str(number)
    run_id = ctx.tracking.start_run(
        run_name(name, stage, effective),
        tags={"stage": stage, TRIAL_TAG: name, "fingerprint": fp, "study": ctx.study, "owner": ctx.owner,
         **deployment_tags(ctx.spec), "engine": plan.engine, "checked": plan.checked or "the engine's own rules",
         **_effective_tag(effective), **tags},
        params=params, parent_run_id=parent_run_id)
    ctx.run_id = run_id
    if start_metrics:
        ctx.tracking.log(run_id, metrics=dict(start_metrics))
    if plan.refusal is not None:
        record = TrialRecord(fingerprint=fp, stage=stage, status="failed", value=None, metrics={},
                             effective=effective, run_id=run_id, name=name, failure_class="bad_arguments",
                             failure_detail=plan.refusal, warnings=list(plan.warnings))
        log_result(ctx.tracking, plan, record, [], metric=ctx.metric)
        record.wall_s = time.perf_counter() - start
        return record
    # Ctrl-C or SIGTERM ends the run KILLED, an engine bug FAILED, a BadInput FAILED as bad_arguments; re-raised
    with ctx.tracking.run_guard(run_id, failure_classes={BadInput: "bad_arguments"}, scrub=scrubber_for(plan)):
        results, engine_s, pruned = _measure(ctx, plan, rounds)
    record = _record(ctx, plan, stage, results, pruned, run_id)
    record.name, record.engine_s = name, engine_s
    log_result(ctx.tracking, plan, record, results, metric=ctx.metric)
    record.wall_s = time.perf_counter() - start
    return record


def _record(ctx: TrialContext, plan: TrialPlan, stage: str, results: list[TrialResult], pruned: bool,
            run_id: str) -> TrialRecord:
    fp, effective = plan.fingerprint, plan.effective
    last = results[-1]
    all_warnings = list(dict.fromkeys([*plan.warnings, *(w for r in results for w in r.warnings)]))
    if not last.ok:
        return TrialRecord(fingerprint=fp, stage=stage, status="failed", value=None, metrics={}, effective=effective,
                           run_id=run_id, failure_class=last.failure_class, failure_detail=last.failure_detail,
                           warnings=all_warnings)
    metrics, _ = aggregate(results, ctx.metric)
    if ctx.baseline:
        metrics[ratio_name(ctx.metric)] = metrics[ctx.metric] / ctx.baseline
    if ctx.baseline_tok_s:
        metrics[ratio_name("output_tok_s")] = metrics["output_tok_s"] / ctx.baseline_tok_s
    ids = effective.get(IDS_KEY)
    if ids is not None and tuple(ids) in ctx.wiring_accuracy:
        metrics["standalone_accuracy"] = ctx.wiring_accuracy[tuple(ids)]
    return TrialRecord(fingerprint=fp, stage=stage, status="pruned" if pruned else "ok", value=metrics[ctx.metric],
                       metrics=metrics, effective=effective, run_id=run_id, warnings=all_warnings)
