"""The throughput split of a logged study's best live trial: stage 1's prediction for its wiring and
steps (the model's where stage 1 has none) and what the study needs."""

from __future__ import annotations

import pytest

from bisect_eagle.perf.split import stage1_floor
from bisect_eagle.report.split import best_split, need_of, study_split
from bisect_eagle.report.study import best_row, find_parent, trials_frame
from bisect_eagle.tracking.runs import Tracking

from helpers import split_study


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    _, uri, out = split_study(tmp_path_factory.mktemp("split"))  # target 2.2 × 100 tok/s
    tracking = Tracking.open(uri, "split")
    return tracking, find_parent(tracking), out


def test_the_best_trial_is_split_against_stage_1_of_its_own_wiring_and_steps(logged):
    tracking, parent, out = logged
    frame = trials_frame(tracking, parent.info.run_id)
    (stage1,) = frame[frame["stage"] == "standalone"]["simulated_accept_length"]
    got = study_split(tracking, parent)
    s = got.split
    assert (got.trial, got.run_id) == ("live 000", out.best["run_id"])
    # stage 1 scored 3 steps, the trial drafts 3: SpecForge's simulated accept length + 1 (bonus)
    assert s.predicted == pytest.approx(stage1 + 1) and s.source == "the dump (stage 1)"
    assert s.floor == pytest.approx(stage1_floor(stage1 + 1))
    assert (s.accept_length, s.need) == (pytest.approx(2.8), "the target")
    assert s.needed_tok_s == pytest.approx(220.0) and s.tok_s == pytest.approx(out.best["value"])
    assert s.cycles_s == pytest.approx(s.tok_s / 2.8)
    assert s.accept_length < s.floor and s.cycles_s * s.predicted >= 220.0
    assert s.side == "acceptance" and got.to_json()["side"] == "acceptance"


def test_without_a_stage_1_run_of_the_wiring_the_models_prediction_decides(logged):
    tracking, parent, _ = logged
    frame = trials_frame(tracking, parent.info.run_id)
    live_only = frame[frame["stage"] != "standalone"].copy()
    best = best_row(live_only, "output_tok_s")
    s = best_split(tracking, parent, live_only, best, metric="output_tok_s").split
    assert s.source == "the model" and s.predicted == pytest.approx(best["predicted_accept_length"])
    # a tok/s study logs no interval of the accept length: the stated margin is its floor
    assert "predicted_accept_length_low" not in live_only
    assert s.floor == pytest.approx(stage1_floor(s.predicted))
    # an accept-length study logs the model's 80 % interval of it: its low end is the floor
    live_only["predicted_accept_length_low"] = 2.5
    best = best_row(live_only, "output_tok_s")
    assert best_split(tracking, parent, live_only, best, metric="output_tok_s").split.floor == 2.5


def test_an_accept_length_study_needs_the_baselines_tok_s(logged):
    tracking, parent, _ = logged
    frame = trials_frame(tracking, parent.info.run_id)
    assert need_of(parent, frame, metric="accept_length") == (pytest.approx(100.0), "the baseline")
    assert need_of(parent, frame.iloc[:0], metric="accept_length") == (
        pytest.approx(100.0),
        "the baseline",
    )
    assert best_split(tracking, parent, frame, None, metric="output_tok_s") is None
