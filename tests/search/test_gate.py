"""Stage 1: wirings map to live layer ids, ids the dump lacks are recomputed by the target, and the gate."""

from __future__ import annotations

import pytest

from bisect_eagle.errors import BadInput
from bisect_eagle.search.gate import apply_gate
from bisect_eagle.spec.schema import Spec, StandaloneStage, Wiring
from bisect_eagle.trials.standalone import Candidate, Scorer, Verdict, candidates


def spec_with(*wirings: dict, **kw) -> Spec:
    return Spec(name="g", dump_layer_ids=[1, 5, 9], source="g.yaml",
                standalone=StandaloneStage(wirings=[Wiring(**w) for w in wirings]), **kw)


def test_rules_and_ids_map_to_live_sglang_ids():
    spec = spec_with({"rule": "[:-1]"}, {"rule": "[1:]"}, {"rule": "[emb,0,1]"}, {"layer_ids": [0, 4, 8]},
                     {"layer_ids": [1, 5, 9]}, {"layer_ids": [-1, 1, 5], "name": "emb again"})
    got = {tuple(c.layer_ids): (c.rule, c.source, c.label) for c in candidates(spec, 12)}
    assert got[(1, 5, 9)] == ("[:-1]", "dump", "[:-1] = [1, 5, 9]")  # the same live wiring, scored once
    assert got[(5, 9, 11)] == ("[1:]", "dump", "[1:]")  # the dump's last state is the final one: id N-1
    assert got[(-1, 1, 5)] == ("[emb,0,1]", "dump", "[emb,0,1] = emb again")
    assert got[(0, 4, 8)] == ("[0,1,2]", "target", "[0, 4, 8]")  # not in the dump: recomputed
    assert len(got) == 4


def test_bad_wirings_name_the_spec_entry():
    with pytest.raises(BadInput, match=r"g.yaml: standalone.wirings\[0\] \(\[0,7\]\).*outside a dump of 4 states"):
        candidates(spec_with({"rule": "[0,7]"}), 12)
    with pytest.raises(BadInput, match=r"standalone.wirings\[0\].*sglang layer id 12 is outside \[-1, 11\]"):
        candidates(spec_with({"layer_ids": [1, 5, 12]}), 12)


def verdict(label: str, acc: float) -> Verdict:
    return Verdict(label, [1], "[0]", "dump", acc, 1.0, [], 10)


def test_gate_keeps_wirings_within_the_margin_of_the_reference():
    vs = [verdict("a", 0.80), verdict("b", 0.76), verdict("c", 0.30)]
    assert apply_gate(vs, margin=0.05, reference=None) == 0.80
    assert [v.passed for v in vs] == [True, True, False]
    assert apply_gate(vs, margin=0.05, reference=0.95) == 0.95  # the draft's recorded training accuracy
    assert not any(v.passed for v in vs)


@pytest.fixture(scope="module")
def scorer(tiny) -> Scorer:
    meta = tiny.meta
    spec = Spec(name="tiny-gate", target=tiny.target, draft=tiny.draft, dump=tiny.dump, prompts=tiny.prompts,
                dump_layer_ids=meta["aux_layer_ids"]["sglang"], source="tiny",
                standalone=StandaloneStage(samples=4, steps=2))
    return Scorer(spec)


def test_recomputed_states_score_like_the_dumped_ones(scorer):
    from_dump = scorer.score(Candidate("dump", [1, 5, 9], "[:-1]", "dump"))
    recomputed = scorer.score(Candidate("target", [1, 5, 9], "[0,1,2]", "target"))
    assert from_dump.tokens == recomputed.tokens > 0
    assert recomputed.accuracy == pytest.approx(from_dump.accuracy, abs=0.03)  # bf16 dump vs float32 recompute
    shifted = scorer.score(Candidate("shift", [0, 4, 8], "[0,1,2]", "target"))
    last3 = scorer.score(Candidate("[1:]", [5, 9, 11], "[1:]", "dump"))
    assert from_dump.accuracy > shifted.accuracy + 0.02  # a shift of one layer is close, but worse
    assert from_dump.accuracy > last3.accuracy + 0.2
