"""Every minimal breaking set (``bisect/culprits.py``) against deterministic oracles: sets that
overlap, sets a change hides in the bad configuration, and what is reported when the budget ends the
search first."""

from __future__ import annotations

import itertools

import pytest

from bisect_eagle.bisect.culprits import completeness_checks, find_culprits, minimal_hitting_sets
from bisect_eagle.bisect.ddmin import Answer, BisectStatus, ProbeOutcome


def names(n: int) -> list[str]:
    return [f"s{i}" for i in range(n)]


def monotone(causes: list[set[str]]):
    """BAD when the configuration holds a whole cause."""
    return lambda cfg: Answer(
        ProbeOutcome.BAD if any(c <= cfg for c in causes) else ProbeOutcome.GOOD
    )


def test_minimal_hitting_sets_and_the_checks_they_give():
    a, b, c = "a", "b", "c"
    assert minimal_hitting_sets([frozenset({a, b}), frozenset({b, c})]) == [
        frozenset({b}),
        frozenset({a, c}),
    ]
    assert minimal_hitting_sets([]) == [frozenset()]
    everything = frozenset({a, b, c, "d"})
    assert completeness_checks(everything, [frozenset({a, b})], {}) == [
        everything - {a},
        everything - {b},
    ]
    # d hidden in the bad configuration by c: with c reverted as well
    assert completeness_checks(everything, [frozenset({a})], {"d": ("c",)}) == [
        everything - {a},
        everything - {a, "c"},
    ]


@pytest.mark.parametrize("n", [3, 5, 8])
def test_two_overlapping_breaking_sets_are_both_found_and_nothing_more(n):
    """{A, B} and {B, C}: after the first, the bad configuration with A reverted still breaks (it
    holds B and C)."""
    for a, b, c in itertools.permutations(names(n), 3):
        causes = [{a, b}, {b, c}]
        result = find_culprits(names(n), monotone(causes))
        assert result.status is BisectStatus.ISOLATED and result.verified
        assert sorted(map(set, result.breaking), key=sorted) == sorted(causes, key=sorted)
        assert set(result.repair) in ({b}, {a, c})  # either is 1-minimal
        assert len(result.probes) <= result.probe_bound


def test_every_minimal_breaking_set_of_random_monotone_structures():
    """Up to three causes of one to three changes among 7, overlapping or not: exactly the minimal
    ones."""
    import random

    rng = random.Random(0)
    for _ in range(150):
        causes = [set(rng.sample(names(7), rng.randint(1, 3))) for _ in range(rng.randint(1, 3))]
        minimal = [c for c in causes if not any(o < c for o in causes)]
        unique = {frozenset(c) for c in minimal}
        result = find_culprits(names(7), monotone(causes))
        assert result.status is BisectStatus.ISOLATED, (causes, result.notes)
        assert {frozenset(b) for b in result.breaking} == unique, causes
        assert len(result.probes) <= result.probe_bound


def test_a_set_hidden_in_the_bad_configuration_is_found_with_its_masker_reverted():
    """s1 breaks the good configuration alone, but s3 hides it (EAGLE hides the wiring); s0 breaks
    it too. With s0 reverted the bad configuration is GOOD (s3 hides s1): only the plans' mask says
    to look without s3 as well."""

    def oracle(cfg):
        broken = "s0" in cfg or ("s1" in cfg and "s3" not in cfg)
        return Answer(ProbeOutcome.BAD if broken else ProbeOutcome.GOOD)

    blind = find_culprits(names(5), oracle)
    assert blind.breaking == [("s0",)]  # without the mask the structure looks complete
    seen = find_culprits(names(5), oracle, masked={"s1": ("s3",)})
    assert sorted(seen.breaking) == [("s0",), ("s1",)] and seen.status is BisectStatus.ISOLATED
    assert ("s1", "s2", "s4") in [p.applied for p in seen.probes]  # s0 and s3 reverted: s1 shows


def test_the_budget_leaves_the_answer_partial_naming_what_is_unknown():
    asked: list = []

    known: dict = {}

    # as the prober: a verdict given stays; nothing new is judged once the budget is spent
    def oracle(cfg):
        if cfg not in known:
            if len(asked) >= 6:
                return Answer(ProbeOutcome.UNRESOLVED, "the budget is spent")
            asked.append(cfg)
            known[cfg] = monotone([{"s1"}, {"s4", "s5"}])(cfg)
        return known[cfg]

    result = find_culprits(names(6), oracle, spent=lambda: len(asked) >= 6)
    assert result.status is BisectStatus.PARTIAL and result.unknown
    # what is claimed is right
    assert all(set(b) in ({"s1"}, {"s4", "s5"}) for b in result.breaking)
    assert any("the budget is spent" in n for n in result.notes) and result.repair is None
