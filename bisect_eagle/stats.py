"""The statistics every verdict uses, in one place: Student-t quantiles, intervals on log ratios, the doubling
sampling schedule, the median with its absolute deviation, and which metrics need no repeat.

Throughput noise is relative to the value, so every interval is on logs: a geometric mean and a Student-t
half-width ``t · s / √n``, exponentiated back to a ratio.
"""

from __future__ import annotations

import math
import statistics
from functools import lru_cache


@lru_cache(maxsize=256)
def t_quantile(p: float, dof: int) -> float:
    """The ``p`` quantile of Student's t with ``dof`` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(p, dof))


def schedule(start: int, budget: int) -> list[int]:
    """Sample counts at which a configuration is judged: ``start``, doubling, ending at ``budget``."""
    start = max(1, start)
    counts = [start]
    while counts[-1] < budget:
        counts.append(min(2 * counts[-1], budget))
    return counts


def log_values(values: list[float]) -> list[float] | None:
    """Natural logs of the samples, or None when one is not a positive number."""
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        return None
    return [math.log(v) for v in values]


def paired_speedup(ratios: list[float], *, confidence: float = 0.95) -> tuple[float, float, float]:
    """(geometric mean, lower, upper) of positive per-prompt ratios: a Student-t interval on their logs."""

    logs = [math.log(r) for r in ratios]
    if len(logs) < 2:
        return (math.exp(logs[0]),) * 3
    return log_interval(logs, p=0.5 + confidence / 2)


def ratio_bounds(candidate: list[float], baseline: list[float] | float, *, confidence: float,
                 looks: int) -> tuple[float, float, float]:
    """(estimate, lower, upper) of candidate / baseline over paired samples (the module docstring's rule).

    ``baseline`` is a list paired with ``candidate`` or one fixed number. Needs two or more positive pairs.
    """
    if isinstance(baseline, list):
        if len(baseline) != len(candidate):
            raise ValueError(f"{len(candidate)} candidate samples but {len(baseline)} baseline samples")
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
        p: the quantile of Student's t that sets the half-width (``0.975`` for a two-sided 95 % interval).
    """
    mean = statistics.fmean(logs)
    half = t_quantile(p, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def median_mad(values: list[float]) -> tuple[float, float]:
    """(median, median absolute deviation) of one or more values."""
    med = statistics.median(values)
    return med, statistics.median(abs(v - med) for v in values)


UNIT_BASELINE_METRIC = "accept_length"  # 1 without speculation, by definition: one token per verify step


def deterministic(engine: object, metric: str) -> bool:
    """Whether ``engine`` declares ``metric`` deterministic (``Engine.deterministic_metrics``): one measurement of a
    configuration is its value, so repeats, pairs and noise estimates are skipped."""
    return metric in tuple(getattr(engine, "deterministic_metrics", ()) or ())
