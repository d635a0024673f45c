"""The search never runs two trials with one plan fingerprint: ignored settings, defaults and the
draft's own ids written out are one trial (the engine's plan decides, not a shared rule)."""

from __future__ import annotations

from collections import Counter

import optuna
from fake_engine import FakeEngine

from bisect_eagle.search.study import Options, run_study
from bisect_eagle.spec.load import load_spec

SPEC = """\
name: plan-identity
target: t
draft: d
dump: u
prompts: p.jsonl
engine: {kind: sglang}
baseline: measure
# unreachable: the search runs until the space is exhausted
criterion: {metric: output_tok_s, ratio: 100.0}
space:
  eagle_aux_hidden_state_layer_ids:
    {type: categorical, choices: [null, [1, 5, 9], [9, 5, 1], [5, 9, 11]]}
  num_steps: {type: int, low: 1, high: 2}
  env.NCCL_ALGO: {type: categorical, choices: [null, Ring]}      # the fake engine ignores env
  concurrency: {type: categorical, choices: [1, 4]}              # and concurrency
# every plan is proposed
search: {sampler: grid, max_live_trials: 64, seed: 0, model: {enabled: false}}
"""


def test_each_plan_fingerprint_is_measured_once(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    engine = FakeEngine()
    out = run_study(
        load_spec(path),
        options=Options(
            storage=f"sqlite:///{tmp_path}/o.db", tracking_uri=f"sqlite:///{tmp_path}/m.db"
        ),
        engine_factory=lambda s: engine,
    )
    measured = Counter(engine.plan(s).fingerprint for s in engine.runs if not s.is_baseline)
    # 64 requested combinations, but only 2 wirings × 2 step counts are distinct plans
    assert len(measured) == 4
    assert not out.target_reached and "exhausted" in out.stop_reason
    # unreachable target: no confirmation re-measures the best
    assert set(measured.values()) == {1}, measured
