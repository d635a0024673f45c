"""One trial as one path: the engine's plan -> cache lookup -> engine -> result -> one MLflow child
run.

The run is one block of its schema, :func:`bisect_eagle.trials.record.trial_run`: opened (cache
lookup, name, tags, params) as the block starts, the engine run inside it, the result written as it
ends.

:func:`run_live_trial` is the one call: the caller (a study's loop, a bisect's prober,
``reproduce``) has the plan (:meth:`TrialContext.plan
<bisect_eagle.trials.context.TrialContext.plan>`) and takes its own decisions before it; nothing
here calls back up. Identity is the plan's fingerprint (:mod:`bisect_eagle.engines.plan`): the
engine's effective settings, so two requests an engine runs identically are one trial. The child run
is created before the engine starts, so a killed trial leaves a RUNNING run that resuming marks
FAILED; an interrupted trial (Ctrl-C, SIGTERM) ends KILLED. A plan the engine refuses is recorded as
a ``bad_arguments`` trial without running anything.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from bisect_eagle.engines.base import TrialResult
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.trials.context import TrialContext
from bisect_eagle.trials.record import TrialRecord, trial_run


def _measure(
    ctx: TrialContext, plan: TrialPlan, rounds: int = 1
) -> tuple[list[TrialResult], float, bool]:
    """Run the engine ``repeats`` times (fewer when the first one fails or is pruned), each a launch
    measuring ``rounds`` benchmark rounds (:meth:`~bisect_eagle.engines.base.Engine.run_rounds`);
    (results, s, pruned)."""
    search = ctx.spec.search
    settings = plan.settings
    if ctx.engine is None:
        raise RuntimeError("live trials need an engine in the trial context")
    results: list[TrialResult] = []
    engine_s = 0.0
    for i in range(search.repeats):
        t0, cpu0 = time.perf_counter(), time.process_time()
        try:
            result = (
                ctx.engine.run(plan) if rounds == 1 else ctx.engine.run_rounds(plan, rounds=rounds)
            )
        finally:  # an interrupted run was a launch too
            seconds = time.perf_counter() - t0
            engine_s += seconds
            ctx.meter.add(seconds, cpu_s=time.process_time() - cpu0)
        results.append(result)
        if not result.ok:
            return results, engine_s, False
        below = (
            search.prune_below is not None
            and ctx.target is not None
            and i == 0
            and not settings.is_baseline
        )
        if below and getattr(result, ctx.spec.criterion.metric) < search.prune_below * ctx.target:
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
    """Measure ``plan`` as one child run of ``parent_run_id``: ``repeats`` launches, each of
    ``rounds`` benchmark rounds on an engine whose rounds share a launch.

    Args:
        ctx: the study's shared context; :attr:`~bisect_eagle.trials.context.TrialContext.run_id` is
            set to the child run as soon as it exists (a caller whose trial raised reads it there).
        plan: the engine's plan (its fingerprint is the trial's identity).
        stage: the run's ``stage`` tag (``live``, ``baseline``, ``confirm``, ``reproduce``).
        parent_run_id: the parent run.
        number: a study's Optuna trial number (also tagged ``trial_number``).
        tags: more tags (a confirmation's ``confirm_pair`` / ``confirm_role`` / ``confirm_of``).
        label: names the run instead of the stage (a bisect's ``probe 04 +num_steps``).
        rounds: benchmark rounds per launch (:meth:`~bisect_eagle.engines.base.Engine.run_rounds`).
        reuse: first look for a finished trial of the plan's fingerprint under ``parent_run_id`` and
            return it (``cached``) without running anything.
        start_metrics: metrics logged on the run when it starts (a study's forecast of it, made
            before it ran).

    Returns:
        The trial's record. The run is named from ``stage``, ``number``, ``label`` and, for stage
        ``confirm``, the confirmation ``tags`` (:func:`~bisect_eagle.trials.record.trial_name`; a
        candidate is named after the study's live trial of its ``confirm_of`` fingerprint). A
        refused plan becomes a FAILED ``bad_arguments`` run at once (nothing runs) and a failed
        record. A failed run's name ends with its failure class (``... [failed: oom]``).
    """
    start = time.perf_counter()
    with trial_run(
        ctx,
        plan,
        stage=stage,
        parent_run_id=parent_run_id,
        number=number,
        tags=tags,
        label=label,
        reuse=reuse,
        start_metrics=start_metrics,
    ) as trial:
        if trial.cached is not None:
            return trial.cached
        ctx.run_id = trial.run_id
        if plan.refusal is None:  # a refused plan runs nothing: its run ends FAILED, bad_arguments
            trial.results, trial.engine_s, trial.pruned = _measure(ctx, plan, rounds)
    record = trial.record
    assert record is not None  # trial_run sets it as the block ends
    record.wall_s = time.perf_counter() - start
    return record
