"""How well the throughput model predicted: each prediction made before a measurement, beside the
measurement, and their relative errors and interval coverage (what ``bench_model.py`` and the report
print)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from bisect_eagle.perf.values import Config, Prediction


@dataclass(frozen=True)
class ErrorRecord:
    """A prediction made before a measurement, and the measurement."""

    config: Config
    predicted: Prediction
    measured_tok_s: float
    measured_accept_length: float

    @property
    def rel_error(self) -> float:
        return abs(self.predicted.tok_s - self.measured_tok_s) / self.measured_tok_s

    @property
    def inside(self) -> bool:
        return self.predicted.low <= self.measured_tok_s <= self.predicted.high


@dataclass(frozen=True)
class ErrorReport:
    """Relative error of predictions made *before* each measurement."""

    n: int
    median_rel_error: float
    mean_rel_error: float
    p90_rel_error: float
    accept_length_median_rel_error: float
    coverage: float  # share of measurements inside [low, high]
    records: list[ErrorRecord]

    def to_json(self) -> dict[str, Any]:
        """The report as JSON, without its per-measurement ``records``.

        Returns:
            Every other field by name.
        """
        return {k: v for k, v in asdict(self).items() if k != "records"}


def error_report(records: Sequence[ErrorRecord]) -> ErrorReport:
    """Median (mean, p90) relative error of ``records``' predictions and the share inside their
    interval."""
    recs = list(records)
    if not recs:
        return ErrorReport(0, math.nan, math.nan, math.nan, math.nan, math.nan, [])
    errs = sorted(r.rel_error for r in recs)
    al_errs = [
        abs(r.predicted.accept_length - r.measured_accept_length) / r.measured_accept_length
        for r in recs
        if math.isfinite(r.measured_accept_length) and r.measured_accept_length > 0
    ]
    return ErrorReport(
        n=len(recs),
        median_rel_error=statistics.median(errs),
        mean_rel_error=statistics.fmean(errs),
        p90_rel_error=float(np.quantile(errs, 0.9)),
        accept_length_median_rel_error=statistics.median(al_errs) if al_errs else math.nan,
        coverage=sum(r.inside for r in recs) / len(recs),
        records=recs,
    )
