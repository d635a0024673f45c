"""layers.py's SGLang capture rules checked against SGLang 0.5.23's own model classes.

Each family's ``set_eagle3_layers_to_capture`` is called in SGLang's interpreter (tests/sglang_env/
capture_rules.py); what it captures must be what :func:`bisect_eagle.artifacts.layers.ids_to_canonical` predicts under
:func:`bisect_eagle.artifacts.layers.sglang_convention` for that ``model_type``, and ids that layers.py refuses must be
ids SGLang cannot capture (outside the hidden states 0..N). Skipped where no SGLang environment exists
(``scripts/setup_sglang_env.sh`` makes one; CI always does).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from sglang_oracle import sglang_python

from bisect_eagle.artifacts import layers

SCRIPT = Path(__file__).resolve().parents[1] / "sglang_env" / "capture_rules.py"


@pytest.fixture(scope="module", params=[61, 12])
def captures(request) -> tuple[int, dict]:
    python = sglang_python()
    out = subprocess.run([python, str(SCRIPT), str(request.param)], capture_output=True, text=True, timeout=300,
                         check=True)
    return request.param, json.loads(out.stdout)


def test_every_family_captures_what_layers_py_predicts(captures):
    n, by_family = captures
    for model_type, table in by_family.items():
        conv = layers.sglang_convention(model_type)
        for ids_text, got in table.items():
            ids = json.loads(ids_text)
            if ids is None:
                assert got == [2, n // 2, n - 3], model_type  # SGLang's default, raw hidden_states indices
                continue
            try:
                want = layers.ids_to_canonical(ids, conv, num_layers=n)
            except layers.LayerIdError:
                assert any(not 0 <= i <= n for i in got), (model_type, ids, got)  # never captured by SGLang
                continue
            assert got == want, (model_type, ids, conv)


def test_glm5_reads_the_dump_layers_only_with_3_31_59(captures):
    n, by_family = captures
    if n != 61:
        pytest.skip("GLM-5 geometry only")
    glm5 = by_family["glm_moe_dsa"]
    assert glm5["[2, 30, 58]"] == [2, 30, 58]  # one layer shallower than the dump's outputs of layers 2, 30, 58
    assert glm5["[1, 29, 57]"] == [2, 30, 58]  # the same layers again
    assert glm5["[3, 31, 59]"] == [3, 31, 59]  # the dump's layers
    assert layers.canonical_to_ids([3, 31, 59], "sglang-deepseek", num_layers=n) == [3, 31, 59]
