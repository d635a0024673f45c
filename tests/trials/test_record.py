"""A trial's one name (``trial_name``) and its MLflow run name (``run_name``), for every kind of trial."""

from __future__ import annotations

from bisect_eagle.trials.record import run_name, trial_name

SPECULATIVE = {"speculative_algorithm": "EAGLE3", "eagle_aux_hidden_state_layer_ids": [1, 5, 9], "num_steps": 3,
               "topk": 1}
NONE = {"speculative_algorithm": "none"}


def test_a_study_trial_is_its_stage_and_optuna_number():
    assert trial_name("live", number=3) == "live 003"
    assert trial_name("live", number=1234) == "live 1234"
    assert run_name("live 003", "live", SPECULATIVE) == "live 003 ids=1,5,9 steps=3 topk=1"
    assert run_name("live 004", "live", NONE) == "live 004 no speculation"  # a space may hold the baseline config
    assert run_name("live", "live", {**SPECULATIVE, "eagle_aux_hidden_state_layer_ids": None}) == (
        "live ids=server-default steps=3 topk=1")  # bisect-eagle live: no study, no number


def test_the_baseline_is_named_baseline_alone():
    assert trial_name("baseline") == "baseline"
    assert run_name("baseline", "baseline", NONE) == "baseline"


def test_a_confirmation_measurement_is_named_by_pair_and_role():
    tags = {"confirm_role": "candidate", "confirm_pair": "0", "confirm_of": "d8ee70287799b305"}
    assert trial_name("confirm", tags=tags, of="live 003") == "confirm 1 candidate live 003"
    assert trial_name("confirm", tags=tags) == "confirm 1 candidate"  # its trial not found in the study
    baseline = {**tags, "confirm_role": "baseline", "confirm_pair": "2"}
    assert trial_name("confirm", tags=baseline, of="live 003") == "confirm 3 baseline"
    assert run_name("confirm 3 baseline", "confirm", NONE) == "confirm 3 baseline"
    assert run_name("confirm 1 candidate live 003", "confirm", SPECULATIVE) == "confirm 1 candidate live 003"
    assert trial_name("confirm", tags={"confirm_of": "d8ee70287799b305"}) == "confirm"  # what the tags say, no more


def test_a_label_names_the_trial_instead_of_its_stage():
    assert trial_name("live", number=7, label="probe 04 +num_steps") == "probe 04 +num_steps"
    assert run_name("probe 04 +num_steps", "live", SPECULATIVE) == "probe 04 +num_steps ids=1,5,9 steps=3 topk=1"
    assert run_name("probe 05 +speculative_algorithm", "live", NONE) == "probe 05 +speculative_algorithm no speculation"
