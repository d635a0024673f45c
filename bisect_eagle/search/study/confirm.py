"""Confirm success instead of assuming it: the candidate and the baseline re-measured interleaved,
with a bound.

A study's live trials are single measurements against a baseline measured once, so the first config
whose measurement clears the target may be a lucky draw. Before the study says "target reached" the
candidate is re-measured, interleaved with baseline launches where they are needed (candidate,
baseline, candidate, ...), as child runs of the study (stage ``confirm``), and judged on them (spec
``search.confirm``):

- Noise is relative, so everything is on logs. The estimate is ``exp(mean log candidate − mean log
  baseline)`` over the candidate's re-measurements and the baseline's launches; the bounds are
  ``exp(estimate ∓ t · s · √(1/n + 1/m))`` with ``s`` the noise pooled over every config the study
  re-measured (the candidate, the baseline, earlier candidates: the same deployment's noise) and ``t
  = t_{1 − α/L}(dof)``, ``α = 1 − confidence``, ``L`` the number of looks
  (:func:`bisect_eagle.stats.pooled_bounds`). With a fixed baseline (``baseline: <number>``) only
  the candidate is re-measured, against that number.
- This needs a baseline that does not drift. When the baseline's launches show a trend or an outlier
  (:func:`bisect_eagle.stats.drifted`: a busy neighbour, thermal throttling), every candidate launch
  is followed by a baseline launch and the bound is the paired one on adjacent launches, ``d_i =
  log(candidate_i) − log(baseline_i)``, from which a drift cancels
  (:func:`bisect_eagle.stats.ratio_bounds`).
- The candidate is judged at ``min_pairs`` re-measurements and then at doubling counts up to
  ``max_pairs`` (:func:`bisect_eagle.stats.schedule`); by the union bound over the looks, a
  candidate whose true ratio is below the criterion ratio is confirmed with probability at most
  ``α``.
- Confirmed when the lower bound is ≥ the criterion ratio; not confirmed as soon as the upper bound
  is below it (the sequential test concludes "below" and stops spending launches), when the budget
  is spent, or when a re-measurement fails.
- **An indifference zone.** A candidate next to the target would need many launches to tell from it.
  As soon as its upper bound is below ``(1 + δ) ×`` the criterion ratio (``indifference``), it
  cannot be shown to clear the target by more than ``δ``: it is set aside as ``at target`` (within
  δ), no more launches are spent on it, and the search looks for a config with more margin. With
  ``max_pairs`` candidate launches (8 by default) and at most one baseline launch each, no candidate
  spends more than ``2 · max_pairs`` launches.

Launches are what a confirmation costs (minutes to half an hour each for a large target), so it
spends them only where they buy certainty:

- **Not the search's measurement of a noisy metric.** The candidate is here because that measurement
  cleared the target, so it leans high (the winner's curse): as a first sample it keeps a lucky
  candidate's bound open for more launches, not fewer (a 1.1× lucky draw of a config 3 % below the
  target: 12 pairs instead of 3), and raises the chance of a false success. Every candidate sample
  is a fresh launch; a deterministic metric's one measurement is reused (it has no luck).
- **Rounds or launches.** A server engine measures several benchmark rounds on one launch, its cache
  flushed between them (:meth:`Engine.run_rounds <bisect_eagle.engines.base.Engine.run_rounds>`).
  How the noise splits between rounds (``σ_R²``) and launches (``σ_L²``) is measured from the
  confirmation's own launches (:func:`bisect_eagle.stats.variance_split`): the first launches
  measure ``first_rounds`` rounds each, later ones ``√(c · σ_R² / σ_L²)`` (``c``: a launch's
  measured seconds outside its rounds over a round's seconds;
  :func:`bisect_eagle.stats.best_rounds`), at most ``max_rounds``. Noise that lives in the rounds is
  averaged away on one launch; noise that lives in the launches needs launches. The bound stays on
  the launches' values (each launch's geometric mean over its rounds), which is right whatever the
  split: the split only decides how much each launch measures.
- **A shared baseline.** Baseline launches are kept on the study (``baseline_samples``, the study's
  own measurement first): a pair takes an unused one (newest first) instead of launching the
  baseline again while the newest baseline launch lies in the earlier ones' prediction interval
  (:func:`bisect_eagle.stats.drifted`: the machine has not moved; three launches are needed to
  tell). The baseline was not selected, so its earlier launches are as good as new ones.

The baseline samples also measure drift: ``baseline_drift`` is their geometric mean over the study's
first baseline measurement (the target was computed from that one).

**A confirmation is resumed, not repeated.** Every sample is a child run tagged with its
candidate (``confirm_of``), its role and its pair. When a process is killed during a confirmation
(SIGTERM, SIGKILL), the samples its finished runs measured are read back (:func:`logged_samples`)
by the next process that confirms the same candidate (``run --resume``): they are its first
samples, in the order they were launched, and only the remaining ones are launched (``resumed`` on
the verdict counts them). A look the killed process passed undecided is not taken again on more
samples.

Only what can change the verdict is measured (:func:`confirm_schedule` says what, and why, in the
progress output and on the verdict, field ``schedule``):

- For an ``accept_length`` criterion the baseline is not re-measured: without speculation every
  verify step yields one token, so its accept length is 1 by definition (a fixed baseline of 1).
- A metric the engine declares deterministic (:attr:`Engine.deterministic_metrics
  <bisect_eagle.engines.base.Engine.deterministic_metrics>`: greedy accept length on the local
  engine) has no noise to bound: the candidate is measured once, and the search's own measurement of
  the same plan is that measurement. The bound is the value itself: confirmed when ``candidate /
  baseline`` is at or above the criterion ratio, not confirmed below it (a deterministic baseline
  other than accept length's 1 is the study's own measurement of it).
- Every other metric (tok/s) is judged on interleaved pairs as above.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.spec.schema import Confirm
from bisect_eagle.stats import (
    UNIT_BASELINE_METRIC,
    best_rounds,
    deterministic,
    drifted,
    pooled_bounds,
    ratio_bounds,
    schedule,
    variance_split,
)
from bisect_eagle.tracking.owner import owner_alive
from bisect_eagle.trials.context import TrialContext
from bisect_eagle.trials.live import run_live_trial
from bisect_eagle.trials.record import TrialRecord

ConfirmStatus = Literal["confirmed", "not confirmed", "at target"]
TOLERANCE = 1e-12  # on log ratios: a deterministic value equal to the target is at the target


@dataclass(kw_only=True)
class Confirmation:
    """The verdict on one candidate, with its samples (``to_json`` goes on the outcome and the
    study)."""

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
    # the metric is deterministic: the bound is the value (one measurement)
    deterministic: bool = False
    launches: int = 0  # engine launches it made, a killed process's included (reuse costs none)
    # pairs whose baseline was an earlier launch (the study's, another candidate's)
    shared_baseline: int = 0
    # benchmark rounds of each candidate sample's launch
    rounds: list[int] = field(default_factory=list)
    # round_sd, launch_sd of the metric's logs
    noise_split: dict[str, float | None] = field(default_factory=dict)
    # baseline launches made here (Sample.to_json)
    new_baseline: list[dict[str, Any]] = field(default_factory=list)
    resumed: int = 0  # samples a killed process measured for this confirmation, taken from its runs

    @property
    def confirmed(self) -> bool:
        return self.status == "confirmed"

    def summary(self) -> str:
        """``confirmed, bound 1.04 ≥ 1.00``, ``not confirmed, bound 0.97 < 1.00`` or ``at target
        within 2 %, bound 0.99..1.01``: what the outcome says.

        Returns:
            The sentence.
        """
        if self.lower is None:
            return f"{self.status}: {self.detail}"
        if self.status == "at target":
            return (
                f"at target: {self.lower:.3f}..{self.upper:.3f} × baseline ({self.confidence:g} "
                f"bounds, {self.pairs} candidate launches, estimate {self.estimate:.3f}); "
                f"{self.detail}"
            )
        if self.deterministic:
            sign = "≥" if self.confirmed else "<"
            return (
                f"{self.status}, bound {self.lower:.3f} {sign} {self.ratio:g} × baseline; "
                f"deterministic: the value itself, one measurement ({self.detail})"
            )
        sign = "≥" if self.confirmed else "<"
        return (
            f"{self.status}, bound {self.lower:.3f} {sign} {self.ratio:g} × baseline; "
            f"{self.confidence:g} one-sided, {self.pairs} candidate launches, estimate "
            f"{self.estimate:.3f}"
        )

    def to_json(self) -> dict[str, Any]:
        """The confirmation as JSON.

        Returns:
            Every field by name (``dataclasses.asdict``).
        """
        return asdict(self)


def _positive(v: float | None) -> bool:
    return v is not None and math.isfinite(v) and v > 0


def confirm_schedule(ctx: TrialContext, *, baseline_measured: bool, settings: Confirm) -> str:
    """What the confirmation of a candidate of ``ctx``'s study measures, and why (one line for the
    progress output and the verdict). ``baseline_measured``: the study measures its baseline
    (``baseline: measure``)."""
    metric = ctx.metric
    unit = metric == UNIT_BASELINE_METRIC
    base = (
        "the baseline is 1 by definition"
        if unit
        else "the baseline is the study's own measurement"
        if baseline_measured
        else "the baseline is fixed"
    )
    if deterministic(ctx.engine, metric):
        why = (
            "under greedy decoding" if unit else f"on the {getattr(ctx.engine, 'name', '?')} engine"
        )
        return (
            f"confirmation: {metric} is deterministic {why}: one measurement of the candidate, "
            f"{base}"
        )
    pairs = f"{settings.min_pairs}..{settings.max_pairs}"
    rounds = (
        f"; {settings.first_rounds}..{settings.max_rounds} benchmark rounds a launch, from the "
        "measured noise split"
        if _shares_launch(ctx) and settings.max_rounds > 1
        else ""
    )
    if unit or not baseline_measured:
        return f"confirmation: the candidate re-measured {pairs} times, {base}{rounds}"
    return (
        f"confirmation: candidate and baseline re-measured interleaved, {pairs} pairs (earlier "
        f"baseline launches shared while they show no drift){rounds}"
    )


def _shares_launch(ctx: TrialContext) -> bool:
    return bool(getattr(ctx.engine, "rounds_share_launch", False))


@dataclass(kw_only=True)
class Sample:
    """One launch's measurement: its value (the geometric mean over its rounds), its run, and what
    the noise split and the cost of a launch are read from (``to_json`` goes on the study's
    ``baseline_samples``)."""

    value: float
    run_id: str
    rounds: int = 1
    sd_log: float | None = None  # sd of the rounds' log values (two or more rounds)
    launch_s: float | None = None  # the launch's seconds outside its rounds
    round_s: float | None = None  # one round's seconds

    @classmethod
    def of(cls, record: TrialRecord, metric: str) -> Sample:
        return cls.of_metrics(record.metrics, metric, run_id=record.run_id)

    @classmethod
    def of_metrics(cls, metrics: dict[str, float], metric: str, *, run_id: str) -> Sample:
        """The sample of a launch's metrics (a record's, or its run's as logged); its value is
        ``metric``'s."""
        rounds = int(metrics.get("rounds") or 1)
        wall = metrics.get("wall_s")
        return cls(
            value=float(metrics[metric]),
            run_id=run_id,
            rounds=rounds,
            sd_log=metrics.get(f"{metric}_round_sd_log"),
            launch_s=metrics.get("launch_s"),
            round_s=None if wall is None else wall / rounds,
        )

    def to_json(self) -> dict[str, Any]:
        """The sample as JSON.

        Returns:
            Every field by name (``dataclasses.asdict``).
        """
        return asdict(self)


