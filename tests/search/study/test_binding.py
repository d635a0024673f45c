"""A study is bound to its spec: a worker or ``--resume`` with another spec is refused, naming the
first key that differs; the same spec (with another description) is accepted."""

from __future__ import annotations

import optuna
import pytest
from fake_engine import FakeEngine

from bisect_eagle.errors import BadInput
from bisect_eagle.search.study import Options, join_study, run_study
from bisect_eagle.search.study.binding import canonical_spec, check_bound
from bisect_eagle.spec.load import load_spec

SPEC = """\
name: bound
description: {description}
target: t
draft: d
dump: u
prompts: p.jsonl
engine: {{kind: sglang, settings: {{max_new_tokens: {tokens}, env: {{HF_TOKEN: {token}}}}}}}
baseline: 10.0
criterion: {{metric: output_tok_s, ratio: 100.0}}
space:
  num_steps: {{type: int, low: 1, high: 2}}
search: {{sampler: grid, max_live_trials: 2, seed: 0, model: {{enabled: false}}}}
"""


def _spec(tmp_path, name="spec.yaml", *, tokens=16, description="one", token="hf-a-secret"):
    path = tmp_path / name
    path.write_text(SPEC.format(tokens=tokens, description=description, token=token))
    return load_spec(path, check_inputs=False)


def _opts(tmp_path, **kw) -> Options:
    return Options(
        storage=f"sqlite:///{tmp_path}/o.db", tracking_uri=f"sqlite:///{tmp_path}/m.db", **kw
    )


def test_a_worker_with_another_spec_is_refused_naming_the_key(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out = run_study(
        _spec(tmp_path),
        options=_opts(tmp_path, study_name="s1"),
        engine_factory=lambda s: FakeEngine(),
    )
    other = _spec(tmp_path, "other.yaml", tokens=32)
    with pytest.raises(
        BadInput, match=r"key 'engine\.settings\.max_new_tokens' is 16 there and 32 in"
    ):
        join_study(
            other,
            options=_opts(tmp_path, study_name=out.study),
            engine_factory=lambda s: FakeEngine(),
        )
    with pytest.raises(BadInput, match="--resume: study 's1' was made from another spec"):
        run_study(
            other,
            options=_opts(tmp_path, study_name="s1", resume=True),
            engine_factory=lambda s: FakeEngine(),
        )


def test_the_binding_ignores_the_description_but_not_a_secret_and_stores_no_secret(tmp_path):
    same = canonical_spec(_spec(tmp_path, description="two"))
    assert same == canonical_spec(_spec(tmp_path, "b.yaml", description="three"))
    assert "hf-a-secret" not in repr(same)
    assert same != canonical_spec(_spec(tmp_path, "c.yaml", token="hf-b-secret"))


def test_a_study_of_another_spec_name_is_refused(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    run_study(
        _spec(tmp_path),
        options=_opts(tmp_path, study_name="s2"),
        engine_factory=lambda s: FakeEngine(),
    )
    study = optuna.load_study(study_name="s2", storage=f"sqlite:///{tmp_path}/o.db")
    renamed = _spec(tmp_path, "r.yaml")
    renamed.name = "another"
    with pytest.raises(BadInput, match="key 'name'"):
        check_bound(study, renamed, what="worker")
