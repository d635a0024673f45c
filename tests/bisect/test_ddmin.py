"""Isolating delta debugging (the pure ``ddmin`` module) against synthetic deterministic oracles:
exact breaking sets and repair sets, the probe bound, skips."""

from __future__ import annotations

import itertools
import math

import pytest

from bisect_eagle.bisect.culprits import find_culprits
from bisect_eagle.bisect.ddmin import (
    Answer,
    BisectStatus,
    ProbeMemo,
    ProbeOutcome,
    isolate,
    probe_bound,
    shrink,
)


def names(n: int) -> list[str]:
    return [f"s{i}" for i in range(n)]


def oracle(causes: list[set[str]], skip=lambda cfg: False, calls: list | None = None):
    """BAD when the configuration holds a whole cause; UNRESOLVED where ``skip`` says so."""

    def answer(cfg: frozenset[str]) -> Answer:
        if calls is not None:
            calls.append(cfg)
        if skip(cfg):
            return Answer(ProbeOutcome.UNRESOLVED, "crashed")
        return Answer(ProbeOutcome.BAD if any(c <= cfg for c in causes) else ProbeOutcome.GOOD)

    return answer


def bound(c: int, n: int) -> int:
    """Isolation (endpoints included), the repair set's 1-minimality, and a verification per answer
    (b <= c)."""
    return 2 * c * math.ceil(math.log2(n)) + 2 + c + c + 1


def repairs(causes: list[set[str]], n: int, repair: tuple[str, ...]) -> bool:
    """Whether reverting ``repair`` from the bad configuration (all ``n`` applied) leaves no whole
    cause."""
    rest = set(names(n)) - set(repair)
    return not any(c <= rest for c in causes)


def one_minimal_repair(causes: list[set[str]], n: int, repair: tuple[str, ...]) -> bool:
    return repairs(causes, n, repair) and not any(
        repairs(causes, n, tuple(r for r in repair if r != x)) for x in repair
    )


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
def test_single_culprit_anywhere_is_found_within_the_bound(n):
    for culprit in names(n):
        result = find_culprits(names(n), oracle([{culprit}]))
        assert result.status == "isolated"
        assert result.breaking == [(culprit,)] and result.culprits == [culprit]
        assert result.repair == (culprit,)
        assert len(result.probes) <= bound(1, n)


def test_binary_search_cost_for_one_culprit():
    """At n = 2 one probe halves the difference: ceil(log2 n) probes plus the endpoints, two checks
    and the two verifications (the breaking set, the repair set)."""
    result = find_culprits(names(16), oracle([{"s11"}]))
    assert len(result.probes) <= 2 + 4 + 2 + 2
    assert [(p.applied, p.verifies) for p in result.probes[-2:]] == [
        (("s11",), "breaking"),
        (tuple(n for n in names(16) if n != "s11"), "repair"),
    ]


@pytest.mark.parametrize("n", [2, 4, 7, 8])
def test_two_independent_culprits(n):
    for a, b in itertools.combinations(names(n), 2):
        result = find_culprits(names(n), oracle([{a}, {b}]))
        assert result.status == "isolated"
        assert sorted(result.breaking) == sorted([(a,), (b,)])
        assert sorted(result.repair) == sorted((a, b))
        assert len(result.probes) <= bound(2, n)


@pytest.mark.parametrize("n", [2, 5, 7, 9])
def test_interacting_culprits_are_reported_as_one_cause(n):
    for a, b in itertools.combinations(names(n), 2):
        result = find_culprits(names(n), oracle([{a, b}]))
        assert result.status == "isolated"
        assert result.breaking == [(a, b)]
        assert result.repair in ((a,), (b,))  # reverting either one repairs the bad configuration
        assert len(result.probes) <= bound(2, n)


def test_three_interacting_and_mixed_causes():
    n = 9
    for combo in itertools.combinations(names(n), 3):
        result = find_culprits(names(n), oracle([set(combo)]))
        assert result.breaking == [combo] and len(result.probes) <= bound(3, n)
        assert one_minimal_repair([set(combo)], n, result.repair) and len(result.repair) == 1
    for a, b, c in itertools.permutations(names(7), 3):
        result = find_culprits(names(7), oracle([{a, b}, {c}]))
        assert sorted(result.breaking) == sorted([tuple(sorted((a, b), key=names(7).index)), (c,)])
        assert one_minimal_repair([{a, b}, {c}], 7, result.repair) and c in result.repair
        assert len(result.probes) <= bound(3, 7)


def test_probes_are_memoised_per_configuration():
    calls: list = []
    result = find_culprits(names(8), oracle([{"s2"}, {"s6"}], calls=calls))
    search = [p.applied for p in result.probes if p.verifies is None]
    # each asked once while searching
    assert len(calls) == len(result.probes) and len(search) == len(set(search))
    # then re-asked
    assert [p.verifies for p in result.probes if p.verifies] == ["breaking", "breaking", "repair"]
    assert result.probes[0].applied == () and result.probes[0].outcome is ProbeOutcome.GOOD
    assert (
        result.probes[1].applied == tuple(names(8)) and result.probes[1].outcome is ProbeOutcome.BAD
    )