ROLES = ("candidate", "baseline")


def logged_samples(ctx: TrialContext, fingerprint: str) -> list[tuple[str, Sample]]:
    """The samples of the confirmation of a candidate that killed processes measured.

    Args:
        ctx: the study's trial context (its store, parent run and criterion metric).
        fingerprint: the candidate's plan fingerprint (the runs' ``confirm_of`` tag).

    Returns:
        (role, sample) of each child run of the study tagged ``confirm_of`` = ``fingerprint``
        that finished ok and whose ``owner`` is a process of this host that no longer runs, in
        the order they were launched (a candidate launch, then the baseline launch paired with
        it). Runs of live processes and of other hosts, and killed launches, are left out.
    """
    order = []
    for run in ctx.tracking.child_runs(ctx.parent_run_id, "confirm"):
        tags, metrics = run.data.tags, run.data.metrics
        role, pair = tags.get("confirm_role"), tags.get("confirm_pair", "")
        if (
            tags.get("confirm_of") != fingerprint
            or role not in ROLES
            or not pair.isdigit()
            or run.info.status != "FINISHED"
            or tags.get("outcome") != "ok"
            or not _positive(metrics.get(ctx.metric))
            or owner_alive(tags.get("owner", "")) is not False
        ):
            continue
        # a candidate is tagged with the candidates before it, its baseline with those and itself
        at = 2 * int(pair) if role == "candidate" else 2 * int(pair) - 1
        order.append((at, role, Sample.of_metrics(metrics, ctx.metric, run_id=run.info.run_id)))
    return [(role, sample) for _, role, sample in sorted(order, key=lambda x: x[0])]


