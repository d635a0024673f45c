"""Verdicts that survive noise: GOOD, BAD or UNRESOLVED from a sequence of samples of a higher-is-better metric.

The rule (:meth:`Judge.verdict`), a one-sided Student-t bound on the geometric mean:

- Model: ``log(sample) = log(true value) + ε`` with ``ε ~ N(0, σ²)`` and one ``σ`` for every configuration,
  i.e. noise relative to the value, as throughput noise is. ``σ`` is pooled from every configuration
  sampled more than once: ``s² = Σ_g Σ_i (y_gi − ȳ_g)² / ν`` with ``ν = Σ_g (n_g − 1)`` degrees of
  freedom. It is first estimated from the endpoints' repeats and refined as probes are sampled.
- The limit is ``threshold``, or ``ratio`` × the good configuration's geometric mean. The statistic is
  ``d = ȳ − log(threshold)`` with standard error ``s/√n``, or ``d = ȳ − ȳ_good − log(ratio)`` with
  ``s·√(1/n + 1/n_good)`` (the reference's own noise counts).
- GOOD when ``d − t·SE ≥ 0``, BAD when ``d + t·SE < 0``, UNRESOLVED in between, where
  ``t = t_{1 − α/L}(ν)``, ``α = 1 − confidence`` and ``L`` the number of looks the configuration's
  sampling schedule allows. A configuration is sampled on a doubling schedule (``n0, 2·n0, 4·n0, …,
  budget``) and judged after each step until it is GOOD or BAD or its budget is spent. By the union bound
  over the ``L`` looks, the chance that a configuration whose true value lies on one side of the limit is
  ever judged on the other side is at most ``α`` (exact for normal log-noise with known ``ν``; the pooled
  ``s`` is refined between looks, which this bound treats as fixed).
- In ratio mode the good configuration is the reference and is GOOD by definition (``d = −log(ratio)``
  with no noise: it is compared with itself). Its uncertainty enters every probe's bound, and it is shared
  by all of them, so while a probe is UNRESOLVED the reference is sampled (interleaved with the probe) up to
  twice the probe's count, within the endpoint budget.
- Without a noise estimate (``ν = 0``: every configuration sampled once, ``repeats = 1``) the limit alone
  decides, as a single measurement would.

The bad configuration and the good one in threshold mode are endpoints: they start at ``repeats`` samples
and may take up to ``endpoint_samples``, so an UNRESOLVED endpoint is sampled more before the bisect gives up.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bisect_eagle.bisect.ddmin import ProbeOutcome
from bisect_eagle.stats import log_values, schedule, t_quantile

STANDALONE_METRIC = "standalone_accuracy"
LIVE_METRICS = ("output_tok_s", "accept_length")
TOLERANCE = 1e-12  # on log-ratios: a deterministic value equal to the limit is at the limit


@dataclass
class NoisePool:
    """The pooled log-noise: every configuration's spread about its own mean, plus a prior from a replayed log."""

    groups: dict[str, list[float]] = field(default_factory=dict)  # key (plan fingerprint) -> log samples
    prior_ss: float = 0.0
    prior_dof: int = 0

    def observe(self, key: str, values: list[float]) -> None:
        """Record (or replace) one configuration's samples."""
        logs = log_values(values)
        if logs is not None:
            self.groups[key] = logs

    @property
    def dof(self) -> int:
        return self.prior_dof + sum(len(g) - 1 for g in self.groups.values())

    @property
    def sd(self) -> float:
        """Pooled standard deviation of log samples (≈ relative noise); 0 without degrees of freedom."""
        dof = self.dof
        if dof == 0:
            return 0.0
        ss = self.prior_ss
        for g in self.groups.values():
            mean = statistics.fmean(g)
            ss += sum((y - mean) ** 2 for y in g)
        return math.sqrt(ss / dof)

    def to_json(self) -> dict[str, Any]:
        return {"sd_log": self.sd, "dof": self.dof}


