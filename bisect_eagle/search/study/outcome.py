"""What a study reports: progress events while it runs, and its outcome (the best trial, every
trial) at the end.

:class:`StudyOutcome` is what ``bisect-eagle run --json`` and ``worker --json`` print
(:meth:`to_json`). Not to be confused with the bisect's outcome and progress
(:mod:`bisect_eagle.bisect`), which differ.

``target_reached`` is true only when a candidate's re-measurement confirmed it
(:mod:`bisect_eagle.search.study.confirm`), or at the first candidate when
``search.confirm.enabled`` is false; ``best`` is then that candidate, else the best measured config.
``confirmation`` is the verdict on ``best`` (None when it was never a candidate); ``confirmations``
every verdict of the study.

``launches`` is what the study cost (:meth:`~bisect_eagle.trials.launches.Launches.to_json`:
``total``, ``live``, ``confirm``, ``baseline`` and ``unit``, "launches" of a server or the local
engine's "runs"), next to ``counts["live_measured"]``: with repeats and confirmation a live trial is
several launches. ``tool_overhead_s_per_trial`` is this process's own time per live trial it
measured, steering, the model and confirmation bookkeeping included
(:mod:`bisect_eagle.search.study.spend`), and ``tool_cpu_s_per_trial`` the same steps' CPU seconds
(what the tool costs, whatever else the machine runs).

Whatever the criterion, the mission is the baseline's tokens per second:
:attr:`StudyOutcome.verdict` is the one sentence on the criterion (said once wherever the outcome is
shown), :attr:`StudyOutcome.speed_text` the best config's output tok/s against the baseline's,
saying plainly when speculation is slower here and why when the cause is known (``speed``: the
engine on the CPU, a machine loaded beyond its cores).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

import optuna

from bisect_eagle.search.space import SearchSpace
from bisect_eagle.search.study.candidates import confirmations as study_confirmations
from bisect_eagle.search.study.state import StudyState
from bisect_eagle.tracking.redact import redact_url
from bisect_eagle.trials.record import TRIAL_TAG, effective_of, run_metrics


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
    # Confirmation.to_json of the best config, when confirmed or tried
    confirmation: dict[str, Any] | None = None
    # every confirmation: fingerprint -> verdict
    confirmations: dict[str, dict[str, Any]] | None = None
    # Launches.to_json: total, live, confirm, baseline, unit (all workers)
    launches: dict[str, Any] | None = None
    # the best config's output tok/s against the baseline's, and what slowed it when known
    # (speed_facts)
    speed: dict[str, Any] | None = None
    # the tool's own CPU seconds per live trial (Spend.cpu_per_trial)
    tool_cpu_s_per_trial: float | None = None

    @property
    def verdict(self) -> str:
        """The one verdict sentence: ``target reached: accept length 4.80, target ≥ 4.50 (4.5×
        baseline), confirmed by one measurement``, or ``target not reached: best accept length 3.20,
        target ≥ 4.50 (4.5× baseline); stopped: <why>``."""
        return verdict_sentence(self)

    @property
    def speed_text(self) -> str | None:
        """The best config's output tok/s against the baseline's, in one sentence (None when either
        is unknown)."""
        return speed_sentence(self.speed)

    def to_json(self) -> dict[str, Any]:
        """The outcome as JSON.

        Returns:
            Every field by name (``dataclasses.asdict``).
        """
        return asdict(self)


METRIC_WORDS = {"accept_length": "accept length", "output_tok_s": "output tok/s"}


def value_text(value: float) -> str:
    """A criterion value in the verdict.

    Args:
        value: the criterion metric's value.

    Returns:
        Two decimals, one from 100 up (``4.80``, ``95.12``, ``123.4``).
    """
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.2f}"


def verdict_sentence(out: StudyOutcome) -> str:
    """The verdict on the criterion, in one sentence: the best value against the target (and the
    target's ratio to the baseline), how it was confirmed, and, when not reached, why the study
    stopped."""
    metric = METRIC_WORDS.get(out.metric, out.metric)
    if out.target is None or out.best is None:
        return f"target not reached: no live trial measured {metric}; stopped: {out.stop_reason}"
    ratio = f" ({out.target / out.baseline:.3g}× baseline)" if out.baseline else ""
    head = f"{metric} {value_text(out.best['value'])}, target ≥ {value_text(out.target)}{ratio}"
    c = out.confirmation
    if out.target_reached:
        return f"target reached: {head}, {_confirmed_by(c)}"
    confirmed = "" if c is None else f", {_confirmed_by(c)}"
    return f"target not reached: best {head}{confirmed}; stopped: {out.stop_reason}"


def _confirmed_by(c: dict[str, Any] | None) -> str:
    """How the verdict was confirmed: ``confirmed by one measurement``, ``confirmed by 3
    re-measurements, 95 % lower bound 1.06×``, ``not confirmed: <why>``, or that confirmation is
    off."""
    if c is None:
        return "not re-measured (confirmation is off)"
    if c["status"] != "confirmed":
        bound = (
            "" if c.get("lower") is None else f" (lower bound {c['lower']:.3g}× < {c['ratio']:g}×)"
        )
        return f"not confirmed{bound}: {c.get('detail') or 'see the confirm runs'}"
    if c.get("deterministic"):
        return "confirmed by one measurement"
    pairs = c.get("pairs") or 0
    return (
        f"confirmed by {pairs} re-measurement{'s' if pairs != 1 else ''}, "
        f"{c['confidence'] * 100:g} % lower bound {c['lower']:.3g}×"
    )


def speed_sentence(speed: dict[str, Any] | None) -> str | None:
    """The best config's tok/s against the baseline's, in one sentence.

    Args:
        speed: the outcome's ``speed`` facts (``output_tok_s``, ``baseline_output_tok_s``, and why
            speculation may be slower here).

    Returns:
        ``output tok/s 61.2 against 90.0 without speculation (0.68× baseline): speculation is
        slower here than no speculation, likely because ...``; None without both figures.
    """
    if not speed or speed.get("output_tok_s") is None or not speed.get("baseline_output_tok_s"):
        return None
    ratio = speed["output_tok_s"] / speed["baseline_output_tok_s"]
    text = (
        f"output tok/s {value_text(speed['output_tok_s'])} against "
        f"{value_text(speed['baseline_output_tok_s'])} without speculation ({ratio:.2f}× baseline)"
    )
    if ratio >= 1:
        return text
    causes = speed.get("causes") or []
    why = f", likely because {' and '.join(causes)}" if causes else ""
    return f"{text}: speculation is slower here than no speculation{why}"


def speed_facts(best: dict[str, Any] | None, baseline_tok_s: float | None) -> dict[str, Any] | None:
    """The best config's output tok/s beside the baseline's, with what slowed it when known: the
    engine on the CPU (effective ``device`` ``cpu``) and a machine loaded beyond its cores (this
    host's load average, read now, above its core count). None without a best config."""
    if best is None:
        return None
    tok_s = best["metrics"].get("output_tok_s")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    causes = []
    if best["params"].get("device") == "cpu":
        causes.append(
            "the engine runs on the CPU, where verifying several tokens in one pass costs more "
            "than one decoding step (on a GPU it costs about the same)"
        )
    if load is not None and load > cores:
        causes.append(
            f"the machine is loaded (load average {load:.1f} on {cores} cores): other processes "
            "slow every trial, unevenly"
        )
    return {
        "output_tok_s": tok_s,
        "baseline_output_tok_s": baseline_tok_s,
        "load_average": load,
        "cores": cores,
        "causes": causes,
    }


def trial_summary(t: optuna.trial.FrozenTrial, space: SearchSpace | None) -> dict[str, Any]:
    """One Optuna trial for the outcome: its decoded params (``requested``) and the values the
    engine runs them as (``params``: effective, where the trial was planned), state, value,
    fingerprint, run and failure."""
    requested = space.decode(t.params) if space is not None else dict(t.params)
    params = {k: t.user_attrs.get("effective", {}).get(k, v) for k, v in requested.items()}
    return {
        "number": t.number,
        "name": t.user_attrs.get("name"),
        "state": t.state.name,
        "value": t.value,
        "params": params,
        "requested": requested,
        "fingerprint": t.user_attrs.get("fingerprint"),
        "run_id": t.user_attrs.get("mlflow_run_id") or t.user_attrs.get("duplicate_of"),
        "duplicate": "duplicate_of" in t.user_attrs,
        "failure_class": t.user_attrs.get("failure_class"),
    }


def study_outcome(run: StudyState, *, reason: str, space: SearchSpace | None) -> StudyOutcome:
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
        best = {
            "run_id": best_claim.run_id,
            "name": best_run.data.tags.get(TRIAL_TAG),
            "fingerprint": best_claim.fingerprint,
            "value": best_claim.value,
            "params": effective_of(ctx.tracking, best_run),
            "metrics": run_metrics(best_run),
        }
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
    reached = (
        bool(confirmed)
        if run.spec.search.confirm.enabled
        else (target is not None and best is not None and best["value"] >= target)
    )
    return StudyOutcome(
        target_reached=reached,
        stop_reason=reason,
        study=run.name,
        storage=redact_url(run.storage_url),
        tracking_uri=redact_url(ctx.tracking.uri),
        experiment_id=ctx.tracking.experiment_id,
        parent_run_id=ctx.parent_run_id,
        metric=run.spec.criterion.metric,
        baseline=ctx.baseline,
        target=target,
        baseline_output_tok_s=ctx.baseline_tok_s,
        best=best,
        gate=run.attr("gate") or [],
        trials=trials,
        counts=counts,
        elapsed_s=run.elapsed(),
        tool_overhead_s_per_trial=run.spend.per_trial(),
        tool_cpu_s_per_trial=run.spend.cpu_per_trial(),
        confirmation=confirmations.get(best_claim.fingerprint) if best_claim else None,
        confirmations=confirmations,
        launches=run.launches().to_json(),
        speed=speed_facts(best, ctx.baseline_tok_s),
    )
