"""The study's parent run: the spec as written (secrets scrubbed) and resolved (redacted), params,
the finish."""

from __future__ import annotations

import json

import pytest

from bisect_eagle.search.study.outcome import StudyOutcome
from bisect_eagle.search.study.parent import (
    finish_parent_run,
    resolved_spec,
    spec_text,
    start_parent_run,
)
from bisect_eagle.spec.load import load_spec
from bisect_eagle.tracking.redact import hidden
from bisect_eagle.tracking.runs import Tracking

SECRET = "hf_s3cr3t_value"

SPEC = f"""\
name: parent
target: t
draft: d
dump: u
prompts: p.jsonl
engine:
  kind: sglang  # paths on another machine are allowed for sglang specs (none are read here)
  settings:
    env: {{HF_TOKEN: {SECRET}, NCCL_ALGO: Ring}}
search: {{max_live_trials: 7}}
"""


@pytest.fixture(scope="module")
def tracking(tmp_path_factory) -> Tracking:
    return Tracking.open(f"sqlite:///{tmp_path_factory.mktemp('mlruns')}/mlflow.db", "parent")


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return load_spec(path)


def test_spec_artifacts_keep_settings_but_never_a_secret(spec):
    text = spec_text(spec)
    assert SECRET not in text and "NCCL_ALGO: Ring" in text
    resolved = resolved_spec(spec)
    want = {"HF_TOKEN": hidden(SECRET), "NCCL_ALGO": "Ring"}
    assert resolved["engine"]["settings"]["env"] == want
    assert resolved["source"] == str(spec.source.resolve())


def test_parent_run_carries_budget_and_spec_then_the_outcome(tracking, spec):
    run_id = start_parent_run(
        tracking, spec=spec, study="parent-1", storage="postgresql://bob:hunter2@db/optuna"
    )
    run = tracking.get_run(run_id)
    assert run.info.status == "RUNNING" and run.data.tags["role"] == "study"
    assert run.data.tags["storage"] == "postgresql://bob:***@db/optuna"
    assert run.data.params["max_live_trials"] == "7" and run.data.params["version.optuna"]
    assert json.loads(tracking.read_text(run_id, "spec.resolved.json"))["name"] == "parent"
    assert SECRET not in tracking.read_text(run_id, "spec.yaml")
    out = StudyOutcome(
        target_reached=True,
        stop_reason="target reached",
        study="parent-1",
        storage="s",
        tracking_uri="t",
        experiment_id=tracking.experiment_id,
        parent_run_id=run_id,
        metric="output_tok_s",
        baseline=50.0,
        target=100.0,
        baseline_output_tok_s=50.0,
        best={
            "run_id": "r1",
            "value": 110.0,
            "params": {"num_steps": 3},
            "metrics": {"output_tok_s": 110.0, "output_tok_s_ratio_to_baseline": 2.2},
        },
        gate=[],
        trials=[],
        counts={"live_measured": 3, "duplicates": 1, "failed": 1},
        elapsed_s=12.0,
        tool_overhead_s_per_trial=0.2,
        speed={"output_tok_s": 110.0, "baseline_output_tok_s": 50.0, "causes": []},
    )
    finish_parent_run(tracking, out)
    run = tracking.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["outcome"] == "target reached" and run.data.tags["best_run_id"] == "r1"
    assert run.data.metrics["best_output_tok_s_ratio_to_baseline"] == pytest.approx(2.2)
    note = run.data.tags["mlflow.note.content"]
    # what the UI shows before "Show more": the verdict once, tok/s, the deploy command
    head = note.splitlines()[:5]
    assert head[0] == (
        "**Target reached: output tok/s 110.0, target ≥ 100.0 (2× baseline), not re-measured "
        "(confirmation is off).**"
    )
    assert run.data.tags["verdict"] == head[0][2:-3].replace("Target", "target", 1)
    assert (
        head[2] == "Speed: output tok/s 110.0 against 50.00 without speculation (2.20× baseline)."
    )
    assert run.data.tags["speed"] == head[2][len("Speed: ") : -1]
    assert head[4].startswith("Best: [run r1](#/experiments/")
    assert "Deploy it: `bisect-eagle export r1 --tracking-uri t`" in head[4]
    # the target once, one ratio notation
    assert note.count("100.0") == 1 and "x baseline" not in note
    assert (
        run.data.metrics["live_trials"] == 3
        and run.data.metrics["tool_overhead_s_per_trial"] == 0.2
    )
