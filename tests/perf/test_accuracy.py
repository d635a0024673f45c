"""The model's accuracy report: relative errors of predictions made before each measurement, and
coverage."""

from __future__ import annotations

import math

import pytest

from bisect_eagle.perf.accuracy import ErrorRecord, error_report
from bisect_eagle.perf.model import Config, Prediction

CFG = Config(wiring=(1, 5, 9), num_steps=3, topk=1, num_draft_tokens=4, batch=1, context=())


def record(predicted: float, measured: float, *, low: float, high: float) -> ErrorRecord:
    return ErrorRecord(
        CFG, Prediction(tok_s=predicted, accept_length=2.0, low=low, high=high), measured, 2.5
    )


def test_errors_and_coverage_of_the_records():
    report = error_report([record(110, 100, low=90, high=120), record(50, 100, low=40, high=60)])
    assert report.n == 2 and report.median_rel_error == pytest.approx(0.3)
    assert report.coverage == 0.5 and report.accept_length_median_rel_error == pytest.approx(0.2)


def test_no_record_is_nan_not_zero():
    report = error_report([])
    assert report.n == 0 and math.isnan(report.median_rel_error) and math.isnan(report.coverage)