def confirm(
    ctx: TrialContext,
    *,
    candidate: TrialPlan,
    baseline: TrialPlan | None,
    settings: Confirm,
    ratio: float,
    first_baseline: float | None,
    known: tuple[float, str] | None = None,
    pool: list[Sample] | None = None,
    others: list[list[float]] | None = None,
    logged: list[tuple[str, Sample]] | None = None,
) -> Confirmation:
    """Re-measure ``candidate`` (and ``baseline`` where its launches so far do not serve; None for a
    fixed baseline) until the bound decides or the budget is spent; every launch one child run
    (stage ``confirm``) of the study.

    Args:
        ctx: the study's trial context (its engine, metric, baseline).
        candidate: the candidate's plan.
        baseline: the no-speculation plan, or None for a fixed baseline.
        settings: ``search.confirm``.
        ratio: the criterion ratio the lower bound must clear.
        first_baseline: the study's first baseline value (drift is measured against it).
        known: (value, run id) of the search's own measurement of this same plan: for a
            deterministic metric, the measurement (a noisy metric does not reuse it: the module
            docstring).
        pool: the study's baseline launches so far, oldest first (its own measurement first), paired
            with instead of a new baseline launch while the baseline launches show no drift. New
            baseline launches are on the verdict (``new_baseline``).
        others: earlier candidates' re-measurements (values): their spread is the same noise, pooled
            into the bound.
        logged: the samples a killed process measured for this confirmation
            (:func:`logged_samples`): taken as the first samples, never launched again.

    An ``accept_length`` criterion has a fixed baseline of 1 (``baseline`` is not measured); a
    deterministic metric (the module docstring) is measured once.

    Returns:
        The confirmation: its status, bounds, launches and run ids.
    """
    one = dataclasses.replace(
        ctx,
        spec=ctx.spec.model_copy(
            update={
                "search": ctx.spec.search.model_copy(update={"repeats": 1, "prune_below": None})
            }
        ),
    )
    steps = confirm_schedule(ctx, baseline_measured=baseline is not None, settings=settings)
    exact = deterministic(ctx.engine, ctx.metric)
    if ctx.metric == UNIT_BASELINE_METRIC:
        baseline, fixed = None, 1.0
    elif exact:  # a deterministic baseline: its one measurement (or the spec's number) is its value
        baseline, fixed = None, ctx.baseline
    else:
        fixed = None if baseline is not None else ctx.baseline
    run = _Confirming(
        ctx=one,
        candidate=candidate,
        baseline=baseline,
        settings=settings,
        ratio=ratio,
        first_baseline=first_baseline,
        steps=steps,
        exact=exact,
        logged=list(logged or []),
    )
    if exact:
        return run.once(known=known, fixed=fixed)
    return run.paired(fixed=fixed, pool=list(pool or []), others=list(others or []))


