"""A trial's one name (``trial_name``) and its MLflow run name (``run_name``), for every kind of
trial; the display tags ``result_end`` ends a run with beside the exact metrics."""

from __future__ import annotations

import math
from typing import Literal

from bisect_eagle.engines.plan import make_plan
from bisect_eagle.engines.sglang.rules import speculative_effective
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.runs import Tracking
from bisect_eagle.trials.record import (
    TrialRecord,
    result_end,
    run_name,
    shown_tags,
    trial_name,
)

SPECULATIVE = {
    "speculative_algorithm": "EAGLE3",
    "eagle_aux_hidden_state_layer_ids": [1, 5, 9],
    "num_steps": 3,
    "topk": 1,
}
NONE = {"speculative_algorithm": "none"}


def test_a_study_trial_is_its_stage_and_optuna_number():
    assert trial_name("live", number=3) == "live 003"
    assert trial_name("live", number=1234) == "live 1234"
    assert run_name("live 003", "live", SPECULATIVE) == "live 003 ids=1,5,9 steps=3 topk=1"
    # a space may hold the baseline config
    assert run_name("live 004", "live", NONE) == "live 004 no speculation"
    assert run_name("live", "live", {**SPECULATIVE, "eagle_aux_hidden_state_layer_ids": None}) == (
        "live ids=server-default steps=3 topk=1"
    )  # bisect-eagle live: no study, no number


def test_the_baseline_is_named_baseline_alone():
    assert trial_name("baseline") == "baseline"
    assert run_name("baseline", "baseline", NONE) == "baseline"


def test_a_confirmation_measurement_is_named_by_pair_and_role():
    tags = {"confirm_role": "candidate", "confirm_pair": "0", "confirm_of": "d8ee70287799b305"}
    assert trial_name("confirm", tags=tags, of="live 003") == "confirm 1 candidate live 003"
    # its trial not found in the study
    assert trial_name("confirm", tags=tags) == "confirm 1 candidate"
    baseline = {**tags, "confirm_role": "baseline", "confirm_pair": "2"}
    assert trial_name("confirm", tags=baseline, of="live 003") == "confirm 3 baseline"
    assert run_name("confirm 3 baseline", "confirm", NONE) == "confirm 3 baseline"
    assert (
        run_name("confirm 1 candidate live 003", "confirm", SPECULATIVE)
        == "confirm 1 candidate live 003"
    )
    # what the tags say, no more
    assert trial_name("confirm", tags={"confirm_of": "d8ee70287799b305"}) == "confirm"


def test_a_label_names_the_trial_instead_of_its_stage():
    assert trial_name("live", number=7, label="probe 04 +num_steps") == "probe 04 +num_steps"
    assert (
        run_name("probe 04 +num_steps", "live", SPECULATIVE)
        == "probe 04 +num_steps ids=1,5,9 steps=3 topk=1"
    )
    assert (
        run_name("probe 05 +speculative_algorithm", "live", NONE)
        == "probe 05 +speculative_algorithm no speculation"
    )


def logged(
    tmp_path,
    metrics: dict[str, float],
    status: Literal["ok", "failed"] = "ok",
    settings: LiveSettings | None = None,
):
    """The run ``result_end`` ends for a trial record with ``metrics`` (``status`` ok, or failed:
    no metrics)."""
    tracking = Tracking.open(f"sqlite:///{tmp_path}/mlflow.db", "record")
    parent = tracking.start_run("study", tags={"role": "study"})
    settings = settings or LiveSettings(num_steps=3)
    effective, warnings, refusal = speculative_effective(settings)
    plan = make_plan("fake", settings, effective=effective, warnings=warnings, refusal=refusal)
    run_id = tracking.start_run("live 001", tags={"stage": "live"}, parent_run_id=parent)
    record = TrialRecord(
        fingerprint=plan.fingerprint,
        stage="live",
        status=status,
        value=metrics.get("output_tok_s"),
        metrics=metrics,
        effective=effective,
        run_id=run_id,
        failure_class=None if status == "ok" else "oom",
    )
    tracking.end_run(run_id, result_end(plan, record, [], metric="output_tok_s"))
    return tracking.get_run(run_id)


def test_a_result_writes_the_headline_metrics_rounded_as_tags_and_keeps_them_exact(tmp_path):
    metrics = {
        "accept_length": 4.800000190734863,
        "accept_length_ratio_to_baseline": 4.800000190734863,
        "output_tok_s": 75.23456789,
        "output_tok_s_ratio_to_baseline": 1.0423456,
        "output_tok_s_mad": 0.123456,
    }
    run = logged(tmp_path, metrics)
    shown = {k: v for k, v in run.data.tags.items() if k.startswith("shown.")}
    assert shown == {
        "shown.accept_length": "4.8",
        "shown.accept_length_ratio_to_baseline": "4.80×",
        "shown.output_tok_s": "75.2",
        "shown.output_tok_s_ratio_to_baseline": "1.04×",
    }
    # the metrics as measured, not rounded
    assert {k: run.data.metrics[k] for k in metrics} == metrics
    assert run.data.tags["value"] == "75.23456789"


def test_display_tags_round_large_values_to_one_decimal_and_leave_out_what_was_not_measured(
    tmp_path,
):
    assert shown_tags(
        {"output_tok_s": 1234.5678, "accept_length": math.nan, "output_tok_s_mad": 2.0}
    ) == {
        # a baseline: no ratios; a non-finite metric is not logged either
        "shown.output_tok_s": "1234.6"
    }
    run = logged(tmp_path, {}, status="failed")
    assert (
        not [k for k in run.data.tags if k.startswith("shown.")]
        and run.data.tags["failure_class"] == "oom"
    )


def test_a_trial_run_is_tagged_with_its_acceptance_pinned_or_natural(tmp_path):
    assert logged(tmp_path / "n", {"output_tok_s": 9.0}).data.tags["acceptance"] == "natural"
    pinned = logged(
        tmp_path / "p",
        {"output_tok_s": 9.0},
        settings=LiveSettings(pinned_acceptance=[1.0, 0.5, 0.0]),
    )
    assert pinned.data.tags["acceptance"] == "pinned"


def test_a_trial_run_describes_what_ran_and_what_it_measured_its_criterion_first(tmp_path):
    """The description is what MLflow's run page shows first: the criterion metric (output_tok_s for
    a spec without a criterion), then the other headline metric, each with its ratio to the
    baseline; a failure's class."""
    run = logged(
        tmp_path / "ok",
        {
            "accept_length": 4.8,
            "accept_length_ratio_to_baseline": 4.8,
            "output_tok_s": 75.23456789,
            "output_tok_s_ratio_to_baseline": 1.0423,
        },
    )
    note = run.data.tags["mlflow.note.content"]
    assert note.startswith("**Live trial `live`**: ok")
    assert "output_tok_s 75.2 (1.04× the baseline); accept_length 4.8 (4.80× the baseline)" in note
    assert note.index("output_tok_s 75.2") < note.index("accept_length 4.8")
    assert (
        "Engine fake; the effective settings are its parameters" in note
        and "Acceptance was pinned" not in note
    )
    failed = logged(tmp_path / "failed", {}, status="failed").data.tags["mlflow.note.content"]
    assert "**: failed" in failed and "Failed (oom)" in failed
    pinned = logged(
        tmp_path / "p",
        {"output_tok_s": 9.0},
        settings=LiveSettings(pinned_acceptance=[1.0, 0.5, 0.0]),
    )
    assert (
        "Acceptance was pinned: its tok/s measures the cost side alone."
        in pinned.data.tags["mlflow.note.content"]
    )
