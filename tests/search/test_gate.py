"""Stage 1: wirings map to live layer ids, ids the dump lacks are recomputed by the target, and the
gate."""

from __future__ import annotations

import math

import pytest

from bisect_eagle.errors import BadInput
from bisect_eagle.search.gate import GATE_Z, PROXY_REL_SD, apply_gate
from bisect_eagle.spec.schema import Spec, StandaloneStage, Wiring
from bisect_eagle.trials.standalone import Candidate, Scorer, Verdict, candidates


def spec_with(*wirings: dict, **kw) -> Spec:
    return Spec(
        name="g",
        dump_layer_ids=[1, 5, 9],
        source="g.yaml",
        standalone=StandaloneStage(wirings=[Wiring(**w) for w in wirings]),
        **kw,
    )


def test_rules_and_ids_map_to_live_sglang_ids():
    spec = spec_with(
        {"rule": "[:-1]"},
        {"rule": "[1:]"},
        {"rule": "[emb,0,1]"},
        {"layer_ids": [0, 4, 8]},
        {"layer_ids": [1, 5, 9]},
        {"layer_ids": [-1, 1, 5], "name": "emb again"},
    )
    got = {tuple(c.layer_ids): (c.rule, c.source, c.label) for c in candidates(spec, 12)}
    # the same live wiring, scored once
    assert got[(1, 5, 9)] == ("[:-1]", "dump", "[:-1] = [1, 5, 9]")
    # the dump's last state is the final one: id N-1
    assert got[(5, 9, 11)] == ("[1:]", "dump", "[1:]")
    assert got[(-1, 1, 5)] == ("[emb,0,1]", "dump", "[emb,0,1] = emb again")
    assert got[(0, 4, 8)] == ("[0,1,2]", "target", "[0, 4, 8]")  # not in the dump: recomputed
    assert len(got) == 4


def test_bad_wirings_name_the_spec_entry():
    with pytest.raises(
        BadInput, match=r"g.yaml: standalone.wirings\[0\] \(\[0,7\]\).*outside a dump of 4 states"
    ):
        candidates(spec_with({"rule": "[0,7]"}), 12)
    with pytest.raises(
        BadInput, match=r"standalone.wirings\[0\].*sglang layer id 12 is outside \[-1, 11\]"
    ):
        candidates(spec_with({"layer_ids": [1, 5, 12]}), 12)


def verdict(label: str, acc: float, sd: float = 0.0) -> Verdict:
    return Verdict(label, [1], "[0]", "dump", acc, 1.0, [], 10, accuracy_sd=sd)


def test_gate_keeps_wirings_within_noise_of_the_reference():
    vs = [verdict("a", 0.80), verdict("b", 0.74), verdict("c", 0.30)]
    assert apply_gate(vs, margin=0.05, reference=None) == 0.80
    # 0.06 below the best is outside the margin but inside the teacher-forced proxy's own error
    # (2.33·4 % of 0.8)
    assert [v.passed for v in vs] == [True, True, False]
    assert vs[1].threshold == pytest.approx(0.80 - GATE_Z * PROXY_REL_SD * 0.80)
    assert [n for n in vs[0].notes if n.startswith("gate rank")] == ["gate rank 1"]
    assert [n for n in vs[1].notes if n.startswith("gate rank")] == ["gate rank 2"]
    # the draft's recorded training accuracy
    assert apply_gate(vs, margin=0.05, reference=0.95) == 0.95
    assert not any(v.passed for v in vs)


def test_the_margin_is_a_floor_and_the_samples_noise_widens_the_gate():
    apply_gate(vs := [verdict("a", 0.80), verdict("b", 0.60)], margin=0.05, reference=None)
    assert not vs[1].passed and "gate rank 1" not in vs[1].notes
    apply_gate(vs := [verdict("a", 0.80), verdict("b", 0.60)], margin=0.25, reference=None)
    assert vs[1].passed and vs[1].threshold == pytest.approx(0.55)
    apply_gate(
        vs := [verdict("a", 0.80, sd=0.06), verdict("b", 0.60, sd=0.06)],
        margin=0.05,
        reference=None,
    )
    assert vs[1].passed  # a dump of few samples cannot tell 0.60 from 0.80


def test_a_dumps_samples_give_the_accuracy_its_bootstrap_error():
    from bisect_eagle.trials.accuracy import bootstrap_sd

    even = bootstrap_sd([100] * 50, [80] * 50)
    assert even == pytest.approx(0.0, abs=1e-12)  # every sample agrees: no sampling error
    mixed = bootstrap_sd([100] * 50, [100, 60] * 25)
    # per-sample rates 1.0 and 0.6: sd 0.2 over 50 samples
    assert mixed == pytest.approx(0.2 / 50**0.5, rel=0.15)
    assert math.isnan(bootstrap_sd([100], [80]))  # one sample: no error can be told


@pytest.fixture(scope="module")
def scorer(tiny) -> Scorer:
    meta = tiny.meta
    spec = Spec(
        name="tiny-gate",
        target=tiny.target,
        draft=tiny.draft,
        dump=tiny.dump,
        prompts=tiny.prompts,
        dump_layer_ids=meta["aux_layer_ids"]["sglang"],
        source="tiny",
        standalone=StandaloneStage(samples=4, steps=2),
    )
    return Scorer(spec)


def test_recomputed_states_score_like_the_dumped_ones(scorer):
    from_dump = scorer.score(Candidate("dump", [1, 5, 9], "[:-1]", "dump"))
    recomputed = scorer.score(Candidate("target", [1, 5, 9], "[0,1,2]", "target"))
    assert from_dump.tokens == recomputed.tokens > 0
    # bf16 dump vs float32 recompute
    assert recomputed.accuracy == pytest.approx(from_dump.accuracy, abs=0.03)
    shifted = scorer.score(Candidate("shift", [0, 4, 8], "[0,1,2]", "target"))
    last3 = scorer.score(Candidate("[1:]", [5, 9, 11], "[1:]", "dump"))
    assert from_dump.accuracy > shifted.accuracy + 0.02  # a shift of one layer is close, but worse
    assert from_dump.accuracy > last3.accuracy + 0.2
