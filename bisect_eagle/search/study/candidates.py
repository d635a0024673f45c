"""A study's candidates and their confirmation: which measured configs may stop the study, and the
verdicts.

A config measured at or above the target is a candidate; with ``search.confirm.enabled`` it is
re-measured interleaved with the baseline (:func:`bisect_eagle.search.study.confirm.confirm`) and
stops the study only when that confirms it. Verdicts are stored on the study (user attribute
``confirmations``: fingerprint -> :meth:`~bisect_eagle.search.study.confirm.Confirmation.to_json`,
shared by all workers), so a config is confirmed once, and on the parent run (tags ``confirmation``,
``confirm_candidate_run_id``, ``confirm_schedule``; metrics ``confirm_pairs``, ``confirm_bound``,
``confirm_estimate``, ``confirm_upper``, ``baseline_drift``, ``confirm_launches``,
``confirm_shared_baseline``). The baseline launches are kept on the study too
(``baseline_samples``), so a later candidate pairs with them while they show no drift.
"""

from __future__ import annotations

from typing import Any

from bisect_eagle.search.study.claims import Claim
from bisect_eagle.search.study.confirm import (
    Confirmation,
    Sample,
    confirm,
    confirm_schedule,
    logged_samples,
)
from bisect_eagle.search.study.state import StudyState
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.trials.record import TRIAL_TAG, settings_of_run

# study user attribute: the baseline launches so far (Sample.to_json)
BASELINE_SAMPLES = "baseline_samples"


def confirmations(run: StudyState) -> dict[str, dict[str, Any]]:
    """Every confirmation of ``run``'s study so far: fingerprint -> :meth:`Confirmation.to_json`."""
    return run.attr("confirmations") or {}


def baseline_samples(run: StudyState) -> list[Sample]:
    """The study's baseline launches, oldest first (user attribute ``baseline_samples``; before any
    confirmation, the study's own baseline measurement): what a confirmation pairs with before
    launching more."""
    stored = run.attr(BASELINE_SAMPLES)
    if stored:
        return [Sample(**s) for s in stored]
    value, run_id = run.ctx.baseline, run.attr("baseline_run_id")
    return [Sample(value=float(value), run_id=str(run_id))] if value and run_id else []


def candidates(run: StudyState) -> list[Claim]:
    """Measured configs at or above the target that were not refused by a confirmation, best first.

    Args:
        run: the study's state.

    Returns:
        The claims, best value first; empty when the study has no target.
    """
    target = run.ctx.target
    if target is None:
        return []
    refused = {fp for fp, c in confirmations(run).items() if c["status"] != "confirmed"}
    ok = [
        c
        for c in run.claims.all()
        if c.state == "ok"
        and c.value is not None
        and c.value >= target
        and c.fingerprint not in refused
    ]
    return sorted(ok, key=lambda c: c.value, reverse=True)


def reached(run: StudyState) -> str | None:
    """ "target reached (...)" once a candidate is confirmed (or without confirmation, at the first
    one); the candidates not yet judged are confirmed here, best first, until one is.

    Args:
        run: the study's state.

    Returns:
        The "target reached (...)" sentence, or None while no candidate is confirmed.
    """
    settings = run.spec.search.confirm
    for cand in candidates(run):
        if not settings.enabled:
            return "target reached (not confirmed: search.confirm.enabled is false)"
        known = confirmations(run).get(cand.fingerprint)
        verdict = Confirmation(**known) if known else confirm_candidate(run, cand)
        if verdict.confirmed:
            return f"target reached ({verdict.summary()})"
    return None


def confirm_candidate(run: StudyState, cand: Claim) -> Confirmation:
    """Re-measure ``cand`` interleaved with the baseline; store and log the verdict."""
    ctx, spec = run.ctx, run.spec
    settings = spec.search.confirm
    plan = ctx.plan(_settings_of(run, cand))
    baseline = None
    if spec.baseline == "measure":
        baseline = ctx.plan(
            spec.fixed_settings().model_copy(update={"speculative_algorithm": "none"})
        )
    steps = confirm_schedule(ctx, baseline_measured=baseline is not None, settings=settings)
    run.emit("confirm", f"confirming {cand.value:.4g} ≥ target {ctx.target:.4g}; {steps}")
    known = (
        (cand.value, cand.run_id) if plan.fingerprint == cand.fingerprint and cand.run_id else None
    )
    pool = baseline_samples(run) if baseline is not None else []
    others = [c["candidate"] for c in confirmations(run).values() if not c.get("deterministic")]
    logged = logged_samples(ctx, plan.fingerprint)
    if logged:
        kept = "the launch" if len(logged) == 1 else f"the {len(logged)} launches"
        run.emit("confirm", f"resumed: {kept} a killed process measured kept, not launched again")
    verdict = confirm(
        ctx,
        candidate=plan,
        baseline=baseline,
        settings=settings,
        ratio=spec.criterion.ratio,
        first_baseline=ctx.baseline,
        known=known,
        pool=pool,
        others=others,
        logged=logged,
    )
    run.study.set_user_attr(
        "confirmations", {**confirmations(run), cand.fingerprint: verdict.to_json()}
    )
    if verdict.new_baseline:
        run.study.set_user_attr(
            BASELINE_SAMPLES, [*(b.to_json() for b in pool), *verdict.new_baseline]
        )
    named = {
        "confirm_pairs": float(verdict.pairs),
        "confirm_bound": verdict.lower,
        "confirm_estimate": verdict.estimate,
        "confirm_upper": verdict.upper,
        "baseline_drift": verdict.baseline_drift,
        "confirm_launches": float(verdict.launches),
        "confirm_shared_baseline": float(verdict.shared_baseline),
    }
    metrics = {k: v for k, v in named.items() if v is not None}
    ctx.tracking.log(
        ctx.parent_run_id,
        metrics=metrics,
        tags={
            "confirmation": verdict.summary(),
            "confirm_candidate_run_id": cand.run_id,
            "confirm_schedule": verdict.schedule,
        },
    )
    name = ctx.tracking.get_run(cand.run_id).data.tags.get(TRIAL_TAG) if cand.run_id else None
    run.emit("confirm", f"{name + ' ' if name else ''}(run {cand.run_id[:8]}): {verdict.summary()}")
    return verdict


def _settings_of(run: StudyState, cand: Claim) -> LiveSettings:
    """The settings a claimed config was measured with (its run's ``trial.json``)."""
    return settings_of_run(run.ctx.tracking, run.ctx.tracking.get_run(cand.run_id))[0]
