"""Every answer of the delta debugging core is verified by a probe before it is isolated: breaking
sets applied to the good configuration judge BAD, the repair set reverted from the bad configuration
*as it is* (its not-changes kept) judges GOOD; a not-change that matters becomes a change; a
verification that fails is an interaction."""

from __future__ import annotations

import itertools
import random

import pytest

from bisect_eagle.bisect.culprits import find_culprits
from bisect_eagle.bisect.ddmin import Answer, BisectStatus, ProbeOutcome


def names(n: int) -> list[str]:
    return [f"s{i}" for i in range(n)]


def oracle(causes: list[set[str]], calls: list | None = None):
    """BAD when the configuration holds a whole cause."""

    def answer(cfg: frozenset[str]) -> Answer:
        if calls is not None:
            calls.append(cfg)
        return Answer(
            ProbeOutcome.BAD if any(c <= cfg for c in causes) else ProbeOutcome.GOOD,
            f"{len(cfg)} applied",
        )

    return answer


def repairs(causes: list[set[str]], bad: set[str], repair: tuple[str, ...]) -> bool:
    """Whether reverting ``repair`` from the bad configuration ``bad`` leaves no whole cause."""
    return not any(c <= bad - set(repair) for c in causes)


def test_the_repair_set_is_verified_on_the_bad_configuration_as_it_is():
    """Two harmless not-changes: the repair set is probed with them applied, one probe more, and it
    holds."""
    result = find_culprits(names(6), oracle([{"s3"}]), inert=["x", "y"])
    assert result.status is BisectStatus.ISOLATED and result.verified
    assert result.breaking == [("s3",)] and result.repair == ("s3",)
    breaking, repair = result.verifications
    assert (breaking.check, breaking.applied, breaking.expected, breaking.outcome) == (
        "breaking",
        ("s3",),
        ProbeOutcome.BAD,
        ProbeOutcome.BAD,
    )
    assert (repair.check, repair.applied, repair.outcome) == (
        "repair",
        ("s0", "s1", "s2", "s4", "s5", "x", "y"),
        ProbeOutcome.GOOD,
    )
    assert (
        result.probes[repair.probe - 1].applied == repair.applied
        and result.probes[-1].verifies == "repair"
    )
    assert len(result.probes) <= result.probe_bound and result.promoted == []


def test_a_not_change_that_matters_with_the_bad_configuration_becomes_a_change():
    """x is inert alone from both ends, but breaks together with s1: reverting s0 alone leaves the
    bad configuration broken. Verification finds it, x becomes a change, and the answer reverts it
    too."""
    causes = [{"s0"}, {"s1", "x"}]
    result = find_culprits(names(5), oracle(causes), inert=["x", "y"])
    assert result.status is BisectStatus.ISOLATED and result.verified
    assert result.promoted == ["x"] and "bisect continues with x as a change" in result.notes[0]
    assert sorted(result.breaking) == [("s0",), ("s1", "x")]
    assert repairs(causes, {*names(5), "x", "y"}, result.repair) and "s0" in result.repair
    first_repair = next(p for p in result.probes if p.verifies == "repair")
    # the false answer, measured
    assert first_repair.outcome is ProbeOutcome.BAD and "x" in first_repair.applied
    assert len(result.rounds) == 2 and len(result.probes) <= result.probe_bound


def test_every_isolated_answer_holds_on_the_bad_configuration():
    """Random causes over changes and not-changes: an isolated answer's repair set, reverted from
    the bad configuration with its not-changes, was measured GOOD, and truly repairs it; each
    breaking set truly breaks. A not-change needed by the bad configuration itself (good + the
    changes judges GOOD) becomes a change too."""
    rng, promoted = random.Random(7), 0
    for _ in range(300):
        n, k = rng.randint(1, 7), rng.randint(0, 3)
        order, inert = names(n), [f"x{i}" for i in range(k)]
        pool = [*order, *inert]
        causes = []
        for _ in range(rng.randint(1, 2)):
            cause = set(rng.sample(pool, rng.randint(1, min(2, len(pool)))))
            if cause & set(order) or rng.random() < 0.3:
                causes.append(cause)
        if (
            not causes
            or any(c <= set(inert) for c in causes)
            or not any(c <= set(pool) for c in causes)
        ):
            continue  # a not-change that breaks the good configuration alone is not inert
        result = find_culprits(order, oracle(causes), inert=inert)
        assert result.status is BisectStatus.ISOLATED and result.verified, (causes, result.notes)
        promoted += bool(result.promoted)
        repair = next(v for v in result.verifications if v.check == "repair")
        held = [x for x in inert if x not in result.promoted]
        assert set(repair.applied) == (set(order) | set(result.promoted) | set(held)) - set(
            result.repair
        )
        assert repair.outcome is ProbeOutcome.GOOD and repairs(causes, set(pool), result.repair), (
            causes,
            result,
        )
        for cause in result.breaking:
            assert any(c <= set(cause) for c in causes)
        assert len(result.probes) <= result.probe_bound, (causes, len(result.probes), result.rounds)
    assert promoted > 20  # the cases where a not-change mattered were drawn, and followed


def test_a_verification_that_fails_is_an_interaction_with_the_measured_values():
    """The oracle changes its mind about the repaired configuration when asked again (its limit
    moved):
    nothing is isolated, and the note names the set and the measured value."""
    asked: dict[frozenset, int] = {}

    def fickle(cfg: frozenset[str]) -> Answer:
        asked[cfg] = asked.get(cfg, 0) + 1
        if cfg == frozenset({"s0", "s2"}) and asked[cfg] > 1:
            return Answer(ProbeOutcome.BAD, "output_tok_s 80.1 vs limit 81")
        return Answer(ProbeOutcome.BAD if "s1" in cfg else ProbeOutcome.GOOD, "steady")

    result = find_culprits(names(3), fickle)
    assert result.status is BisectStatus.INTERACTION and not result.verified
    assert result.repair == ("s1",) and result.breaking == [("s1",)]
    (note,) = result.notes
    assert "repair set s1 reverted from the bad configuration measured BAD, not GOOD" in note
    assert "output_tok_s 80.1 vs limit 81" in note


def test_a_verification_that_cannot_be_judged_is_ambiguous():
    asked: dict[frozenset, int] = {}

    def crashes_later(cfg: frozenset[str]) -> Answer:
        asked[cfg] = asked.get(cfg, 0) + 1
        if cfg == frozenset({"s0"}) and asked[cfg] > 1:
            return Answer(ProbeOutcome.UNRESOLVED, "crashed")
        return Answer(ProbeOutcome.BAD if "s1" in cfg else ProbeOutcome.GOOD)

    result = find_culprits(names(2), crashes_later)
    assert result.status is BisectStatus.AMBIGUOUS and "could not be judged" in result.notes[-1]


@pytest.mark.parametrize("n", [2, 5, 8])
def test_verification_costs_one_probe_per_answer(n):
    """Without not-changes the verification probes re-ask configurations the search measured: b + 1
    probes."""
    for a, b in itertools.combinations(names(n), 2):
        calls: list = []
        result = find_culprits(names(n), oracle([{a}, {b}], calls=calls))
        extra = [p for p in result.probes if p.verifies]
        assert len(extra) == len(result.breaking) + 1 == 3
        searched = {frozenset(p.applied) for p in result.probes if not p.verifies}
        assert all(frozenset(p.applied) in searched for p in extra)  # nothing new to measure
