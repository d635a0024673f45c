"""The statistics every verdict uses, in one place: Student-t quantiles, intervals on log ratios,
the doubling sampling schedule, the median with its absolute deviation, and which metrics need no
repeat.

Throughput noise is relative to the value, so every interval is on logs: a geometric mean and a
Student-t half-width ``t · s / √n``, exponentiated back to a ratio.
"""

from __future__ import annotations

import math
import statistics
from functools import lru_cache


@lru_cache(maxsize=256)
def t_quantile(p: float, dof: int) -> float:
    """The ``p`` quantile of Student's t with ``dof`` degrees of freedom.

    Args:
        p: the probability, in (0, 1) (``0.975`` for the upper end of a two-sided 95 % interval).
        dof: degrees of freedom (≥ 1; scipy gives NaN below).

    Returns:
        The quantile (cached per ``(p, dof)``).
    """
    from scipy.stats import t

    return float(t.ppf(p, dof))


def schedule(start: int, budget: int) -> list[int]:
    """Sample counts at which a configuration is judged: ``start``, doubling, ending at ``budget``.

    Args:
        start: the first count (raised to 1 when lower).
        budget: the last count; at or below ``start`` the schedule is ``[start]`` alone.

    Returns:
        The increasing counts, ``start`` first and ``max(start, budget)`` last.
    """
    start = max(1, start)
    counts = [start]
    while counts[-1] < budget:
        counts.append(min(2 * counts[-1], budget))
    return counts


def log_values(values: list[float]) -> list[float] | None:
    """Natural logs of the samples, or None when one is not a positive number.

    Args:
        values: the samples (tok/s, seconds: anything on a ratio scale).

    Returns:
        ``[log(v) for v in values]``, in order; None when ``values`` is empty or holds a value
        that is not finite or not positive.
    """
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        return None
    return [math.log(v) for v in values]


def paired_speedup(ratios: list[float], *, confidence: float = 0.95) -> tuple[float, float, float]:
    """(geometric mean, lower, upper) of positive per-prompt ratios: a Student-t interval on their
    logs.

    Args:
        ratios: one or more positive ratios (one a prompt: candidate over baseline).
        confidence: two-sided coverage of the interval (0.95: the 2.5 % and 97.5 % ends).

    Returns:
        ``(geometric mean, lower, upper)``; all three the one ratio when there is a single one.

    Raises:
        ValueError: a ratio that is not positive (its log is undefined).
    """

    logs = [math.log(r) for r in ratios]
    if len(logs) < 2:
        return (math.exp(logs[0]),) * 3
    return log_interval(logs, p=0.5 + confidence / 2)


def ratio_bounds(
    candidate: list[float], baseline: list[float] | float, *, confidence: float, looks: int
) -> tuple[float, float, float]:
    """(estimate, lower, upper) of candidate / baseline over paired samples (the module docstring's
    rule).

    Args:
        candidate: the candidate's positive samples.
        baseline: positive samples paired with ``candidate`` (same length, same order), or one fixed
            positive number every candidate sample is divided by.
        confidence: one-sided, over ``looks`` looks (union bound): the lower bound's quantile is
            ``1 − (1 − confidence) / looks``.
        looks: how many times the bound is judged (≥ 1).

    Returns:
        ``(geometric estimate, lower, upper)`` of the ratio.

    Raises:
        ValueError: ``baseline`` is a list of another length than ``candidate``, fewer than two
            pairs, or a sample that is not positive.
    """
    if isinstance(baseline, list):
        if len(baseline) != len(candidate):
            raise ValueError(
                f"{len(candidate)} candidate samples but {len(baseline)} baseline samples"
            )
        d = [math.log(a) - math.log(b) for a, b in zip(candidate, baseline, strict=True)]
    else:
        d = [math.log(a) - math.log(baseline) for a in candidate]
    if len(d) < 2:
        raise ValueError("a bound needs at least two pairs")
    return log_interval(d, p=1 - (1 - confidence) / looks)


