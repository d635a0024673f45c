"""The search benchmark's family of deployments and its pieces: what a member plants, its stage 1, a
study, a bisect.

The benchmark must not share the model's assumptions: its members are drawn at random, stage 1 sees
a proxy (never the true curve), and none of the constants its cost structure is drawn from is one of
the throughput model's.
"""

from __future__ import annotations

import ast
import math
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_search  # noqa: E402
import landscape  # noqa: E402

from bisect_eagle.search.gate import apply_gate  # noqa: E402
from bisect_eagle.spec.settings import LiveSettings  # noqa: E402


@pytest.fixture(scope="module")
def world() -> landscape.World:
    return landscape.draw_world(landscape.REPORTED_SEEDS[1])


def test_members_are_drawn_from_their_seed_with_headroom_and_both_kinds():
    worlds = [landscape.draw_world(s) for s in landscape.REPORTED_SEEDS]
    assert landscape.draw_world(3) == worlds[3]  # a member is its seed
    assert {w.moe for w in worlds} == {True, False}
    assert all(w.best()[1] >= landscape.MIN_HEADROOM * w.base_tok_s for w in worlds)
    vts = [w.verify_token for w in worlds]
    # a verified token costs a little or a lot of a forward
    assert min(vts) < 0.05 and max(vts) > 0.15
    assert not set(landscape.REPORTED_SEEDS) & set(landscape.HELDOUT_SEEDS)


def test_baseline_failures_noise_and_drift(world):
    engine = landscape.WorldEngine(world, noise=0.0)
    base = engine.run(engine.plan(LiveSettings(speculative_algorithm="none")))
    assert base.ok and base.output_tok_s == pytest.approx(world.base_tok_s)
    (key_a, a), (key_b, b) = (p.split("=", 1) for p in world.failure)
    failing = bench_search._typed(key_a, a), bench_search._typed(key_b, b)
    flat = {key_a: failing[0], key_b: failing[1]}
    assert world.truth(flat) == 0.0
    assert engine.plan(LiveSettings(num_steps=1, topk=2, num_draft_tokens=8)).refusal.startswith(
        "num_draft_tokens 8"
    )
    good = engine.plan(
        LiveSettings(eagle_aux_hidden_state_layer_ids=world.true_wiring, num_steps=2)
    )
    noisy = landscape.WorldEngine(world, noise=0.02, seed=1, launch_share=0.5)
    true = world.true_value(good.effective)[0]
    first = [noisy.run(good).output_tok_s for _ in range(50)]
    drift = math.exp(world.drift * 49)
    assert min(first) < true * max(1.0, drift) and max(first) > true * min(1.0, drift)


def test_an_extra_verified_token_costs_what_the_member_drew(world):
    chain = world.cycle_cost(steps=3, topk=1, ndt=4)
    wide = world.cycle_cost(steps=3, topk=1, ndt=5)
    # the first extra tokens cost vt each, saturating after about S tokens
    s = world.verify_saturation
    assert wide - chain == pytest.approx(
        world.verify_token * s * (math.exp(-3 / s) - math.exp(-4 / s)), rel=1e-9
    )
    assert world.cycle_cost(steps=3, topk=1, ndt=2) - world.cycle_cost(
        steps=3, topk=1, ndt=1
    ) == pytest.approx(world.verify_token * s * (1 - math.exp(-1 / s)))


def test_stage_1_sees_a_proxy_and_the_tools_gate_keeps_the_true_wiring(world):
    spec = bench_search.write_spec(Path(__import__("tempfile").mkdtemp()), "stage1", world=world)
    scorer = bench_search.WorldScorer(world, spec, seed=0)
    verdicts = [scorer.score(c) for c in scorer.candidates()]
    true = next(v for v in verdicts if sorted(v.layer_ids) == sorted(world.true_wiring))
    # never the true rate
    assert true.accuracy != pytest.approx(world.accept0[world.true_index], abs=1e-6)
    assert all(v.accuracy_sd > 0 for v in verdicts)  # a dump's finite samples
    apply_gate(verdicts, margin=0.05, reference=None)
    assert true.passed


def test_the_generator_borrows_no_constant_of_the_throughput_model():
    """The ranges a member's costs and acceptance are drawn from share no number with the model's
    cost priors."""
    drawn = _numbers(ROOT / "scripts" / "landscape.py", function="_draw")
    model = set()
    for module in ("cost.py", "prior.py"):
        model |= _numbers(ROOT / "bisect_eagle" / "perf" / module, function=None)
    shared = (drawn & model) - {0.0, 1.0, 2.0}  # identities and counts
    assert not shared, sorted(shared)


def _numbers(path: Path, *, function: str | None) -> set[float]:
    """Float literals of ``function``'s body, or of a module's top-level assignments (constants and
    tables)."""
    tree = ast.parse(path.read_text())
    if function is not None:
        scope = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
    else:
        scope = [n for n in tree.body if isinstance(n, ast.Assign | ast.AnnAssign)]
    return {
        float(n.value)
        for s in scope
        for n in ast.walk(s)
        if isinstance(n, ast.Constant) and isinstance(n.value, float)
    }


def test_a_study_on_a_member_confirms_a_true_winner(world, tmp_path):
    store = {
        "optuna": f"sqlite:///{tmp_path}/optuna.db",
        "mlflow": f"sqlite:///{tmp_path}/mlflow.db",
    }
    got = bench_search.study(tmp_path, store, world, noise=0.02, seed=0, model=True)
    assert got["reached"] and not got["false"] and not got["dropped"]
    assert got["launches"] == got["spent"] < 30 and got["errors"] and got["cpu"] > 0


def test_a_bisect_names_a_planted_wrong_wiring(world, tmp_path):
    cases = bench_search.bisect_cases(world)
    pair = next(c for c in cases if list(c["culprit"]) == ["eagle_aux_hidden_state_layer_ids"])
    store = {"mlflow": f"sqlite:///{tmp_path}/mlflow.db"}
    got = bench_search.bisect_run(
        tmp_path, store, world, pair, noise=0.0, seed=random.Random(0).randint(0, 9)
    )
    assert got["correct"], got
