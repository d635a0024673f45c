"""The bisect benchmark's masked cases (scripts/bench_search.py): a wrong wiring hidden on the bad side by
speculative_algorithm EAGLE, alone and next to too many draft steps, under 2 % noise."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_search  # noqa: E402

from bisect_eagle.spec.settings import LiveSettings  # noqa: E402


def test_eagle_leaves_the_wiring_unused_and_collapses_acceptance():
    engine = bench_search.MaskingLandscape()
    wrong = {"eagle_aux_hidden_state_layer_ids": bench_search.WIRINGS[2]}
    eagle = engine.plan(LiveSettings(speculative_algorithm="EAGLE", **wrong))
    assert eagle.fingerprint == engine.plan(LiveSettings(speculative_algorithm="EAGLE")).fingerprint
    assert engine.run(eagle).accept_length < 1.1
    good = engine.truth(bench_search.GOOD)
    assert engine.truth({**bench_search.GOOD, **wrong}) < 0.9 * good  # the wiring, once EAGLE3 runs it, is slow


@pytest.mark.parametrize("seed", [3, 4, 8, 9])  # CASES[3], CASES[4]: the masked ones
def test_a_masked_culprit_is_named_and_its_repair_verified(tmp_path, seed):
    run = bench_search.bisect_run(tmp_path, {"mlflow": f"sqlite:///{tmp_path}/mlflow.db"}, noise=0.02, seed=seed)
    assert run["masked"] and run["correct"], run
    assert run["probes"] <= run["probe_bound"] and run["verification_probes"] >= 3