def log_interval(logs: list[float], *, p: float) -> tuple[float, float, float]:
    """(geometric estimate, lower, upper) from log values: ``exp(mean ∓ t_p(n − 1) · s / √n)``.

    Args:
        logs: two or more log values (log ratios or log samples).
        p: the quantile of Student's t that sets the half-width (``0.975`` for a two-sided 95 %
            interval).

    Returns:
        ``(exp(mean), exp(mean − half), exp(mean + half))``.
    """
    mean = statistics.fmean(logs)
    half = t_quantile(p, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def median_mad(values: list[float]) -> tuple[float, float]:
    """(median, median absolute deviation) of one or more values.

    Args:
        values: one or more numbers (an empty list raises ``statistics.StatisticsError``).

    Returns:
        ``(median, median of |v − median|)``, both in the values' unit (the MAD is not scaled to a
        standard deviation).
    """
    med = statistics.median(values)
    return med, statistics.median(abs(v - med) for v in values)


# 1 without speculation, by definition: one token per verify step
UNIT_BASELINE_METRIC = "accept_length"


def deterministic(engine: object, metric: str) -> bool:
    """Whether ``engine`` declares ``metric`` deterministic (``Engine.deterministic_metrics``): one
    measurement of a configuration is its value, so repeats, pairs and noise estimates are skipped.

    Args:
        engine: an engine instance or class; one without ``deterministic_metrics`` declares none.
        metric: the metric's name (``"accept_length"``, ``"tok_per_s"``).

    Returns:
        True when ``metric`` is among the engine's deterministic metrics.
    """
    return metric in tuple(getattr(engine, "deterministic_metrics", ()) or ())


def variance_split(
    launches: list[tuple[str, float, int, float | None]],
) -> tuple[float | None, float | None]:
    """How the noise of a log metric splits between benchmark rounds on one launch and launches
    (restarts).

    One-way random effects, each config on its own: a launch's log value is ``μ_config + L + R̄``,
    its launch effect ``L ~ N(0, σ_L²)`` and the mean of its ``k`` rounds' noise ``R̄ ~ N(0,
    σ_R²/k)``.

    Args:
        launches: ``(config, log of the launch's geometric-mean value, rounds k, sd of its rounds'
            logs or None)`` for every launch measured (a config is any key: a plan's fingerprint).

    Returns:
        ``(σ_R², σ_L²)``: the within-launch variance pooled over launches of two or more rounds, and
        the between-launch variance (the pooled variance of a config's launch values less ``σ_R² ·
        mean(1/k)``, at least 0); None where the launches cannot tell (no launch of two rounds; no
        config launched twice).
    """
    within = [(k - 1, sd * sd) for _, _, k, sd in launches if k >= 2 and sd is not None]
    sigma_r2 = sum(d * v for d, v in within) / sum(d for d, _ in within) if within else None
    by_config: dict[str, list[tuple[float, int]]] = {}
    for config, value, k, _ in launches:
        by_config.setdefault(config, []).append((value, k))
    groups = [g for g in by_config.values() if len(g) >= 2]
    if not groups or sigma_r2 is None:
        return sigma_r2, None
    dof = sum(len(g) - 1 for g in groups)
    between = sum((len(g) - 1) * statistics.variance([v for v, _ in g]) for g in groups) / dof
    inv_k = statistics.fmean(1 / k for g in groups for _, k in g)
    return sigma_r2, max(0.0, between - sigma_r2 * inv_k)


def best_rounds(
    *, sigma_r2: float | None, sigma_l2: float | None, cost_ratio: float, first: int, most: int
) -> int:
    """Benchmark rounds per launch that buy the most certainty per second: ``√(cost_ratio · σ_R² /
    σ_L²)``, the optimum of two-stage sampling (a launch costs ``cost_ratio`` rounds), within
    ``1..most``.

    Args:
        sigma_r2, sigma_l2: :func:`variance_split`'s estimates (None: not measured yet).
        cost_ratio: a launch's seconds outside its rounds over one round's seconds.
        first: the rounds while either variance is unmeasured (enough to measure ``σ_R²``).
        most: the cap (rounds of one launch).

    Returns:
        The rounds, in ``1..most``: ``min(first, most)`` (at least 1) while a variance is None;
        1 when ``σ_R²`` is 0; ``most`` when ``σ_L²`` is 0.
    """
    if sigma_r2 is None or sigma_l2 is None:
        return max(1, min(first, most))
    if sigma_r2 <= 0:
        return 1
    if sigma_l2 <= 0:
        return most
    return max(1, min(most, round(math.sqrt(max(cost_ratio, 0.0) * sigma_r2 / sigma_l2))))


def drifted(logs: list[float], *, confidence: float = 0.95) -> bool | None:
    """Whether repeated measurements of one config (log values, oldest first) show the machine
    moving: a trend (the least-squares slope over the launch order differs from 0 at ``confidence``,
    two-sided) or a newest value outside the earlier ones' prediction interval ``mean ± t · s · √(1
    + 1/m)``.

    Args:
        logs: log values of one config's launches, oldest first.
        confidence: two-sided level of both tests (0.95).

    Returns:
        True for a trend or an outlying newest value, False for neither; None with fewer than three
        values (no spread to judge by).
    """
    n = len(logs)
    if n < 3:
        return None
    t = t_quantile(0.5 + confidence / 2, n - 2)
    xs = range(n)
    x_mean, y_mean = (n - 1) / 2, statistics.fmean(logs)
    sxx = sum((x - x_mean) ** 2 for x in xs)
    slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, logs, strict=True)) / sxx
    resid = sum((y - y_mean - slope * (x - x_mean)) ** 2 for x, y in zip(xs, logs, strict=True))
    if abs(slope) > t * math.sqrt(resid / (n - 2) / sxx) + 1e-12:
        return True
    earlier, newest = logs[:-1], logs[-1]
    half = (
        t_quantile(0.5 + confidence / 2, len(earlier) - 1)
        * statistics.stdev(earlier)
        * math.sqrt(1 + 1 / len(earlier))
    )
    return abs(newest - statistics.fmean(earlier)) > half + 1e-12


