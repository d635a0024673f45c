"""What a study reports: progress events while it runs, and its outcome (the best trial, every trial) at the end.

:class:`StudyOutcome` is what ``bisect-eagle run --json`` and ``worker --json`` print (:meth:`to_json`). Not to
be confused with the bisect's outcome and progress (:mod:`bisect_eagle.bisect`), which differ.

``target_reached`` is true only when a candidate's re-measurement confirmed it
(:mod:`bisect_eagle.search.study.confirm`), or at the first candidate when ``search.confirm.enabled`` is false;
``best`` is then that candidate, else the best measured config. ``confirmation`` is the verdict on ``best``
(None when it was never a candidate); ``confirmations`` every verdict of the study.

``launches`` is what the study cost (:meth:`~bisect_eagle.trials.launches.Launches.to_json`: ``total``, ``live``,
``confirm``, ``baseline`` and ``unit``, "launches" of a server or the local engine's "runs"), next to
``counts["live_measured"]``: with repeats and confirmation a live trial is several launches.
``tool_overhead_s_per_trial`` is this process's own time per live trial it measured, steering, the model and
confirmation bookkeeping included (:mod:`bisect_eagle.search.study.spend`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

import optuna

from bisect_eagle.search.space import SearchSpace
from bisect_eagle.search.study.candidates import confirmations as study_confirmations
from bisect_eagle.tracking.redact import redact_url
from bisect_eagle.trials.record import TRIAL_TAG, effective_of, run_metrics

if TYPE_CHECKING:
    from bisect_eagle.search.study.loop import StudyRun

ProgressStage = Literal["plan", "standalone", "baseline", "waiting", "resume", "live", "confirm", "done"]


@dataclass(kw_only=True)
class StudyProgress:
    """One progress event for a display."""

    stage: ProgressStage
    message: str
    done: int = 0  # live trials measured (all workers)
    total: int = 0  # max live trials
    best: float | None = None
    target: float | None = None
    elapsed_s: float = 0.0
    max_wall_s: float = 0.0


@dataclass(kw_only=True)
class StudyOutcome:
    """What a run (or a worker) ends with; ``to_json`` is what ``--json`` prints."""

    target_reached: bool
    stop_reason: str
    study: str
    storage: str  # the Optuna storage URL, password hidden
    tracking_uri: str  # password hidden
    experiment_id: str
    parent_run_id: str
    metric: str
    baseline: float | None
    target: float | None
    baseline_output_tok_s: float | None
    best: dict[str, Any] | None  # run_id, fingerprint, value, params (effective settings), metrics
    gate: list[dict[str, Any]]  # stage-1 verdicts
    trials: list[dict[str, Any]]  # every Optuna trial (trial_summary)
    counts: dict[str, int]
    elapsed_s: float
    tool_overhead_s_per_trial: float | None
    confirmation: dict[str, Any] | None = None  # Confirmation.to_json of the best config, when confirmed or tried
    confirmations: dict[str, dict[str, Any]] | None = None  # every confirmation: fingerprint -> verdict
    launches: dict[str, Any] | None = None  # Launches.to_json: total, live, confirm, baseline, unit (all workers)

    @property
    def verdict(self) -> str:
        """One line: "reached (confirmed, bound ...)", "not confirmed (...)" or "not reached"."""
        c = self.confirmation
        if self.target_reached:
            return f"reached ({_summary(c)})" if c else "reached (not confirmed: confirmation disabled)"
        return f"not confirmed ({_summary(c)})" if c else "not reached"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _summary(c: dict[str, Any]) -> str:
    from bisect_eagle.search.study.confirm import Confirmation

    return Confirmation(**c).summary()


def trial_summary(t: optuna.trial.FrozenTrial, space: SearchSpace | None) -> dict[str, Any]:
    """One Optuna trial for the outcome: its decoded params (``requested``) and the values the engine runs them
    as (``params``: effective, where the trial was planned), state, value, fingerprint, run and failure."""
    requested = space.decode(t.params) if space is not None else dict(t.params)
    params = {k: t.user_attrs.get("effective", {}).get(k, v) for k, v in requested.items()}
    return {"number": t.number, "name": t.user_attrs.get("name"), "state": t.state.name, "value": t.value,
            "params": params, "requested": requested,
            "fingerprint": t.user_attrs.get("fingerprint"),
            "run_id": t.user_attrs.get("mlflow_run_id") or t.user_attrs.get("duplicate_of"),
            "duplicate": "duplicate_of" in t.user_attrs, "failure_class": t.user_attrs.get("failure_class")}


def study_outcome(run: StudyRun, *, reason: str, space: SearchSpace | None) -> StudyOutcome:
    """The outcome of ``run``'s study as it stands (all workers' trials), ending for ``reason``."""
    ctx = run.ctx
    claims = run.claims.all()
    ok = [c for c in claims if c.state == "ok" and c.value is not None]
    confirmations = study_confirmations(run)
    confirmed = [c for c in ok if confirmations.get(c.fingerprint, {}).get("status") == "confirmed"]
    best_claim = max(confirmed or ok, key=lambda c: c.value, default=None)
    best = None
    if best_claim is not None:
        best_run = ctx.tracking.get_run(best_claim.run_id)
        best = {"run_id": best_claim.run_id, "name": best_run.data.tags.get(TRIAL_TAG),
                "fingerprint": best_claim.fingerprint, "value": best_claim.value,
                "params": effective_of(ctx.tracking, best_run), "metrics": run_metrics(best_run)}
    frozen = run.study.get_trials(deepcopy=False)
    trials = [trial_summary(t, space) for t in frozen]
    counts = {
        "live_measured": len(claims),
        "failed": sum(c.state == "failed" for c in claims),
        "duplicates": sum("duplicate_of" in t.user_attrs for t in frozen),
        "skipped": sum("skipped" in t.user_attrs for t in frozen),
        "optuna_trials": len(trials),
        "standalone": len(run.attr("gate") or []),
    }
    target = ctx.target
    reached = bool(confirmed) if run.spec.search.confirm.enabled else (
        target is not None and best is not None and best["value"] >= target)
    return StudyOutcome(
        target_reached=reached,
        stop_reason=reason, study=run.name, storage=redact_url(run.storage_url),
        tracking_uri=redact_url(ctx.tracking.uri), experiment_id=ctx.tracking.experiment_id,
        parent_run_id=ctx.parent_run_id, metric=run.spec.criterion.metric, baseline=ctx.baseline,
        target=target, baseline_output_tok_s=ctx.baseline_tok_s, best=best, gate=run.attr("gate") or [],
        trials=trials, counts=counts, elapsed_s=run.elapsed(),
        tool_overhead_s_per_trial=run.spend.per_trial(),
        confirmation=confirmations.get(best_claim.fingerprint) if best_claim else None, confirmations=confirmations,
        launches=run.launches().to_json(),
    )
