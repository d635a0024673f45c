"""Ids SGLang never captures are refused before launch, quoting the family's rule (with and without
SGLang)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sglang_helpers import fake_draft, server, settings
from sglang_oracle import sglang_python

from bisect_eagle.artifacts import capture
from bisect_eagle.engines.sglang.planner import Planner

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "targets"


def _cfg(name: str) -> dict:
    return json.loads((FIXTURES / name / "config.json").read_text())


@pytest.mark.parametrize(
    ("name", "ids", "missed"),
    [
        ("glm5", [2, 30, 61], [61]),
        ("glm5", [1, 29, 60], [60]),
        ("glm5", [-1, 2, 30], [-1]),
        ("kimi-k25", [-1, 2, 30], [-1]),
        ("deepseek-v3", [2, 30, 61], [61]),
    ],
)
def test_table_refuses_never_captured_ids(name, ids, missed):
    cfg = _cfg(name)
    cap = capture.predicted_capture(
        ids, capture.capture_rule(cfg["model_type"], cfg["architectures"][0]), num_layers=61
    )
    assert cap.missed == missed
    assert "not checked against SGLang" in cap.checked


def test_table_llama_final_layer_on_12_layers():
    cap = capture.predicted_capture(
        [1, 5, 11], capture.capture_rule("llama", "LlamaForCausalLM"), num_layers=12
    )
    assert cap.missed == [11]
    assert (
        capture.predicted_capture(
            [2, 30, 60], capture.capture_rule("minimax_m3"), num_layers=61
        ).missed
        == []
    )


def test_kimi_k25_takes_the_deepseek_rule():
    assert capture.sglang_convention("kimi_k25") == "sglang-deepseek"
    assert capture.sglang_convention(None, "MistralLarge3ForCausalLM") == "sglang-deepseek"
    assert capture.predicted_capture(
        None, capture.capture_rule("minimax_m3_vl"), num_layers=61
    ).captures == [3, 31, 59]


def test_planner_refuses_without_sglang(tmp_path):
    p = Planner(
        server(launch_command=["python", "-m", "sglang.launch_server"]),
        FIXTURES / "glm5",
        fake_draft(tmp_path),
        check=False,
    )
    plan = p.plan(
        settings(eagle_aux_hidden_state_layer_ids=[2, 30, 61]), port=1, draft_dir=tmp_path / "draft"
    )
    assert plan.refusal is not None and "never captures" in plan.refusal and "[61]" in plan.refusal
    assert "not checked against SGLang" in plan.refusal
    ok = p.plan(
        settings(eagle_aux_hidden_state_layer_ids=[3, 31, 59]), port=1, draft_dir=tmp_path / "draft"
    )
    assert ok.refusal is None


@pytest.mark.parametrize(
    ("name", "ids", "bad"),
    [
        ("glm5", [2, 30, 61], True),
        ("glm5", [1, 29, 60], True),
        ("glm5", [-1, 2, 30], True),
        ("glm5", [3, 31, 59], False),
        ("kimi-k25", [-1, 2, 30], True),
        ("kimi-k25", [3, 31, 59], False),
    ],
)
def test_planner_capture_by_sglang_itself(tmp_path, name, ids, bad):
    python = sglang_python()
    p = Planner(
        server(launch_command=[python, "-m", "sglang.launch_server"], python=python),
        FIXTURES / name,
        fake_draft(tmp_path),
    )
    try:
        cap = p.capture(ids, _cfg(name), 61)
        assert cap.checked.startswith("SGLang"), cap.checked
        assert bool(cap.missed) is bad
        assert (p._captured(ids, _cfg(name), 61) is not None) is bad
    finally:
        p.close()
