"""One plan fingerprint's measurement in a bisect: its launches' values, rounds, accept lengths,
acceptance curves and per-request throughput (what every probe planning to it shares), and a probe's
record of where its answer came from."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Literal

from bisect_eagle.bisect.judge import Verdict
from bisect_eagle.engines.base import TrialResult
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.stats import log_values

Source = Literal["measured", "cache", "memory", "replay"]


@dataclass
class Measurement:
    """The samples of one plan fingerprint, shared by every probe that plans to it."""

    fingerprint: str
    source: Literal["measured", "cache"]
    plan: TrialPlan | None = field(default=None, repr=False)
    run_id: str | None = None  # the trial's run (for cached ones: measured before this bisect)
    log_run_id: str | None = None  # where this bisect records its samples
    samples: list[float] = field(default_factory=list)  # one per launch
    metrics: dict[str, float] = field(default_factory=dict)
    effective: dict[str, Any] | None = None
    failure: str = ""  # why it cannot be judged
    # per launch: each request's tok/s (when known)
    requests: list[list[float]] = field(default_factory=list)
    # per launch measured here: its benchmark rounds
    rounds: list[int] = field(default_factory=list)
    # per launch measured here: sd of its rounds' logs
    round_sd: list[float | None] = field(default_factory=list)
    # per launch measured here: its accept length
    accept_lengths: list[float] = field(default_factory=list)
    # per launch measured here: accept_rate_per_position
    curves: list[list[float]] = field(default_factory=list)
    verdict: Verdict | None = None  # the last verdict
    judged_at: tuple[int, int] = (-1, -1)  # (samples, reference samples) when it was given

    @property
    def value(self) -> float | None:
        """The geometric mean of its launches (what the judge compares)."""
        logs = log_values(self.samples)
        return None if logs is None else math.exp(statistics.fmean(logs))

    @property
    def accept_length(self) -> float | None:
        """The mean accept length of its launches (the trial's own when its launches were not seen
        here)."""
        values = [v for v in self.accept_lengths if math.isfinite(v)]
        if values:
            return statistics.fmean(values)
        value = self.metrics.get("accept_length")
        return float(value) if value is not None and math.isfinite(value) else None


@dataclass
class ProbeRecord:
    """One probe: its measurement (None when replayed or when it could not even be planned)."""

    source: Source
    child_run_id: str | None = None  # this probe's child run of the bisect
    measurement: Measurement | None = None
    failure: str = ""

    def to_json(self) -> dict[str, Any]:
        """The probe as a bisect's JSON report shows it.

        Returns:
            ``source``, ``child_run_id`` and the measurement's fingerprint, run id, value,
            median, samples, rounds, ``p_below``, ``shape_p`` and effective settings (None, or
            an empty list, without a measurement).
        """
        m = self.measurement
        samples = list(m.samples) if m else []
        v = m.verdict if m else None
        return {
            "source": self.source,
            "fingerprint": m.fingerprint if m else None,
            "run_id": m.run_id if m else None,
            "child_run_id": self.child_run_id,
            "value": m.value if m else None,
            "median": statistics.median(samples) if samples else None,
            "samples": samples,
            "rounds": list(m.rounds) if m else [],
            "p_below": v.p_below if v else None,
            "shape_p": v.shape_p if v else None,
            "effective": m.effective if m else None,
        }


def launch_detail(m: Measurement, result: TrialResult, metric: str) -> None:
    """The rounds of a launch and its requests' tok/s, onto ``m`` (its value is already there)."""
    m.rounds.append(result.rounds)
    m.accept_lengths.append(result.accept_length)
    m.curves.append(list(result.accept_rate_per_position))
    logs = log_values(result.round_values.get(metric, []))
    m.round_sd.append(statistics.stdev(logs) if logs is not None and len(logs) >= 2 else None)
    rates = [
        r.completion_tokens / r.latency_s
        for r in result.requests
        if r.latency_s > 0 and r.completion_tokens
    ]
    if rates:
        m.requests.append(rates)
