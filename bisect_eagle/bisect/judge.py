"""Verdicts that survive noise: GOOD, BAD or UNRESOLVED for a configuration's samples of a
higher-is-better metric, with the chance of any false verdict in the whole bisect bounded.

The rule (:meth:`Judge.verdict`):

- **Samples are launches.** One sample is one launch of the configuration (a server start); on an
  engine whose benchmark rounds share a launch its value is the geometric mean of the launch's
  rounds. Noise is relative, so everything is on logs: ``log(sample) = log(true value) + ε``, ``ε ~
  N(0, σ²)``, one ``σ`` for every configuration of the deployment. ``σ`` is pooled from every
  configuration launched more than once: ``s² = Σ_g Σ_i (y_gi − ȳ_g)² / ν`` with ``ν = Σ_g (n_g −
  1)`` degrees of freedom, first from the endpoints' repeats, then from every probe launched again.
- **The statistic.** The limit is ``threshold``, or ``ratio`` × the good configuration's geometric
  mean (the *reference*). ``d = ȳ − log(threshold)`` with standard error ``s/√n``, or ``d = ȳ −
  ȳ_good − log(ratio)`` with ``s·√(1/n + 1/n_good)`` (the reference's own noise counts).
- **Three values, one error budget.** GOOD when ``d − t·SE ≥ 0``, BAD when ``d + t·SE < 0``,
  UNRESOLVED in between, with ``t = t_{1 − α/K}(ν)``: ``α = 1 − confidence`` is the chance that
  *any* verdict of the whole bisect is on the wrong side of the limit, and ``K`` the most verdicts
  (*looks*) the bisect may take, its launch budget (every look follows a launch, or reads stored
  samples once). By the union bound over the ``K`` looks, the chance of any false verdict -- so of
  any false culprit, since a reported set needs a false verdict to be wrong -- is at most ``α``
  (exact for normal log-noise with a known ``σ``; the pooled ``s`` is refined between looks, which
  the bound treats as fixed). An UNRESOLVED configuration buys more launches on a doubling schedule
  (``1, 2, 4, …``) up to its sample budget, the reference interleaved with it (A B A B: a drift of
  the machine then moves both).
- **The shape of the requests.** A t bound on launch means cannot see a stall that hits some
  requests, or a wider spread. Where launches carry per-request throughput, the spread and tail of
  each launch's requests (its own mean removed, so a fast or slow launch does not count) are
  compared with the reference's: ``p = min(KS, MWU)`` as Chromium Pinpoint does
  (:func:`bisect_eagle.stats.shape_p`). A configuration whose shape differs at the same level
  ``α/K`` and whose slowest tenth of requests runs below ``ratio`` × the reference's slowest tenth
  is BAD ("the tail"), whatever its mean.
- In ratio mode the good configuration is the reference and is GOOD by definition (compared with
  itself).
- Without a noise estimate (``ν = 0``: every configuration launched once, ``repeats = 1``) the limit
  alone decides, as a single measurement would; a deterministic metric has no noise at all.

Every verdict also gives ``p_below``: the chance that the true value is below the limit given the
samples (flat prior on ``d``; ``t`` posterior), which :mod:`.posterior` turns into each candidate
set's probability.

The bad configuration and the good one in threshold mode are endpoints: they start at ``repeats``
samples and may take up to ``endpoint_samples``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bisect_eagle.bisect.ddmin import ProbeOutcome
from bisect_eagle.stats import (
    centred_logs,
    family_level,
    log_values,
    quantile,
    schedule,
    shape_p,
    t_cdf,
    t_quantile,
)

STANDALONE_METRIC = "standalone_accuracy"
LIVE_METRICS = ("output_tok_s", "accept_length")
TOLERANCE = 1e-12  # on log-ratios: a deterministic value equal to the limit is at the limit
TAIL = 0.1  # the slowest tenth of requests: the tail compared with the reference's
# The default launch budget (``bisect.max_launches``, so ``K``): room for four breaking sets among
# six changes (about 20 configurations), the endpoints' repeats and the good configuration launched
# again beside unresolved probes; a bisect with less to find stops long before it
# (``scripts/bench_bisect.py``).
MAX_LAUNCHES = 48


@dataclass
class NoisePool:
    """The pooled log-noise: every configuration's spread about its own mean, plus a prior from a
    replayed log."""

    # key (plan fingerprint) -> log samples
    groups: dict[str, list[float]] = field(default_factory=dict)
    prior_ss: float = 0.0
    prior_dof: int = 0

    def observe(self, key: str, values: list[float]) -> None:
        """Record (or replace) one configuration's samples.

        Args:
            key: the configuration's key.
            values: its samples, one per launch; not recorded when one is not a positive number.
        """
        logs = log_values(values)
        if logs is not None:
            self.groups[key] = logs

    @property
    def dof(self) -> int:
        return self.prior_dof + sum(len(g) - 1 for g in self.groups.values())

    @property
    def sd(self) -> float:
        """Pooled standard deviation of log samples (≈ relative noise); 0 without degrees of
        freedom."""
        dof = self.dof
        if dof == 0:
            return 0.0
        ss = self.prior_ss
        for g in self.groups.values():
            mean = statistics.fmean(g)
            ss += sum((y - mean) ** 2 for y in g)
        return math.sqrt(ss / dof)

    def to_json(self) -> dict[str, Any]:
        """The pooled estimate as JSON (the form a bisect log's ``# noise`` header holds).

        Returns:
            ``{"sd_log": sd, "dof": dof}``.
        """
        return {"sd_log": self.sd, "dof": self.dof}


@dataclass(frozen=True)
class Verdict:
    """One look's verdict on a configuration: the outcome, why (with the numbers), and what the
    posterior needs."""

    outcome: ProbeOutcome
    detail: str
    value: float | None = None  # the geometric mean of the launches (the statistic judged)
    p_below: float | None = None  # P(true value below the limit | samples); None: nothing measured
    # p of the requests' shape against the reference's (None: not compared)
    shape_p: float | None = None


@dataclass
class Judge:
    """GOOD / BAD / UNRESOLVED for a configuration's samples (the rule is in the module
    docstring)."""

    metric: str = "output_tok_s"
    ratio: float = 0.9
    threshold: float | None = None
    confidence: float = 0.95  # 1 − the chance of any false verdict in the whole bisect
    repeats: int = 3  # first samples of each endpoint
    max_samples: int = 6  # sample budget of a probe
    endpoint_samples: int = 12  # sample budget of an endpoint
    comparisons: int = MAX_LAUNCHES  # K: the most looks the bisect may take (its launch budget)
    reference: list[float] | None = None  # the good configuration's samples (ratio mode)
    reference_requests: list[list[float]] | None = None  # its per-request values, per launch
    noise: NoisePool = field(default_factory=NoisePool)
    looks: int = 0  # looks taken so far

    @property
    def relative(self) -> bool:
        """Judged against ``ratio`` × the good configuration (else against ``threshold``)."""
        return self.threshold is None

    @property
    def level(self) -> float:
        """Each look's one-sided level: ``α / K`` (module docstring)."""
        return family_level(1 - self.confidence, self.comparisons)

    @property
    def limit(self) -> float | None:
        """The threshold, or ratio × the reference's geometric mean; None before the reference is
        measured."""
        if self.threshold is not None:
            return self.threshold
        logs = log_values(self.reference or [])
        return None if logs is None else self.ratio * math.exp(statistics.fmean(logs))

    def budget(self, *, endpoint: bool) -> tuple[int, int]:
        """(first samples, sample budget) of an endpoint or a probe.

        Args:
            endpoint: True for the good or bad endpoint, False for a probe.

        Returns:
            ``(repeats, max(repeats, endpoint_samples))`` for an endpoint,
            ``(1, max(1, max_samples))`` for a probe.
        """
        if endpoint:
            return self.repeats, max(self.repeats, self.endpoint_samples)
        return 1, max(1, self.max_samples)

    def next_count(self, n: int, *, endpoint: bool) -> int | None:
        """The sample count of the next look after ``n`` samples, or None when the budget is
        spent."""
        start, budget = self.budget(endpoint=endpoint)
        return next((c for c in schedule(start, budget) if c > n), None)

    def verdict(
        self,
        values: list[float],
        *,
        endpoint: bool = False,
        is_reference: bool = False,
        requests: list[list[float]] | None = None,
    ) -> Verdict:
        """The verdict on ``values`` (one configuration's launches) and why, with the numbers;
        ``requests``: its per-request values per launch, for the shape test. Does not count a look
        (:meth:`decide` does).

        Args:
            values: the configuration's metric values, one per launch.
            endpoint: accepted as :meth:`decide` passes it; the verdict does not depend on it.
            is_reference: whether ``values`` are the reference's own: in ratio mode GOOD,
                stating the limit.
            requests: per launch, each request's value; None: no shape test.

        Returns:
            The verdict: UNRESOLVED without samples, with one not finite, or within the noise band;
            else GOOD or BAD; with its text, value and ``p_below``.

        Raises:
            ValueError: the judge has no limit yet (the good configuration's samples are missing).
        """
        if not values:
            return Verdict(ProbeOutcome.UNRESOLVED, f"no {self.metric} sample")
        if any(not math.isfinite(v) for v in values):
            return Verdict(ProbeOutcome.UNRESOLVED, f"{self.metric} is not a number ({values})")
        limit = self.limit
        if limit is None:
            raise ValueError("the judge needs the good configuration's samples first")
        logs = log_values(values)
        n = len(values)
        launches = f"{n} launch{'' if n == 1 else 'es'}"
        # a zero or negative value: no log scale; the limit alone decides
        if logs is None or limit <= 0:
            median = statistics.median(values)
            below = median < limit
            return Verdict(
                ProbeOutcome.BAD if below else ProbeOutcome.GOOD,
                f"{self.metric} median {median:.4g} of {launches} vs limit {limit:.4g}",
                median,
                1.0 if below else 0.0,
            )
        mean = statistics.fmean(logs)
        value = math.exp(mean)
        if is_reference and self.relative:
            return Verdict(
                ProbeOutcome.GOOD,
                f"{self.metric} {value:.4g} ({self._mean(n)}): the reference; the limit is "
                f"{self.ratio:g} × it = {limit:.4g}",
                value,
                0.0,
            )
        if self.relative:
            ref = log_values(self.reference or [])
            assert ref is not None
            d, factor = (
                mean - statistics.fmean(ref) - math.log(self.ratio),
                math.sqrt(1 / n + 1 / len(ref)),
            )
        else:
            d, factor = mean - math.log(limit), math.sqrt(1 / n)
        sd, dof = self.noise.sd, self.noise.dof
        head = (
            f"{self.metric} {value:.4g} ({self._mean(n)}) vs limit {limit:.4g}: {_pct(d)} from it"
        )
        if dof == 0 or sd == 0:
            exact = "deterministic" if dof > 0 else "no noise estimate yet: the value decides"
            below = d < -TOLERANCE
            return self._tail(
                Verdict(
                    ProbeOutcome.BAD if below else ProbeOutcome.GOOD,
                    f"{head} ({exact})",
                    value,
                    1.0 if below else 0.0,
                ),
                d,
                requests,
            )
        t = t_quantile(1 - self.level, dof)
        half = t * sd * factor
        p_below = t_cdf(-d / (sd * factor), dof)
        what = (
            f"{head} ± {100 * (math.exp(half) - 1):.2f}% (level {self.level:.2g} = "
            f"{1 - self.confidence:g} over {self.comparisons} looks; noise {100 * sd:.2f}% a "
            f"launch, {dof} dof)"
        )
        if d - half >= -TOLERANCE:
            outcome = ProbeOutcome.GOOD
        elif d + half < -TOLERANCE:
            outcome = ProbeOutcome.BAD
        else:
            outcome, what = ProbeOutcome.UNRESOLVED, what + ": within the noise band"
        return self._tail(Verdict(outcome, what, value, p_below), d, requests)

    def _mean(self, n: int) -> str:
        return "1 launch" if n == 1 else f"geometric mean of {n} launches"

    def _tail(self, verdict: Verdict, d: float, requests: list[list[float]] | None) -> Verdict:
        """A verdict that is not BAD by its mean, checked for a slow tail against the reference's
        requests."""
        ref = self.reference_requests
        if verdict.outcome is ProbeOutcome.BAD or not self.relative or not requests or not ref:
            return verdict
        p = shape_p(requests, ref)
        mine, theirs = centred_logs(requests), centred_logs(ref)
        if p >= self.level or len(mine) < 2 or len(theirs) < 2:
            return Verdict(verdict.outcome, verdict.detail, verdict.value, verdict.p_below, p)
        # the slowest tenth against ratio × the reference's
        tail = d + quantile(mine, TAIL) - quantile(theirs, TAIL)
        if tail >= -TOLERANCE:
            return Verdict(
                verdict.outcome,
                verdict.detail + f"; requests' shape differs (p {p:.2g}), tail not below",
                verdict.value,
                verdict.p_below,
                p,
            )
        return Verdict(
            ProbeOutcome.BAD,
            verdict.detail
            + f"; but its slowest tenth of requests runs {_pct(tail)} from the limit on the "
            f"reference's slowest tenth (requests' shape p {p:.2g} = min(KS, MWU) < "
            f"{self.level:.2g}): BAD by the tail",
            verdict.value,
            1.0,
            p,
        )

    def decide(
        self,
        samples: list[float],
        *,
        key: str,
        endpoint: bool,
        more: Callable[[int], bool],
        is_reference: bool = False,
        requests: list[list[float]] | None = None,
    ) -> Verdict:
        """Judge ``samples`` on the sampling schedule, calling ``more(n)`` to grow them to ``n``
        between looks.

        Args:
            samples: the configuration's launch values so far (grown in place by ``more``).
            key: names the configuration in the pooled noise estimate.
            endpoint: an endpoint's schedule and budget.
            more: grows the samples (and ``requests``) to ``n``; False when it could not (the caller
                knows why).
            is_reference: the good configuration in ratio mode.
            requests: per-request values per launch (grown by ``more``), for the shape test.

        Every look but the reference's (GOOD by definition) counts toward ``K``; with ``K`` spent
        the verdict is UNRESOLVED.
        """
        first, _ = self.budget(endpoint=endpoint)
        if len(samples) < first and not more(first):
            return Verdict(ProbeOutcome.UNRESOLVED, "sampling stopped")
        while True:
            if not (is_reference and self.relative):
                if self.looks >= self.comparisons:
                    return Verdict(
                        ProbeOutcome.UNRESOLVED, f"the bisect's {self.comparisons} looks are spent"
                    )
                self.looks += 1
            self.noise.observe(key, samples)
            v = self.verdict(
                samples, endpoint=endpoint, is_reference=is_reference, requests=requests
            )
            if v.outcome is not ProbeOutcome.UNRESOLVED:
                return v
            nxt = self.next_count(len(samples), endpoint=endpoint)
            if nxt is None:
                return Verdict(
                    v.outcome,
                    f"{v.detail}; sample budget spent ({len(samples)} launches)",
                    v.value,
                    v.p_below,
                    v.shape_p,
                )
            if not more(nxt):
                return Verdict(
                    ProbeOutcome.UNRESOLVED,
                    f"{v.detail}; sampling stopped",
                    v.value,
                    v.p_below,
                    v.shape_p,
                )

    def predict(self, values: list[float]) -> Verdict:
        """The verdict on samples derived from a configuration's launches (e.g. scaled to another
        accept length), not launches of their own: a look (it counts toward ``K``; UNRESOLVED once
        ``K`` is spent), never added to the pooled noise.

        Args:
            values: the derived samples, one per launch they come from.

        Returns:
            The verdict (:meth:`verdict`), or UNRESOLVED once the bisect's looks are spent.
        """
        if self.looks >= self.comparisons:
            return Verdict(
                ProbeOutcome.UNRESOLVED, f"the bisect's {self.comparisons} looks are spent"
            )
        self.looks += 1
        return self.verdict(values)

    def settings(self) -> dict[str, Any]:
        """What a bisect log header and the parent run record (and ``--replay`` restores).

        Returns:
            ``metric``, ``ratio``, ``threshold``, ``confidence``, ``repeats``, ``max_samples``,
            ``endpoint_samples`` and ``comparisons``.
        """
        return {
            "metric": self.metric,
            "ratio": self.ratio,
            "threshold": self.threshold,
            "confidence": self.confidence,
            "repeats": self.repeats,
            "max_samples": self.max_samples,
            "endpoint_samples": self.endpoint_samples,
            "comparisons": self.comparisons,
        }

    def restore(self, reference: Any, noise: Any) -> None:
        """The reference samples and noise estimate of a replayed log (older logs: ``{median,
        mad}``)."""
        if isinstance(reference, dict):
            samples = reference.get("samples")
            if isinstance(samples, list) and samples:
                self.reference = [float(v) for v in samples]
            elif "median" in reference:
                self.reference = [float(reference["median"])]
        if isinstance(noise, dict) and noise.get("dof"):
            dof = int(noise["dof"])
            self.noise.prior_dof, self.noise.prior_ss = (
                dof,
                float(noise.get("sd_log", 0.0)) ** 2 * dof,
            )


def _pct(log_ratio: float) -> str:
    return f"{100 * (math.exp(log_ratio) - 1):+.1f}%"
