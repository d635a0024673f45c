"""Plan identity is pinned: the fingerprint of every config of the shipped specs (a dry run: nothing
launches).

The golden file was written before the package was re-layered; a move or a refactor that changes any
trial's identity fails here. Regenerate only for a deliberate change of identity:
``BISECT_EAGLE_REGEN_GOLDEN=1 .venv/bin/pytest tests/engines/test_plan_golden.py``.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from bisect_eagle.engines import make_engine
from bisect_eagle.search.space import SearchSpace
from bisect_eagle.spec.load import load_spec
from bisect_eagle.spec.schema import Param

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "plan_fingerprints.json"
SPECS = ["tiny.yaml", "tiny-sglang.yaml", "glm5-8gpu.yaml"]
PER_SPEC = 400  # glm5's space has ~27k configs: every n-th one, the same ones every time
# stage 1's wirings as the layer ids they resolve to (the gate adds them to the space as a
# categorical)
WIRING_IDS = {
    "tiny.yaml": [[1, 5, 9], [5, 9, 11], [-1, 1, 5], [0, 4, 8], [2, 6, 10]],
    "tiny-sglang.yaml": [[1, 5, 9], [5, 9, 11]],
}


def _fingerprints(name: str) -> dict[str, str]:
    spec = load_spec(ROOT / "experiments" / name, check_inputs=False)
    params = dict(spec.space)
    if name in WIRING_IDS:
        params = {
            "eagle_aux_hidden_state_layer_ids": Param(type="categorical", choices=WIRING_IDS[name]),
            **params,
        }
    space = SearchSpace(params, spec.engine.settings, name)
    combos = list(space.enumerate())
    step = max(1, len(combos) // PER_SPEC)
    out = {}
    with make_engine(spec) as engine:
        for sampled in itertools.chain([{"speculative_algorithm": "none"}], combos[::step]):
            plan = engine.plan(space.settings(sampled))
            out[json.dumps(sampled, sort_keys=True)] = (
                plan.fingerprint if plan.refusal is None else "refused"
            )
    return out


@pytest.mark.parametrize("name", SPECS)
def test_plan_fingerprints_are_unchanged(name, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    got = _fingerprints(name)
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    if os.environ.get("BISECT_EAGLE_REGEN_GOLDEN"):
        golden[name] = got
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    assert got == golden[name]