@dataclass
class Judge:
    """GOOD / BAD / UNRESOLVED for a configuration's samples (the rule is in the module docstring)."""

    metric: str = "output_tok_s"
    ratio: float = 0.9
    threshold: float | None = None
    confidence: float = 0.95
    repeats: int = 3  # first samples of each endpoint
    max_samples: int = 12  # sample budget of a probe
    endpoint_samples: int = 24  # sample budget of an endpoint
    reference: list[float] | None = None  # the good configuration's samples (ratio mode)
    noise: NoisePool = field(default_factory=NoisePool)

    @property
    def relative(self) -> bool:
        """Judged against ``ratio`` × the good configuration (else against ``threshold``)."""
        return self.threshold is None

    @property
    def limit(self) -> float | None:
        """The threshold, or ratio × the reference's geometric mean; None before the reference is measured."""
        if self.threshold is not None:
            return self.threshold
        logs = log_values(self.reference or [])
        return None if logs is None else self.ratio * math.exp(statistics.fmean(logs))

    def budget(self, *, endpoint: bool) -> tuple[int, int]:
        """(first samples, sample budget) of an endpoint or a probe."""
        if endpoint:
            return self.repeats, max(self.repeats, self.endpoint_samples)
        return 1, max(1, self.max_samples)

    def next_count(self, n: int, *, endpoint: bool) -> int | None:
        """The sample count of the next look after ``n`` samples, or None when the budget is spent."""
        start, budget = self.budget(endpoint=endpoint)
        return next((c for c in schedule(start, budget) if c > n), None)

    def verdict(self, values: list[float], *, endpoint: bool, is_reference: bool = False) -> tuple[ProbeOutcome, str]:
        """The verdict on ``values`` (one configuration's samples) and why, with the numbers."""
        if not values:
            return ProbeOutcome.UNRESOLVED, f"no {self.metric} sample"
        if any(not math.isfinite(v) for v in values):
            return ProbeOutcome.UNRESOLVED, f"{self.metric} is not a number ({values})"
        limit = self.limit
        if limit is None:
            raise ValueError("the judge needs the good configuration's samples first")
        logs = log_values(values)
        n = len(values)
        if logs is None or limit <= 0:  # a zero or negative value: no log scale; the limit alone decides
            median = statistics.median(values)
            what = f"{self.metric} median {median:.4g} of {n} vs limit {limit:.4g}"
            return (ProbeOutcome.GOOD if median >= limit else ProbeOutcome.BAD), what
        mean = statistics.fmean(logs)
        if is_reference and self.relative:
            d, factor = -math.log(self.ratio), 0.0
        elif self.relative:
            ref = log_values(self.reference or [])
            assert ref is not None
            d, factor = mean - statistics.fmean(ref) - math.log(self.ratio), math.sqrt(1 / n + 1 / len(ref))
        else:
            d, factor = mean - math.log(limit), math.sqrt(1 / n)
        sd, dof = self.noise.sd, self.noise.dof
        start, budget = self.budget(endpoint=endpoint)
        looks = len(schedule(start, budget))
        t = t_quantile(1 - (1 - self.confidence) / looks, dof) if dof > 0 else 0.0
        half = t * sd * factor
        what = (f"{self.metric} {math.exp(mean):.4g} (geometric mean of {n}) vs limit {limit:.4g}: "
                f"{100 * (math.exp(d) - 1):+.2f}% ± {100 * (math.exp(half) - 1):.2f}% "
                f"(noise {100 * sd:.2f}%, {dof} dof, {self.confidence:g} one-sided over {looks} looks)")
        if d - half >= -TOLERANCE:
            return ProbeOutcome.GOOD, what
        if d + half < -TOLERANCE:
            return ProbeOutcome.BAD, what
        return ProbeOutcome.UNRESOLVED, what + ": within the noise band"

    def decide(self, samples: list[float], *, key: str, endpoint: bool, more: Callable[[int], bool],
               is_reference: bool = False) -> tuple[ProbeOutcome, str]:
        """Judge ``samples`` on the sampling schedule, calling ``more(n)`` to grow them to ``n`` between looks.

        ``more`` returns False when it could not (the caller knows why). ``key`` names the configuration in
        the pooled noise estimate.
        """
        first, _ = self.budget(endpoint=endpoint)
        if len(samples) < first and not more(first):
            return ProbeOutcome.UNRESOLVED, "sampling stopped"
        while True:
            self.noise.observe(key, samples)
            outcome, what = self.verdict(samples, endpoint=endpoint, is_reference=is_reference)
            if outcome is not ProbeOutcome.UNRESOLVED:
                return outcome, what
            nxt = self.next_count(len(samples), endpoint=endpoint)
            if nxt is None:
                return outcome, f"{what}; sample budget spent ({len(samples)} samples)"
            if not more(nxt):
                return ProbeOutcome.UNRESOLVED, "sampling stopped"

    def settings(self) -> dict[str, Any]:
        """What a bisect log header and the parent run record (and ``--replay`` restores)."""
        return {"metric": self.metric, "ratio": self.ratio, "threshold": self.threshold,
                "confidence": self.confidence, "repeats": self.repeats, "max_samples": self.max_samples,
                "endpoint_samples": self.endpoint_samples}

    def restore(self, reference: Any, noise: Any) -> None:
        """The reference samples and noise estimate of a replayed log (older logs: ``{median, mad}``)."""
        if isinstance(reference, dict):
            samples = reference.get("samples")
            if isinstance(samples, list) and samples:
                self.reference = [float(v) for v in samples]
            elif "median" in reference:
                self.reference = [float(reference["median"])]
        if isinstance(noise, dict) and noise.get("dof"):
            dof = int(noise["dof"])
            self.noise.prior_dof, self.noise.prior_ss = dof, float(noise.get("sd_log", 0.0)) ** 2 * dof