def pooled_bounds(
    candidate: list[float],
    baseline: list[float],
    *,
    others: list[list[float]],
    confidence: float,
    looks: int,
) -> tuple[float, float, float, int]:
    """(estimate, lower, upper, degrees of freedom) of candidate / baseline from two samples of
    launches, the noise measured on every repeated config of the study.

    Noise is relative (a log scale) and the same for every config of one deployment, so its variance
    ``s²`` is pooled over the candidate's launches, the baseline's and ``others`` (other configs'
    repeated launches): each group adds its sum of squares about its own mean and ``len − 1``
    degrees of freedom. The estimate is ``exp(mean log candidate − mean log baseline)``, the bounds
    ``exp(estimate ∓ t · s · √(1/n + 1/m))`` with ``t = t_{1 − (1 − confidence)/looks}(dof)``.
    Unlike :func:`ratio_bounds` nothing is paired, so a baseline's launches serve every candidate,
    and the quantile's degrees of freedom grow with everything the study re-measured, not with this
    candidate's pairs alone; it needs a machine that does not drift (:func:`drifted`), where pairing
    is what cancels a drift.

    Args:
        candidate, baseline: one or more positive values each (a launch's value, the geometric mean
            of its rounds).
        others: positive values of other configs' launches; groups of one add nothing.
        confidence: one-sided, over ``looks`` looks (union bound).
        looks: how many times the bound is judged.

    Returns:
        ``(estimate, lower, upper, dof)``: the ratio's geometric estimate, its bounds, and the
        pooled degrees of freedom of the t quantile.

    Raises:
        ValueError: no degrees of freedom (every group a single launch), or a value that is not
            positive.
    """
    groups = [log_values(g) for g in (candidate, baseline, *others) if g]
    if any(g is None for g in groups):
        raise ValueError("every value must be a positive number")
    dof = sum(len(g) - 1 for g in groups)
    if dof < 1:
        raise ValueError("a pooled bound needs a config launched twice")
    ss = sum(sum((x - statistics.fmean(g)) ** 2 for x in g) for g in groups)
    c, b = groups[0], groups[1]
    diff = statistics.fmean(c) - statistics.fmean(b)
    half = (
        t_quantile(1 - (1 - confidence) / looks, dof)
        * math.sqrt(ss / dof)
        * math.sqrt(1 / len(c) + 1 / len(b))
    )
    return math.exp(diff), math.exp(diff - half), math.exp(diff + half), dof


