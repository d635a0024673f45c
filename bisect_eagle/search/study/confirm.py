"""Confirm success instead of assuming it: the candidate and the baseline re-measured interleaved, with a bound.

A study's live trials are single measurements against a baseline measured once, so the first config whose
measurement clears the target may be a lucky draw. Before the study says "target reached" the candidate is
re-measured interleaved with the baseline (candidate, baseline, candidate, baseline, ...) as child runs of the
study (stage ``confirm``), and judged on the pairs (spec ``search.confirm``):

- Each pair gives ``d_i = log(candidate_i) − log(baseline_i)``: paired, so a drift of the machine between
  pairs (a busy neighbour, thermal throttling) cancels. With a fixed baseline (``baseline: <number>``) only
  the candidate is re-measured and ``d_i = log(candidate_i) − log(baseline)``.
- The estimate is ``exp(mean d)``, the bounds ``exp(mean d ∓ t·s/√n)`` with ``s`` the standard deviation of
  the ``d_i`` and ``t = t_{1 − α/L}(n − 1)``, ``α = 1 − confidence``, ``L`` the number of looks. The pairs are
  judged at ``min_pairs`` and then at doubling counts up to ``max_pairs`` (the schedule of
  :func:`bisect_eagle.bisect.judge.schedule`); by the union bound over the looks, a candidate whose
  true ratio is below the criterion ratio is confirmed with probability at most ``α``.
- Confirmed when the lower bound is ≥ the criterion ratio; not confirmed as soon as the upper bound is below
  it, when the budget is spent, or when a re-measurement fails.

The baseline samples also measure drift: ``baseline_drift`` is their geometric mean over the study's first
baseline measurement (the target was computed from that one).

Only what can change the verdict is measured (:func:`confirm_schedule` says what, and why, in the progress
output and on the verdict, field ``schedule``):

- For an ``accept_length`` criterion the baseline is not re-measured: without speculation every verify step
  yields one token, so its accept length is 1 by definition (a fixed baseline of 1).
- A metric the engine declares deterministic (:attr:`Engine.deterministic_metrics
  <bisect_eagle.engines.base.Engine.deterministic_metrics>`: greedy accept length on the local engine) has no
  noise to bound: the candidate is measured once, and the search's own measurement of the same plan is that
  measurement. The bound is the value itself: confirmed when ``candidate / baseline`` is at or above the
  criterion ratio, not confirmed below it (a deterministic baseline other than accept length's 1 is the
  study's own measurement of it).
- Every other metric (tok/s) is judged on interleaved pairs as above.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.spec.schema import Confirm
from bisect_eagle.stats import UNIT_BASELINE_METRIC, deterministic, ratio_bounds, schedule
from bisect_eagle.trials.live import run_live_trial
from bisect_eagle.trials.record import TrialContext

ConfirmStatus = Literal["confirmed", "not confirmed"]
TOLERANCE = 1e-12  # on log ratios: a deterministic value equal to the target is at the target


@dataclass(kw_only=True)
class Confirmation:
    """The verdict on one candidate, with its samples (``to_json`` goes on the outcome and the study)."""

    fingerprint: str
    status: ConfirmStatus
    ratio: float  # the criterion ratio the bound must clear
    estimate: float | None  # geometric mean of candidate / baseline over the pairs
    lower: float | None  # one-sided lower confidence bound on that ratio
    upper: float | None
    confidence: float
    pairs: int
    candidate: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)  # empty with a fixed baseline
    baseline_drift: float | None = None
    run_ids: list[str] = field(default_factory=list)
    detail: str = ""
    schedule: str = ""  # what was measured and why (confirm_schedule)
    deterministic: bool = False  # the metric is deterministic: the bound is the value (one measurement)

    @property
    def confirmed(self) -> bool:
        return self.status == "confirmed"

    def summary(self) -> str:
        """``confirmed, bound 1.04 ≥ 1.00`` or ``not confirmed, bound 0.97 < 1.00``: what the outcome says."""
        if self.lower is None:
            return f"{self.status}: {self.detail}"
        if self.deterministic:
            sign = "≥" if self.confirmed else "<"
            return (f"{self.status}, bound {self.lower:.3f} {sign} {self.ratio:g} × baseline; deterministic: "
                    f"the value itself, one measurement ({self.detail})")
        sign = "≥" if self.confirmed else "<"
        return (f"{self.status}, bound {self.lower:.3f} {sign} {self.ratio:g} × baseline; "
                f"{self.confidence:g} one-sided, {self.pairs} pairs, estimate {self.estimate:.3f}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _positive(v: float | None) -> bool:
    return v is not None and math.isfinite(v) and v > 0


def confirm_schedule(ctx: TrialContext, *, baseline_measured: bool, settings: Confirm) -> str:
    """What the confirmation of a candidate of ``ctx``'s study measures, and why (one line for the progress
    output and the verdict). ``baseline_measured``: the study measures its baseline (``baseline: measure``)."""
    metric = ctx.metric
    unit = metric == UNIT_BASELINE_METRIC
    base = ("the baseline is 1 by definition" if unit
            else "the baseline is the study's own measurement" if baseline_measured else "the baseline is fixed")
    if deterministic(ctx.engine, metric):
        why = "under greedy decoding" if unit else f"on the {getattr(ctx.engine, 'name', '?')} engine"
        return f"confirmation: {metric} is deterministic {why}: one measurement of the candidate, {base}"
    pairs = f"{settings.min_pairs}..{settings.max_pairs}"
    if unit or not baseline_measured:
        return f"confirmation: the candidate re-measured {pairs} times, {base}"
    return f"confirmation: candidate and baseline re-measured interleaved, {pairs} pairs"


def confirm(ctx: TrialContext, *, candidate: TrialPlan, baseline: TrialPlan | None, settings: Confirm,
            ratio: float, first_baseline: float | None,
            known: tuple[float, str] | None = None) -> Confirmation:
    """Re-measure ``candidate`` (and ``baseline``, interleaved; None for a fixed baseline) until the bound
    decides or the pair budget is spent; every measurement one child run (stage ``confirm``) of the study.

    An ``accept_length`` criterion has a fixed baseline of 1 (``baseline`` is not measured); a deterministic
    metric (the module docstring) is measured once, and ``known`` (value, run id: the search's own measurement
    of this same plan) is that measurement when given.
    """
    one = dataclasses.replace(ctx, spec=ctx.spec.model_copy(update={
        "search": ctx.spec.search.model_copy(update={"repeats": 1, "prune_below": None})}))
    looks = schedule(settings.min_pairs, settings.max_pairs)
    steps = confirm_schedule(ctx, baseline_measured=baseline is not None, settings=settings)
    exact = deterministic(ctx.engine, ctx.metric)
    if ctx.metric == UNIT_BASELINE_METRIC:
        baseline, fixed = None, 1.0
    elif exact:  # a deterministic baseline: its one measurement (or the spec's number) is its value
        baseline, fixed = None, ctx.baseline
    else:
        fixed = None if baseline is not None else ctx.baseline
    cand: list[float] = []
    base: list[float] = []
    run_ids: list[str] = []

    def verdict(status: ConfirmStatus, detail: str, bounds: tuple[float, float, float] | None) -> Confirmation:
        est, lo, hi = bounds or (None, None, None)
        drift = (math.exp(statistics.fmean(math.log(b) for b in base)) / first_baseline
                 if base and _positive(first_baseline) else None)
        return Confirmation(fingerprint=candidate.fingerprint, status=status, ratio=ratio, estimate=est, lower=lo,
                            upper=hi, confidence=settings.confidence, pairs=len(cand), candidate=cand,
                            baseline=base, baseline_drift=drift, run_ids=run_ids, detail=detail, schedule=steps,
                            deterministic=exact and bounds is not None)

    def sample(plan: TrialPlan, role: str) -> float | None:
        record = run_live_trial(one, plan, stage="confirm", parent_run_id=ctx.parent_run_id,
                                tags={"confirm_role": role, "confirm_of": candidate.fingerprint,
                                      "confirm_pair": str(len(cand))})
        run_ids.append(record.run_id)
        return record.value if record.status == "ok" and _positive(record.value) else None

    if exact:
        return _exact(candidate, known=known, fixed=fixed, ratio=ratio, sample=sample, verdict=verdict, cand=cand,
                      run_ids=run_ids)
    for count in looks:
        while len(cand) < count:
            a = sample(candidate, "candidate")
            b = sample(baseline, "baseline") if baseline is not None else fixed
            if a is None or not _positive(b):
                which = "candidate" if a is None else "baseline"
                return verdict("not confirmed", f"the {which} failed when measured again (run {run_ids[-1]})", None)
            cand.append(a)
            if baseline is not None:
                base.append(b)
        bounds = ratio_bounds(cand, base if baseline is not None else float(fixed), confidence=settings.confidence,
                              looks=len(looks))
        if bounds[1] >= ratio:
            return verdict("confirmed", "lower bound clears the criterion ratio", bounds)
        if bounds[2] < ratio:
            return verdict("not confirmed", "upper bound below the criterion ratio", bounds)
    return verdict("not confirmed", f"pair budget spent ({settings.max_pairs} pairs)", bounds)


def _exact(candidate: TrialPlan, *, known: tuple[float, str] | None, fixed: float | None, ratio: float,
           sample: Callable[[TrialPlan, str], float | None], verdict: Callable[..., Confirmation],
           cand: list[float], run_ids: list[str]) -> Confirmation:
    """A deterministic metric: one measurement of the candidate (``known``, else one run) against ``fixed``."""
    if known is not None and _positive(known[0]):
        value, where = known[0], f"the search's own measurement, run {known[1]}, of the same plan"
        run_ids.append(known[1])
    else:
        value = sample(candidate, "candidate")
        where = f"measured once, run {run_ids[-1]}"
        if value is None:
            return verdict("not confirmed", f"the candidate failed when measured again (run {run_ids[-1]})", None)
    if not _positive(fixed):
        return verdict("not confirmed", f"no positive baseline to compare with ({fixed})", None)
    cand.append(value)
    est = value / float(fixed)
    met = math.log(est) - math.log(ratio) >= -TOLERANCE
    return verdict("confirmed" if met else "not confirmed", where, (est, est, est))
