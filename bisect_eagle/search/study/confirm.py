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
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.spec.schema import Confirm
from bisect_eagle.stats import ratio_bounds, schedule
from bisect_eagle.trials.live import run_live_trial
from bisect_eagle.trials.record import TrialContext

ConfirmStatus = Literal["confirmed", "not confirmed"]


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

    @property
    def confirmed(self) -> bool:
        return self.status == "confirmed"

    def summary(self) -> str:
        """``confirmed, bound 1.04 ≥ 1.00`` or ``not confirmed, bound 0.97 < 1.00``: what the outcome says."""
        if self.lower is None:
            return f"{self.status}: {self.detail}"
        sign = "≥" if self.confirmed else "<"
        return (f"{self.status}, bound {self.lower:.3f} {sign} {self.ratio:g} × baseline; "
                f"{self.confidence:g} one-sided, {self.pairs} pairs, estimate {self.estimate:.3f}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _positive(v: float | None) -> bool:
    return v is not None and math.isfinite(v) and v > 0


def confirm(ctx: TrialContext, *, candidate: TrialPlan, baseline: TrialPlan | None, settings: Confirm,
            ratio: float, first_baseline: float | None) -> Confirmation:
    """Re-measure ``candidate`` (and ``baseline``, interleaved; None for a fixed baseline) until the bound
    decides or the pair budget is spent; every measurement one child run (stage ``confirm``) of the study."""
    one = dataclasses.replace(ctx, spec=ctx.spec.model_copy(update={
        "search": ctx.spec.search.model_copy(update={"repeats": 1, "prune_below": None})}))
    looks = schedule(settings.min_pairs, settings.max_pairs)
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
                            baseline=base, baseline_drift=drift, run_ids=run_ids, detail=detail)

    def sample(plan: TrialPlan, role: str) -> float | None:
        record = run_live_trial(one, plan, stage="confirm", parent_run_id=ctx.parent_run_id,
                                tags={"confirm_role": role, "confirm_of": candidate.fingerprint,
                                      "confirm_pair": str(len(cand))})
        run_ids.append(record.run_id)
        return record.value if record.status == "ok" and _positive(record.value) else None

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
