"""The search benchmark's synthetic landscape and its pieces: the truth it plants, a replay, a bisect."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import bench_search  # noqa: E402
import landscape  # noqa: E402

from bisect_eagle.spec.settings import LiveSettings  # noqa: E402


def test_baseline_failures_and_noise():
    engine = landscape.LandscapeEngine(noise=0.0)
    base = engine.run(engine.plan(LiveSettings(speculative_algorithm="none")))
    assert base.ok and base.output_tok_s == landscape.BASELINE_TOK_S
    nvls_ll = engine.run(engine.plan(LiveSettings(env={"NCCL_ALGO": "NVLS", "NCCL_PROTO": "LL"})))
    assert nvls_ll.failure_class == "launch_error"
    assert engine.plan(LiveSettings(num_steps=1, topk=2, num_draft_tokens=8)).refusal.startswith("num_draft_tokens 8")
    good = engine.plan(LiveSettings(**{"eagle_aux_hidden_state_layer_ids": landscape.TRUE_WIRING, "num_steps": 2}))
    noisy = landscape.LandscapeEngine(noise=0.02, seed=1)
    samples = [noisy.run(good).output_tok_s for _ in range(200)]
    true = landscape.true_value(good.effective)[0]
    assert true > landscape.BASELINE_TOK_S and sum(samples) / 200 == pytest.approx(true, rel=0.01)
    assert min(samples) < true < max(samples)


def test_gate_keeps_only_the_true_wiring():
    assert landscape.gate() == [landscape.TRUE_WIRING]


def test_grid_replay_counts_live_trials_to_the_noisy_target(tmp_path):
    spec = bench_search.write_spec(tmp_path, "grid-0", wirings=landscape.WIRINGS, search={"sampler": "grid"})
    n, false = bench_search.replay(spec, noise=0.0, seed=0)
    assert 1 <= n <= bench_search.CAP and false is False  # without noise no winner misses


def test_bisect_names_a_planted_interaction_exactly(tmp_path):
    store = {"mlflow": f"sqlite:///{tmp_path}/mlflow.db"}
    assert bench_search.bisect_case(tmp_path, store, noise=0.0, seed=2)  # two changes harmless alone
