"""Isolating delta debugging against synthetic deterministic oracles: exact culprits, the probe bound, skips."""

from __future__ import annotations

import itertools
import math

import pytest

from bisect_eagle.errors import BadInput
from bisect_eagle.search.bisect import (
    Answer,
    BisectLog,
    Judge,
    Outcome,
    ProbeMemo,
    apply_changes,
    differences,
    find_culprits,
    isolate,
    parse_log,
    probe_bound,
)


def names(n: int) -> list[str]:
    return [f"s{i}" for i in range(n)]


def oracle(causes: list[set[str]], skip=lambda cfg: False, calls: list | None = None):
    """BAD when the configuration holds a whole cause; UNRESOLVED where ``skip`` says so."""

    def answer(cfg: frozenset[str]) -> Answer:
        if calls is not None:
            calls.append(cfg)
        if skip(cfg):
            return Answer(Outcome.UNRESOLVED, "crashed")
        return Answer(Outcome.BAD if any(c <= cfg for c in causes) else Outcome.GOOD)

    return answer


def bound(c: int, n: int) -> int:
    return 2 * c * math.ceil(math.log2(n)) + 2


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
def test_single_culprit_anywhere_is_found_within_the_bound(n):
    for culprit in names(n):
        result = find_culprits(names(n), oracle([{culprit}]))
        assert result.status == "isolated"
        assert result.causes == [(culprit,)] and result.culprits == [culprit]
        assert len(result.probes) <= bound(1, n)


def test_binary_search_cost_for_one_culprit():
    """At n = 2 one probe halves the difference: ceil(log2 n) probes plus the endpoints and two checks."""
    result = find_culprits(names(16), oracle([{"s11"}]))
    assert len(result.probes) <= 2 + 4 + 2


@pytest.mark.parametrize("n", [2, 4, 7, 8])
def test_two_independent_culprits(n):
    for a, b in itertools.combinations(names(n), 2):
        result = find_culprits(names(n), oracle([{a}, {b}]))
        assert result.status == "isolated"
        assert sorted(result.causes) == sorted([(a,), (b,)])
        assert len(result.probes) <= bound(2, n)


@pytest.mark.parametrize("n", [2, 5, 7, 9])
def test_interacting_culprits_are_reported_as_one_cause(n):
    for a, b in itertools.combinations(names(n), 2):
        result = find_culprits(names(n), oracle([{a, b}]))
        assert result.status == "isolated"
        assert result.causes == [(a, b)]
        assert len(result.probes) <= bound(2, n)


def test_three_interacting_and_mixed_causes():
    n = 9
    for combo in itertools.combinations(names(n), 3):
        result = find_culprits(names(n), oracle([set(combo)]))
        assert result.causes == [combo] and len(result.probes) <= bound(3, n)
    for a, b, c in itertools.permutations(names(7), 3):
        result = find_culprits(names(7), oracle([{a, b}, {c}]))
        assert sorted(result.causes) == sorted([tuple(sorted((a, b), key=names(7).index)), (c,)])
        assert len(result.probes) <= bound(3, 7)


def test_probes_are_memoised_per_configuration():
    calls: list = []
    result = find_culprits(names(8), oracle([{"s2"}, {"s6"}], calls=calls))
    assert len(calls) == len(set(calls)) == len(result.probes)
    assert result.probes[0].applied == () and result.probes[0].outcome is Outcome.GOOD
    assert result.probes[1].applied == tuple(names(8)) and result.probes[1].outcome is Outcome.BAD


def test_a_crashing_probe_is_unresolved_and_the_search_still_ends():
    n = 7
    crash = "s1"  # any partial configuration holding s1 crashes

    def skip(cfg):
        return crash in cfg and 0 < len(cfg) < n

    result = find_culprits(names(n), oracle([{"s5"}], skip=skip))
    assert result.culprits == ["s5"] and result.status == "isolated"
    assert result.unresolved and all(crash in applied for applied in result.unresolved)
    assert all(p.detail == "crashed" for p in result.probes if p.outcome is Outcome.UNRESOLVED)


def test_inseparable_crash_is_reported_as_ambiguous():
    n = 6

    def skip(cfg):  # the culprit cannot be applied without crashing, except in the bad configuration
        return "s3" in cfg and len(cfg) < n

    result = find_culprits(names(n), oracle([{"s3"}], skip=skip))
    assert result.status == "ambiguous"
    assert "s3" in result.culprits and result.notes
    assert len(result.culprits) < n or result.unresolved


def test_endpoints_that_do_not_hold():
    assert find_culprits(names(4), oracle([set()])).status == "good-not-good"  # everything fails
    assert find_culprits(names(4), oracle([{"s9"}])).status == "bad-not-bad"
    skipped = find_culprits(names(4), oracle([{"s1"}], skip=lambda cfg: len(cfg) == 4))
    assert skipped.status == "bad-not-bad" and skipped.unresolved == [tuple(names(4))]


