"""Search space: list choices encoded for Optuna and decoded back, conditions, grid and
enumeration."""

from __future__ import annotations

import optuna
import pytest

from bisect_eagle.errors import BadInput
from bisect_eagle.search.space import SearchSpace, encode
from bisect_eagle.spec.schema import Param


def space(**params) -> SearchSpace:
    return SearchSpace(
        {k: Param(**v) for k, v in params.items()},
        {"num_prompts": 2, "env": {"A": "x"}},
        "spec.yaml",
    )


def test_layer_id_lists_round_trip_through_optuna():
    sp = space(
        eagle_aux_hidden_state_layer_ids={"type": "categorical", "choices": [[1, 5, 9], [-1, 1, 5]]}
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(12):
        trial = study.ask()
        sampled = sp.suggest(trial)
        ids = sampled["eagle_aux_hidden_state_layer_ids"]
        assert ids in ([1, 5, 9], [-1, 1, 5])
        assert trial.params["eagle_aux_hidden_state_layer_ids"] == encode(ids)
        assert sp.decode(trial.params) == sampled
        seen.add(tuple(ids))
        study.tell(trial, 1.0)
    assert len(seen) == 2


def test_conditional_parameter_only_when_its_condition_holds():
    sp = space(
        topk={"type": "categorical", "choices": [1, 4]},
        num_draft_tokens={"type": "categorical", "choices": [8, 16], "when": {"topk": [4]}},
    )
    assert sp.order == ["topk", "num_draft_tokens"]
    combos = list(sp.enumerate())
    assert {"topk": 1} in combos and {"topk": 4, "num_draft_tokens": 8} in combos
    assert len(combos) == 3
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(10):
        trial = study.ask()
        sampled = sp.suggest(trial)
        assert ("num_draft_tokens" in sampled) == (sampled["topk"] == 4)
        study.tell(trial, 0.0)


def test_settings_overlay_fixed_values_and_env_names():
    sp = space(
        **{
            "env.NCCL_PROTO": {"type": "categorical", "choices": ["LL", None]},
            "num_steps": {"type": "int", "low": 1, "high": 3},
        }
    )
    s = sp.settings({"env.NCCL_PROTO": "LL", "num_steps": 3})
    assert s.env == {"A": "x", "NCCL_PROTO": "LL"} and s.num_prompts == 2 and s.num_steps == 3
    assert sp.settings({"env.NCCL_PROTO": None, "num_steps": 1}).env == {"A": "x"}


def test_grid_needs_steps_for_floats_and_cycles_are_refused():
    assert space(num_steps={"type": "int", "low": 1, "high": 5, "step": 2}).grid() == {
        "num_steps": [1, 3, 5]
    }
    sp = space(temperature={"type": "float", "low": 0.0, "high": 1.0})
    assert sp.enumerate() is None
    with pytest.raises(BadInput, match="space.temperature: the grid sampler needs a 'step'"):
        sp.grid()
    with pytest.raises(BadInput, match="form a cycle"):
        space(
            topk={"type": "categorical", "choices": [1], "when": {"num_steps": [1]}},
            num_steps={"type": "categorical", "choices": [1], "when": {"topk": [1]}},
        )
