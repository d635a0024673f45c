"""layers.py's SGLang capture rules checked against SGLang 0.5.23's own model classes.

Each family's ``set_eagle3_layers_to_capture`` is called in SGLang's interpreter (tests/sglang_env/
capture_rules.py); what it captures must be what
:func:`bisect_eagle.artifacts.layers.ids_to_canonical` predicts under
:func:`bisect_eagle.artifacts.capture.sglang_convention` for that ``model_type``, and ids that
layers.py refuses must be ids SGLang cannot capture (outside the hidden states 0..N). Skipped where
no SGLang environment exists (``scripts/setup_sglang_env.sh`` makes one; CI always does).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from sglang_oracle import sglang_python

from bisect_eagle.artifacts import capture, layers

SCRIPT = Path(__file__).resolve().parents[1] / "sglang_env" / "capture_rules.py"


DEPTHS = (61, 12)


@pytest.fixture(scope="module")
def all_captures() -> dict:
    """Every depth's captures from one SGLang process (its models are imported once)."""
    python = sglang_python()
    out = subprocess.run(
        [python, str(SCRIPT), *map(str, DEPTHS)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.fixture(params=DEPTHS)
def captures(request, all_captures) -> tuple[int, dict]:
    return request.param, all_captures[str(request.param)]


# draft / multi-token-prediction heads: never an EAGLE-3 target
DRAFTS = ("NextN", "MTP", "Eagle", "Eagle3")
# Classes the weightless stand-in cannot run (their hook reads objects __init__ builds): checked by
# hand only.
UNPROBED = {
    "BailingMoEForCausalLM",
    "BailingMoeForCausalLM",
    "BailingMoeV2ForCausalLM",
    "SarvamMoEForCausalLM",
    "Llama4ForConditionalGeneration",
    "MindSporeForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
}


def test_every_sglang_class_captures_what_the_table_says(captures):
    """layers.py's fallback table equals SGLang's own hook for every hook class discovered in
    sglang.srt.models."""
    n, found = captures
    assert found["hook_modules"], (
        "no module of sglang.srt.models defines set_eagle3_layers_to_capture"
    )
    hook_failed = [m for m in found["import_errors"] if m in found["hook_modules"]]
    assert not hook_failed, found["import_errors"]
    bad = []
    for arch, probe in found["classes"].items():
        if arch.endswith(DRAFTS) or arch in UNPROBED:
            continue
        assert "probe_error" not in probe, (arch, probe)
        rule = capture.capture_rule(None, arch)
        for ids_text, ans in probe["answers"].items():
            p = capture.predicted_capture(json.loads(ids_text), rule, num_layers=n)
            got = ("error", ans["error"].split(":")[0]) if "error" in ans else ans["captures"]
            want = ("error", p.error.split(":")[0]) if p.error else p.captures
            if got != want:
                bad.append((arch, ids_text, got, want))
        assert bool(probe.get("final_captured")) == rule.final, arch
    assert not bad, bad


def test_every_family_captures_what_layers_py_predicts(captures):
    n, found = captures
    by_family = {t: found["classes"][a]["answers"] for t, a in capture.SGLANG_MODEL_TYPES.items()}
    for model_type, table in by_family.items():
        conv = capture.sglang_convention(model_type)
        for ids_text, got in table.items():
            ids = json.loads(ids_text)
            if ids is None or "error" in got:
                # the defaults and hook errors: test_every_sglang_class_captures_what_the_table_says
                continue
            got = got["layers_to_capture"]
            try:
                want = layers.ids_to_canonical(ids, conv, num_layers=n)
            except layers.LayerIdError:
                # never captured by SGLang
                assert any(not 0 <= i <= n for i in got), (model_type, ids, got)
                continue
            assert got == want, (model_type, ids, conv)


def test_glm5_reads_the_dump_layers_only_with_3_31_59(captures):
    n, found = captures
    if n != 61:
        pytest.skip("GLM-5 geometry only")
    glm5 = {
        k: v["layers_to_capture"]
        for k, v in found["classes"]["GlmMoeDsaForCausalLM"]["answers"].items()
    }
    # one layer shallower than the dump's outputs of layers 2, 30, 58
    assert glm5["[2, 30, 58]"] == [2, 30, 58]
    assert glm5["[1, 29, 57]"] == [2, 30, 58]  # the same layers again
    assert glm5["[3, 31, 59]"] == [3, 31, 59]  # the dump's layers
    assert layers.canonical_to_ids([3, 31, 59], "sglang-deepseek", num_layers=n) == [3, 31, 59]
