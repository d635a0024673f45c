"""The study outcome's trial summaries: decoded params, duplicates pointing at the run they
reuse."""

from __future__ import annotations

import optuna

from bisect_eagle.search.space import SearchSpace
from bisect_eagle.search.study.outcome import StudyOutcome, trial_summary
from bisect_eagle.spec.schema import Param


def test_trial_summary_decodes_params_and_names_the_run():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = SearchSpace(
        {"eagle_aux_hidden_state_layer_ids": Param(type="categorical", choices=[[1, 5, 9]])},
        {},
        "test",
    )
    study = optuna.create_study(direction="maximize")
    measured = study.ask()
    space.suggest(measured)
    measured.set_user_attr("mlflow_run_id", "run-a")
    measured.set_user_attr("fingerprint", "fp")
    measured.set_user_attr("name", "live 000")
    study.tell(measured, 3.0)
    dup = study.ask()
    space.suggest(dup)
    dup.set_user_attr("duplicate_of", "run-a")
    study.tell(dup, 3.0)
    first, second = (trial_summary(t, space) for t in study.get_trials())
    assert first == {
        "number": 0,
        "name": "live 000",
        "state": "COMPLETE",
        "value": 3.0,
        "params": {"eagle_aux_hidden_state_layer_ids": [1, 5, 9]},
        "requested": {"eagle_aux_hidden_state_layer_ids": [1, 5, 9]},
        "fingerprint": "fp",
        "run_id": "run-a",
        "duplicate": False,
        "failure_class": None,
    }
    assert second["duplicate"] and second["run_id"] == "run-a"
    assert trial_summary(study.get_trials()[0], None)["params"] == {
        "eagle_aux_hidden_state_layer_ids": "1,5,9"
    }


def test_a_setting_the_engine_resolved_shows_its_effective_value_beside_the_request():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = SearchSpace(
        {"num_draft_tokens": Param(type="categorical", choices=[None, 8])}, {}, "test"
    )
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({"num_draft_tokens": None})
    t = study.ask()
    sampled = space.suggest(t)
    assert sampled == {"num_draft_tokens": None}
    t.set_user_attr("effective", {"num_draft_tokens": 4})  # as the loop stores the plan's value
    study.tell(t, 2.0)
    summary = trial_summary(study.get_trials()[0], space)
    assert summary["params"] == {"num_draft_tokens": 4} and summary["requested"] == {
        "num_draft_tokens": None
    }


def test_outcome_json_is_plain_data():
    fields = StudyOutcome.__dataclass_fields__
    out = StudyOutcome(**{name: None for name in fields})
    assert set(out.to_json()) == set(fields)