@dataclass(kw_only=True)
class _Confirming:
    """One candidate's confirmation in progress: its samples, runs and the verdict they lead to."""

    ctx: TrialContext
    candidate: TrialPlan
    baseline: TrialPlan | None
    settings: Confirm
    ratio: float
    first_baseline: float | None
    steps: str
    exact: bool
    cand: list[Sample] = field(default_factory=list)
    base: list[Sample] = field(default_factory=list)
    new_baseline: list[Sample] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    launches: int = 0
    shared: int = 0  # baseline launches from before this confirmation (the pool)
    logged: list[tuple[str, Sample]] = field(default_factory=list)  # a killed process's samples
    resumed: int = 0  # of them, those taken

    def verdict(
        self, status: ConfirmStatus, detail: str, bounds: tuple[float, float, float] | None
    ) -> Confirmation:
        """The confirmation with ``status`` and ``detail``, and what was measured.

        Args:
            status: the outcome.
            detail: why, in words.
            bounds: ``(estimate, lower, upper)`` ratio to the baseline, or None when not bounded.

        Returns:
            The confirmation.
        """
        est, lo, hi = bounds or (None, None, None)
        base = [b.value for b in self.base]
        drift = (
            math.exp(statistics.fmean(math.log(b) for b in base)) / self.first_baseline
            if base and _positive(self.first_baseline)
            else None
        )
        sigma_r2, sigma_l2 = self.split()
        return Confirmation(
            fingerprint=self.candidate.fingerprint,
            status=status,
            ratio=self.ratio,
            estimate=est,
            lower=lo,
            upper=hi,
            confidence=self.settings.confidence,
            pairs=len(self.cand),
            candidate=[c.value for c in self.cand],
            baseline=base,
            baseline_drift=drift,
            run_ids=self.run_ids,
            detail=detail,
            schedule=self.steps,
            deterministic=self.exact and bounds is not None,
            launches=self.launches,
            shared_baseline=self.shared,
            rounds=[c.rounds for c in self.cand],
            noise_split={"round_sd": _sd(sigma_r2), "launch_sd": _sd(sigma_l2)},
            new_baseline=[b.to_json() for b in self.new_baseline],
            resumed=self.resumed,
        )

    def split(self) -> tuple[float | None, float | None]:
        """(σ_R², σ_L²) of the metric's logs over this confirmation's launches
        (:func:`stats.variance_split`).

        Returns:
            ``(σ_R², σ_L²)``, each None where the launches cannot tell.
        """
        launches = [
            (role, math.log(x.value), x.rounds, x.sd_log)
            for role, xs in (("candidate", self.cand), ("baseline", self.base))
            for x in xs
        ]
        return variance_split(launches)

    def rounds(self) -> int:
        """Benchmark rounds for the next launch: 1 where rounds do not share a launch, else from the
        split.

        Returns:
            The number of rounds, at least 1 and at most ``max_rounds``.
        """
        if not _shares_launch(self.ctx) or self.settings.max_rounds == 1:
            return 1
        samples = [*self.cand, *self.base]
        launch = [x.launch_s for x in samples if x.launch_s is not None]
        per_round = [x.round_s for x in samples if x.round_s]
        cost = (
            statistics.median(launch) / statistics.median(per_round)
            if launch and per_round
            else 1.0
        )
        sigma_r2, sigma_l2 = self.split()
        return best_rounds(
            sigma_r2=sigma_r2,
            sigma_l2=sigma_l2,
            cost_ratio=cost,
            first=self.settings.first_rounds,
            most=self.settings.max_rounds,
        )

    def sample(self, plan: TrialPlan, role: str) -> Sample | None:
        """One launch of ``plan`` as a child run; its sample, or None when it failed.

        Args:
            plan: the plan to launch.
            role: ``candidate`` or ``baseline`` (the run's ``confirm_role`` tag).

        Returns:
            The sample, or None when the launch failed or gave no positive value.
        """
        rounds = self.rounds()
        record = run_live_trial(
            self.ctx,
            plan,
            stage="confirm",
            parent_run_id=self.ctx.parent_run_id,
            rounds=rounds,
            tags={
                "confirm_role": role,
                "confirm_of": self.candidate.fingerprint,
                "confirm_pair": str(len(self.cand)),
                "confirm_rounds": str(rounds),
            },
        )
        self.run_ids.append(record.run_id)
        self.launches += 1  # repeats 1: one launch (its rounds share it)
        if record.status != "ok" or not _positive(record.value):
            return None
        return Sample.of(record, self.ctx.metric)

    def paired(
        self, *, fixed: float | None, pool: list[Sample], others: list[list[float]]
    ) -> Confirmation:
        """Candidate launches, with baseline launches only while the baseline's launches so far
        cannot serve (fewer than the candidate's, or drift not ruled out), judged at the looks of
        the schedule: the pooled bound while the baseline shows no drift, else the paired bound on
        adjacent launches. A killed process's samples (``logged``) come first; a look it passed
        undecided is not taken again."""
        looks = schedule(self.settings.min_pairs, self.settings.max_pairs)
        self.base = list(pool) if fixed is None else []
        self.shared = len(self.base)
        # adjacent (candidate, baseline) launches: what a drift leaves
        pairs: list[tuple[float, float]] = []
        for role, x in self.logged:
            if role == "baseline" and (fixed is not None or not self.cand):
                continue
            self.run_ids.append(x.run_id)
            self.launches += 1
            self.resumed += 1
            if role == "candidate":
                self.cand.append(x)
            else:
                self.base.append(x)
                self.new_baseline.append(x)
                pairs.append((self.cand[-1].value, x.value))
        if self.logged and self.logged[-1][0] == "candidate":  # killed before its baseline's launch
            failed = self.pair(fixed, pairs)
            if failed is not None:
                return failed
        bounds, how = None, ""
        for count in looks:
            while len(self.cand) < count:
                a = self.sample(self.candidate, "candidate")
                if a is None:
                    return self.verdict(
                        "not confirmed",
                        f"the candidate failed when measured again (run {self.run_ids[-1]})",
                        None,
                    )
                self.cand.append(a)
                failed = self.pair(fixed, pairs)
                if failed is not None:
                    return failed
            if len(self.cand) > count:
                continue  # a look the killed process passed undecided (it measured on)
            cand = [c.value for c in self.cand]
            if fixed is not None:
                bounds, how = (
                    ratio_bounds(
                        cand, float(fixed), confidence=self.settings.confidence, looks=len(looks)
                    ),
                    "against the fixed baseline",
                )
            elif self.stable():
                *got, dof = pooled_bounds(
                    cand,
                    [b.value for b in self.base],
                    others=others,
                    confidence=self.settings.confidence,
                    looks=len(looks),
                )
                bounds = tuple(got)
                how = (
                    f"{len(self.base)} baseline launches ({self.shared} from earlier), noise "
                    f"pooled over {dof} degrees of freedom"
                )
            elif len(pairs) >= 2:
                bounds = ratio_bounds(
                    [c for c, _ in pairs],
                    [b for _, b in pairs],
                    confidence=self.settings.confidence,
                    looks=len(looks),
                )
                how = f"the baseline drifted: paired on {len(pairs)} adjacent launches"
            else:
                continue  # a drift with too few adjacent pairs to judge: measure on, in pairs
            if bounds[1] >= self.ratio:
                return self.verdict(
                    "confirmed", f"lower bound clears the criterion ratio; {how}", bounds
                )
            if bounds[2] < self.ratio:
                return self.verdict(
                    "not confirmed", f"upper bound below the criterion ratio; {how}", bounds
                )
            if bounds[2] < self.ratio * (1 + self.settings.indifference):
                return self.verdict(
                    "at target",
                    f"within {self.settings.indifference:.0%} of the target, and no more: set "
                    f"aside for a config with more margin; {how}",
                    bounds,
                )
        return self.verdict(
            "not confirmed",
            f"launch budget spent ({self.settings.max_pairs} candidate launches)"
            + (f"; {how}" if how else ""),
            bounds,
        )

    def pair(self, fixed: float | None, pairs: list[tuple[float, float]]) -> Confirmation | None:
        """After a candidate launch: a baseline launch unless the baseline is fixed or its launches
        so far serve (no drift, at least as many as the candidate's); the verdict when that launch
        failed, else None."""
        if fixed is not None or (self.stable() and len(self.base) >= len(self.cand)):
            return None
        b = self.sample(self.baseline, "baseline")
        if b is None:
            return self.verdict(
                "not confirmed",
                f"the baseline failed when measured again (run {self.run_ids[-1]})",
                None,
            )
        self.base.append(b)
        self.new_baseline.append(b)
        pairs.append((self.cand[-1].value, b.value))
        return None

    def stable(self) -> bool:
        """Whether the baseline's launches so far rule out a drift
        (:func:`bisect_eagle.stats.drifted`)."""
        return drifted([math.log(b.value) for b in self.base]) is False

    def once(self, *, known: tuple[float, str] | None, fixed: float | None) -> Confirmation:
        """A deterministic metric: one measurement of the candidate (``known``, else one launch)
        against ``fixed``."""
        logged = next((x for role, x in self.logged if role == "candidate"), None)
        if known is not None and _positive(known[0]):
            value, where = (
                known[0],
                f"the search's own measurement, run {known[1]}, of the same plan",
            )
            self.run_ids.append(known[1])
        elif logged is not None:  # measured by a process killed before its verdict
            value, where = logged.value, f"measured once, run {logged.run_id}, before a kill"
            self.run_ids.append(logged.run_id)
            self.launches, self.resumed = 1, 1
        else:
            got = self.sample(self.candidate, "candidate")
            if got is None:
                return self.verdict(
                    "not confirmed",
                    f"the candidate failed when measured again (run {self.run_ids[-1]})",
                    None,
                )
            value, where = got.value, f"measured once, run {self.run_ids[-1]}"
        if not _positive(fixed):
            return self.verdict(
                "not confirmed", f"no positive baseline to compare with ({fixed})", None
            )
        self.cand.append(Sample(value=value, run_id=self.run_ids[-1]))
        est = value / float(fixed)
        met = math.log(est) - math.log(self.ratio) >= -TOLERANCE
        return self.verdict("confirmed" if met else "not confirmed", where, (est, est, est))


def _sd(variance: float | None) -> float | None:
    return None if variance is None else math.sqrt(variance)