def family_level(alpha: float, comparisons: int) -> float:
    """The level of each of ``comparisons`` tests so that the chance that any of them errs is at
    most ``alpha`` (Bonferroni: the union bound, whatever the tests' dependence).

    Args:
        alpha: the family-wise error rate (0.05: 5 %).
        comparisons: the most tests the family can make (at least 1).

    Returns:
        ``alpha / comparisons``.
    """
    return alpha / max(1, comparisons)


def t_cdf(x: float, dof: int) -> float:
    """The distribution function of Student's t with ``dof`` degrees of freedom at ``x`` (the
    normal's without degrees of freedom).

    Args:
        x: the point.
        dof: degrees of freedom; 0 or less uses the standard normal.

    Returns:
        ``P(T ≤ x)``, in [0, 1].
    """
    from scipy.stats import norm, t

    return float(t.cdf(x, dof)) if dof > 0 else float(norm.cdf(x))


def distribution_p(a: list[float], b: list[float]) -> float:
    """Two samples drawn from one distribution? Chromium Pinpoint's p: the smaller of the two-sided
    Kolmogorov–Smirnov and Mann–Whitney U p-values. KS sees a change of spread or tail, MWU a shift.

    Args:
        a, b: one or more values each.

    Returns:
        ``min(p_KS, p_MWU)``; 1.0 when either sample is empty or every value is one number (nothing
        differs).
    """
    from scipy.stats import ks_2samp, mannwhitneyu

    if not a or not b or len({*a, *b}) == 1:
        return 1.0
    return float(min(ks_2samp(a, b).pvalue, mannwhitneyu(a, b, alternative="two-sided").pvalue))


def centred_logs(launches: list[list[float]]) -> list[float]:
    """Per-request log values with each launch's mean removed: the spread and tail within launches,
    free of the launch effect (a launch that runs 2 % fast moves all its requests together).
    Launches of one request, or with a value that is not positive, add nothing.

    Args:
        launches: per-request values (tok/s) grouped by launch.

    Returns:
        Every kept launch's ``log(v) − mean(log)``, launch by launch in order; empty when none
        is kept.
    """
    out: list[float] = []
    for values in launches:
        logs = log_values(values) if len(values) >= 2 else None
        if logs is not None:
            mean = statistics.fmean(logs)
            out.extend(x - mean for x in logs)
    return out


def shape_p(candidate: list[list[float]], reference: list[list[float]]) -> float:
    """Whether the spread or tail of per-request values differs between two configurations, the
    launch effects removed (:func:`centred_logs`): :func:`distribution_p` on the centred logs (KS:
    any change of shape) and on their absolute values (MWU there: a change of spread), the smaller
    p.

    Within one launch requests are taken as independent; between launches only the shape is
    compared, so a launch that runs fast or slow as a whole does not count as a difference (the mean
    is judged on launch values).

    Args:
        candidate, reference: per-request values (tok/s), grouped by launch.

    Returns:
        The p-value; 1.0 when either side has fewer than two centred values.
    """
    a, b = centred_logs(candidate), centred_logs(reference)
    if len(a) < 2 or len(b) < 2:
        return 1.0
    return min(distribution_p(a, b), distribution_p([abs(x) for x in a], [abs(x) for x in b]))


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of one or more values (linear interpolation between order statistics).

    Args:
        values: one or more numbers, in any order.
        q: the probability, in [0, 1] (0.5: the median).

    Returns:
        The interpolated quantile (numpy's default ``linear`` method).
    """
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(xs) - 1)
    return xs[low] + (xs[high] - xs[low]) * (pos - low)