def test_isolate_returns_a_one_minimal_difference():
    test = ProbeMemo(names(10), oracle([{"s4"}]))
    test(frozenset())
    test(frozenset(names(10)))
    passing, failing = isolate(frozenset(), frozenset(names(10)), test)
    assert failing - passing == {"s4"}
    assert test.peek(passing) is Outcome.GOOD and test.peek(failing) is Outcome.BAD


def test_progress_reports_settings_left_and_probes():
    seen: list[str] = []
    find_culprits(names(8), oracle([{"s7"}]), progress=seen.append)
    assert seen[0] == "8 settings left (~4 probes)"
    assert any(m.startswith("2 settings left") for m in seen)


# ---------------------------------------------------------------------------------------------------
# the pieces around dd: differences, the judge, the log


def test_differences_one_item_per_setting_or_group():
    good = {"num_steps": 3, "topk": 1, "env.NCCL_ALGO": None, "server_args.a": 1, "server_args.b": 2}
    bad = {"num_steps": 1, "topk": 1, "env.NCCL_ALGO": "Tree", "server_args.a": 5, "server_args.b": 6}
    changes = differences(good, bad, groups=[["server_args.a", "server_args.b"]])
    assert [c.name for c in changes] == ["num_steps", "env.NCCL_ALGO", "server_args.a+server_args.b"]
    assert changes[2].to_json() == {"name": "server_args.a+server_args.b", "settings": ["server_args.a",
                                    "server_args.b"], "good": {"server_args.a": 1, "server_args.b": 2},
                                    "bad": {"server_args.a": 5, "server_args.b": 6}}
    assert apply_changes(good, changes[:2]) == {**good, "num_steps": 1, "env.NCCL_ALGO": "Tree"}


def test_wiring_differs_only_when_the_resolved_ids_do():
    good, bad = {"eagle_aux_hidden_state_layer_ids": None}, {"eagle_aux_hidden_state_layer_ids": [1, 5, 9]}
    assert differences(good, bad, wiring=([1, 5, 9], [1, 5, 9])) == []
    bad = {"eagle_aux_hidden_state_layer_ids": [-1, 1, 5]}
    (change,) = differences(good, bad, wiring=([1, 5, 9], [-1, 1, 5]))
    assert change.values("good") == [1, 5, 9] and change.values("bad") == [-1, 1, 5]
    assert change.good == {"eagle_aux_hidden_state_layer_ids": None}  # applied as written: the draft's own ids


def test_judge_band_from_repeats():
    judge = Judge("output_tok_s", ratio=0.9, band=2.0, reference=100.0, reference_mad=1.0)
    assert judge.limit == 90.0
    assert judge.classify(93.0, 0.5)[0] is Outcome.GOOD  # 93 >= 90 + 2 * 1.4826 * 1
    assert judge.classify(86.0, 0.5)[0] is Outcome.BAD
    outcome, why = judge.classify(91.0, 0.5)
    assert outcome is Outcome.UNRESOLVED and "within the noise band" in why
    assert judge.classify(91.0, 3.0)[0] is Outcome.UNRESOLVED  # the probe's own noise widens the band
    assert judge.classify(float("nan"), 0.0)[0] is Outcome.UNRESOLVED
    exact = Judge("accept_length", threshold=2.5)
    assert exact.classify(2.5, 0.0)[0] is Outcome.GOOD and exact.classify(2.49, 0.0)[0] is Outcome.BAD


def test_log_round_trip_and_edited_marks(tmp_path):
    changes = differences({"num_steps": 3, "env.X": None}, {"num_steps": 1, "env.X": "1"})
    log = BisectLog("good.yaml", "bad.yaml", Judge().settings(), {"num_prompts": 2}, changes,
                    reference={"median": 10.0, "mad": 0.5})
    log.marks += [(Outcome.GOOD, (), "measured"), (Outcome.BAD, ("num_steps", "env.X"), "")]
    path = tmp_path / "b.log"
    log.write(path)
    text = path.read_text()
    assert "good -  # measured\nbad num_steps,env.X\n" in text and '#   num_steps: 3 -> 1' in text
    path.write_text(text.replace("bad num_steps,env.X", "skip num_steps,env.X"))
    parsed = parse_log(path)
    assert parsed.header["good"] == "good.yaml" and parsed.header["set"] == {"num_prompts": 2}
    assert parsed.header["reference"] == {"median": 10.0, "mad": 0.5}
    assert parsed.marks[1] == (Outcome.UNRESOLVED, ("num_steps", "env.X"), "")
    path.write_text(text + "maybe num_steps\n")
    with pytest.raises(BadInput, match=r"b.log:\d+: expected '<good\|bad\|skip>"):
        parse_log(path)
    path.write_text("hello\n")
    with pytest.raises(BadInput, match="b.log:1: expected '# bisect-eagle bisect log v1'"):
        parse_log(path)


def test_probe_bound():
    assert probe_bound(2, 7) == 14 and probe_bound(1, 1) == 2 and probe_bound(3, 16) == 26
