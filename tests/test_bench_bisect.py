"""The bisect benchmark (``scripts/bench_bisect.py``): the truth it grades against, its kinds of
case, and one planted overlap bisected exactly on a member of the family."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import bench_bisect  # noqa: E402
import landscape  # noqa: E402


def test_the_truth_is_every_minimal_breaking_set_over_all_subsets():
    a, b, c = "a", "b", "c"
    values = {
        frozenset(): 100.0,
        frozenset({a}): 95.0,
        frozenset({b}): 95.0,
        frozenset({c}): 95.0,
        frozenset({a, b}): 80.0,
        frozenset({b, c}): 80.0,
        frozenset({a, c}): 95.0,
        frozenset({a, b, c}): 70.0,
    }
    truth = bench_bisect.minimal_breaking(values, 90.0)
    assert truth == [frozenset({a, b}), frozenset({b, c})]
    assert bench_bisect.kind_of(values, truth, 90.0, set()) == "overlap"
    hidden = {
        frozenset(): 100.0,
        frozenset({a}): 80.0,
        frozenset({b}): 100.0,
        frozenset({a, b}): 100.0,
    }
    assert (
        bench_bisect.kind_of(hidden, bench_bisect.minimal_breaking(hidden, 90.0), 90.0, set())
        == "masked"
    )


def test_an_overlap_case_plants_two_interactions_sharing_a_setting_and_keeps_its_margin():
    world = landscape.draw_world(landscape.REPORTED_SEEDS[0])
    rng = random.Random(5)
    case = next(
        c
        for c in iter(lambda: bench_bisect.draw_case(world, rng, overlap=True), 0)
        if c is not None and c.kind == "overlap"
    )
    assert isinstance(case.world, bench_bisect.Planted) and len(case.world.extra) == 2
    shared = {case.world.extra[0][1]} & {case.world.extra[1][0]}
    assert shared  # A with B and B with C
    values = bench_bisect.subsets_truth(case.world, case.good, case.bad, case.changes)
    limit = bench_bisect.RATIO * values[frozenset()]
    assert all(abs(v / limit - 1) > 0.03 for v in values.values())


def test_a_noise_free_overlap_case_is_bisected_exactly(tmp_path):
    world = landscape.draw_world(landscape.REPORTED_SEEDS[0])
    rng = random.Random(5)
    case = next(
        c
        for c in iter(lambda: bench_bisect.draw_case(world, rng, overlap=True), 0)
        if c is not None and c.kind == "overlap"
    )
    run = bench_bisect.run_case(
        tmp_path, f"sqlite:///{tmp_path / 'mlflow.db'}", case, index=0, noise=0.0, max_launches=32
    )
    assert run["exact"] and not run["false"], run
    assert all(p > 0.99 for p in run["probabilities"])


def test_a_member_gives_exactly_per_world_cases_even_below_one_per_kind():
    """``--per-world 1`` is one case a member (the overlap kind first), not every case a kind left
    at 0 could draw; 3 is one of each kind."""
    seeds = tuple(landscape.REPORTED_SEEDS[:2])
    one = bench_bisect.draw_cases(seeds, 1)
    assert [c.world.seed for c in one] == list(seeds) and {c.kind for c in one} == {"overlap"}
    three = bench_bisect.draw_cases(seeds[:1], 3)
    assert sorted(c.kind for c in three) == sorted(bench_bisect.KINDS)
