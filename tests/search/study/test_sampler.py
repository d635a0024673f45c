"""The live space (gate's wirings + the spec's space) and the sampler each spec asks for."""

from __future__ import annotations

import json

import optuna
from optuna.trial import TrialState

from bisect_eagle.search.study.sampler import (
    AskTellGridSampler,
    live_space,
    make_sampler,
    space_json,
)
from bisect_eagle.spec.schema import Spec

GATE = [
    {"layer_ids": [1, 5, 9], "passed": True},
    {"layer_ids": [5, 9, 11], "passed": False},
    {"layer_ids": [0, 4, 8], "passed": True},
]


def spec(sampler: str = "tpe", wirings: bool = True) -> Spec:
    return Spec.model_validate(
        {
            "name": "x",
            "dump_layer_ids": [1, 5, 9],
            "standalone": {"wirings": [{"rule": "[:-1]"}] if wirings else []},
            "space": {"num_steps": {"type": "int", "low": 1, "high": 3}},
            "search": {"sampler": sampler},
        }
    )


def test_live_space_holds_only_the_wirings_that_passed():
    space = live_space(spec(), GATE)
    assert space.params["eagle_aux_hidden_state_layer_ids"].choices == [[1, 5, 9], [0, 4, 8]]
    assert set(space.params) == {"eagle_aux_hidden_state_layer_ids", "num_steps"}
    assert set(live_space(spec(wirings=False), GATE).params) == {"num_steps"}
    described = json.loads(space_json(space))
    assert described["encoded_choices"]["eagle_aux_hidden_state_layer_ids"] == ["1,5,9", "0,4,8"]


def test_each_sampler_kind():
    space = live_space(spec(), GATE)
    assert isinstance(make_sampler(spec("tpe"), space=space, seed=0), optuna.samplers.TPESampler)
    assert isinstance(
        make_sampler(spec("random"), space=space, seed=0), optuna.samplers.RandomSampler
    )
    assert isinstance(make_sampler(spec("grid"), space=space, seed=0), AskTellGridSampler)


def test_grid_sampler_runs_ask_and_tell_to_the_end():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = live_space(spec("grid"), GATE)
    study = optuna.create_study(
        direction="maximize", sampler=make_sampler(spec("grid"), space=space, seed=0)
    )
    seen = set()
    # 2 wirings x 3 steps; Optuna's own grid sampler would call study.stop() and raise here
    for _ in range(6):
        trial = study.ask()
        sampled = space.suggest(trial)
        seen.add((tuple(sampled["eagle_aux_hidden_state_layer_ids"]), sampled["num_steps"]))
        study.tell(trial, 1.0)
    assert len(seen) == 6
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