def test_a_crashing_probe_is_unresolved_and_the_search_still_ends():
    n = 7
    crash = "s1"  # any partial configuration holding s1 crashes

    def skip(cfg):
        return crash in cfg and 0 < len(cfg) < n

    result = find_culprits(names(n), oracle([{"s5"}], skip=skip))
    # the bad configuration without s5 crashes: whether another breaking set remains there is not
    # known
    assert result.culprits == ["s5"] and result.status == "partial" and result.repair is None
    assert (
        result.unknown == [frozenset(names(n)) - {"s5"}]
        and "partial: another breaking set may lie within" in (result.notes[0])
    )
    assert result.unresolved and all(crash in applied for applied in result.unresolved)
    assert all(p.detail == "crashed" for p in result.probes if p.outcome is ProbeOutcome.UNRESOLVED)


def test_inseparable_crash_is_reported_as_ambiguous():
    n = 6

    # the culprit cannot be applied without crashing, except in the bad configuration
    def skip(cfg):
        return "s3" in cfg and len(cfg) < n

    result = find_culprits(names(n), oracle([{"s3"}], skip=skip))
    assert result.status == "ambiguous" and result.notes and result.unresolved
    # not established: never a claim
    assert result.breaking == [] and any("s3" in u for u in result.unknown)


def test_endpoints_that_do_not_hold():
    assert find_culprits(names(4), oracle([set()])).status == "good-not-good"  # everything fails
    assert find_culprits(names(4), oracle([{"s9"}])).status == "bad-not-bad"
    skipped = find_culprits(names(4), oracle([{"s1"}], skip=lambda cfg: len(cfg) == 4))
    assert skipped.status == "bad-not-bad" and skipped.unresolved == [tuple(names(4))]


def test_isolate_returns_a_one_minimal_difference():
    test = ProbeMemo(names(10), oracle([{"s4"}]))
    test(frozenset())
    test(frozenset(names(10)))
    passing, failing = isolate(frozenset(), frozenset(names(10)), test=test)
    assert failing - passing == {"s4"}
    assert test.peek(passing) is ProbeOutcome.GOOD and test.peek(failing) is ProbeOutcome.BAD


def test_progress_reports_settings_left_and_probes():
    seen: list[str] = []
    find_culprits(names(8), oracle([{"s7"}]), progress=seen.append)
    assert seen[0] == "8 settings left (~4 probes)"
    assert any(m.startswith("2 settings left") for m in seen)


def test_breaking_and_repair_sets_differ_when_changes_interact():
    """s1+s2 break the good configuration only together; reverting either repairs the bad one."""
    result = find_culprits(names(5), oracle([{"s1", "s2"}]))
    assert result.status is BisectStatus.ISOLATED
    assert result.breaking == [("s1", "s2")]
    assert len(result.repair) == 1 and result.repair[0] in ("s1", "s2")


def test_a_compensated_cause_is_still_a_breaking_set_when_the_rest_fails():
    """s0 breaks it alone; s2+s3 break it together; both are reported, and the repair set reverts
    both."""
    result = find_culprits(names(6), oracle([{"s0"}, {"s2", "s3"}]))
    assert sorted(result.breaking) == [("s0",), ("s2", "s3")]
    assert one_minimal_repair([{"s0"}, {"s2", "s3"}], 6, result.repair) and "s0" in result.repair


def test_shrink_gives_a_one_minimal_subset():
    calls: list = []

    def holds(cfg):
        calls.append(cfg)
        return {"b", "d"} <= cfg

    assert shrink(["a", "b", "c", "d"], holds) == ("b", "d")
    assert len(calls) <= 4 + 3 + 2


def test_every_repair_set_is_one_minimal():
    for n in (3, 6):
        for causes in (
            [{"s0"}],
            [{"s0", "s1"}],
            [{"s0"}, {"s1", "s2"}],
            [{"s1", "s2"}, {"s0", "s2"}],
        ):
            result = find_culprits(names(n), oracle(causes))
            assert one_minimal_repair(causes, n, result.repair), (n, causes, result.repair)
            # each breaking set breaks, and none of its parts alone does
            for cause in result.breaking:
                cfg = set(cause)
                assert any(c <= cfg for c in causes)
                assert not any(any(c <= cfg - {x} for c in causes) for x in cfg)


def test_probe_bound():
    assert probe_bound(2, 7) == 19 and probe_bound(1, 1) == 5 and probe_bound(3, 16) == 33
    # two interacting culprits: one breaking set to verify
    assert probe_bound(2, 7, breaking=1) == 18


def test_the_module_imports_only_the_standard_library():
    import ast
    import sys
    from pathlib import Path

    import bisect_eagle.bisect.ddmin as ddmin

    tree = ast.parse(Path(ddmin.__file__).read_text())
    imported = {
        (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in (n.names if isinstance(n, ast.Import) else [n])
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
