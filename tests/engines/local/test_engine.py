"""The in-process EAGLE-3 engine: lossless for every wiring, honest counters, SGLang's rules, clear
errors."""

import json

import pytest
import torch
import typer
from typer.testing import CliRunner

from bisect_eagle.artifacts.draft import init_weights, load_draft
from bisect_eagle.artifacts.prompts import load_prompts
from bisect_eagle.artifacts.target import load_target
from bisect_eagle.engines.local import (
    DraftChain,
    Generation,
    LocalEngine,
    SpeculativeDecoder,
    accept_rates,
)
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.settings import LiveSettings

EOS = 256
FAST = {"num_prompts": 2, "warmup_prompts": 1, "max_new_tokens": 12}


@pytest.fixture(scope="module")
def models(tiny):
    torch.manual_seed(0)
    model, tok = load_target(tiny.target)
    return model, load_draft(tiny.draft, target=tiny.target), load_prompts(tiny.prompts, tok, n=4)


@pytest.fixture(scope="module")
def engine(tiny):
    with LocalEngine(tiny.target, tiny.draft, tiny.prompts) as e:
        yield e


@pytest.fixture(scope="module")
def baseline(models):
    """Plain greedy continuations (24 tokens, EOS ignored) of the first prompts."""
    model, _, prompts = models
    plain = SpeculativeDecoder(model, None, None, 0)
    return [plain.generate(p.input_ids, max_new_tokens=24).tokens for p in prompts]


def _random_draft(tiny):
    """The tiny draft's shapes with random weights: it almost never guesses right."""
    loaded = load_draft(tiny.draft, target=tiny.target)
    init_weights(loaded.model, seed=7, std=0.2)
    return loaded


@pytest.mark.parametrize("steps", [1, 3, 5])
@pytest.mark.parametrize("ids", [None, [5, 9, 11], [-1, 1, 5], [0, 4, 8], [2, 6, 10]])
def test_lossless_for_every_wiring(models, baseline, ids, steps):
    model, draft, prompts = models
    spec = SpeculativeDecoder(model, draft, ids, steps)
    for p, expected in zip(prompts[:3], baseline, strict=False):
        g = spec.generate(p.input_ids, max_new_tokens=24)
        assert g.tokens == expected
        assert sum(g.accepted_per_step) == len(g.tokens) == 24
        assert g.verify_steps == len(g.accepted_per_step) == len(g.drafted_per_step)
        assert all(1 <= a <= steps + 1 for a in g.accepted_per_step)
        assert all(d <= steps for d in g.drafted_per_step) and g.model_s > 0


def test_lossless_with_random_draft_eos_and_one_token_prompt(tiny, models, baseline):
    model, _, prompts = models
    spec = SpeculativeDecoder(model, _random_draft(tiny), None, 4)
    g = spec.generate(prompts[0].input_ids, max_new_tokens=24)
    # almost nothing accepted, still identical
    assert g.tokens == baseline[0] and g.verify_steps > 16
    # a token the target emits: both decoders stop right after its first occurrence
    eos = baseline[1][9]
    plain = SpeculativeDecoder(model, None, None, 0).generate(
        prompts[1].input_ids, max_new_tokens=24, eos_token_id=eos
    )
    fast = SpeculativeDecoder(model, models[1], None, 4).generate(
        prompts[1].input_ids, max_new_tokens=24, eos_token_id=eos
    )
    assert fast.tokens == plain.tokens == baseline[1][: baseline[1].index(eos) + 1]
    assert (
        fast.finished_by_eos
        and plain.finished_by_eos
        and sum(fast.accepted_per_step) == len(fast.tokens)
    )
    one = [prompts[2].input_ids[0]]
    expected = SpeculativeDecoder(model, None, None, 0).generate(one, max_new_tokens=10).tokens
    assert (
        SpeculativeDecoder(model, models[1], None, 3).generate(one, max_new_tokens=10).tokens
        == expected
    )


@pytest.mark.parametrize("steps", [3, 15])  # SGLang's chain default; the incident's 16 draft tokens
def test_true_wiring_accepts_more_than_wrong_ones(models, steps):
    model, draft, prompts = models

    def accept_length(ids):
        gens = [
            SpeculativeDecoder(model, draft, ids, steps).generate(p.input_ids, max_new_tokens=32)
            for p in prompts
        ]
        return sum(len(g.tokens) for g in gens) / sum(g.verify_steps for g in gens)

    true = accept_length([1, 5, 9])
    assert true > 1.5
    # the incident's [1:] and embedding-first wirings: >= 25% lower
    for wrong in ([5, 9, 11], [-1, 1, 5]):
        assert accept_length(wrong) < 0.75 * true
    for shifted in ([0, 4, 8], [2, 6, 10]):  # ids off by one: lower, by less
        assert 0.75 * true < accept_length(shifted) < true


def test_draft_chain_matches_teacher_forced_training_forward(models):
    """Live drafting (two extends, the second after a rollback) = ttt_forward fed the chain's own
    drafts."""
    model, draft, prompts = models
    x = prompts[0].input_ids
    aux = SpeculativeDecoder(model, draft, None, 3).aux_hidden_states(x)[None]
    rows = [len(x) // 2, len(x) - 1]
    chain = DraftChain(draft.model, len(x) + 4, torch.device("cpu"), skip_fc=False)
    with torch.inference_mode():
        proposed = [
            chain.propose(aux[:, : rows[0]], x[1 : rows[0] + 1], steps=4),
            chain.propose(aux[:, rows[0] : rows[1]], x[rows[0] + 1 : rows[1] + 1], steps=4),
        ]
        for n, drafts in zip(rows, proposed, strict=True):
            states = draft.model.ttt_forward(
                aux[:, :n], torch.tensor([x[1 : n + 1] + drafts[:-1]]), steps=4
            )
            picks = [
                int(draft.model.to_target_ids(draft.model.logits(h[0, -1]).argmax()))
                for h in states
            ]
            assert picks == drafts
    assert proposed[0] != proposed[1]


def test_aux_hidden_states_match_hf_hidden_states_in_ascending_order(models):
    model, draft, prompts = models
    ids = prompts[0].input_ids
    with torch.inference_mode():
        hs = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
        got = SpeculativeDecoder(model, draft, [9, 1, 5], 3).aux_hidden_states(ids)
    assert got.shape == (len(ids), 3 * model.config.hidden_size)
    torch.testing.assert_close(got, torch.cat([hs[2][0], hs[6][0], hs[10][0]], -1))


def run(engine, **settings):
    """Plan, then run (a refused plan raises BadInput with the engine's reason)."""
    plan = engine.plan(LiveSettings(**settings))
    if plan.refusal is not None:
        raise BadInput(plan.refusal)
    return engine.run(plan)


def test_trial_metrics_and_topk1_rule(engine):
    result = run(engine, num_steps=3, num_draft_tokens=8, **FAST)
    assert result.ok
    eff = result.effective
    assert (eff["num_steps"], eff["num_draft_tokens"], eff["topk"]) == (3, 4, 1)
    assert eff["eagle_aux_hidden_state_layer_ids"] == [1, 5, 9] and eff[
        "aux_hidden_state_indices"
    ] == [2, 6, 10]
    assert any(
        "num_draft_tokens = num_steps + 1 = 4" in w and "requested 8" in w for w in result.warnings
    )
    measured = [p.id for p in engine._prompts[1:3]]
    assert [r.id for r in result.requests] == measured  # the warm-up prompt is not counted
    tokens = sum(r.completion_tokens for r in result.requests)
    verify = sum(r.verify_steps for r in result.requests)
    assert sum(result.accept_length_hist.values()) == verify
    assert sum(k * v for k, v in result.accept_length_hist.items()) == tokens
    assert result.accept_length == pytest.approx(tokens / verify) and result.accept_length >= 1
    assert len(result.accept_rate_per_position) == 3
    assert all(0 <= r <= 1 for r in result.accept_rate_per_position)
    assert result.output_tok_s == pytest.approx(tokens / result.wall_s)
    assert 0 < result.model_s < result.wall_s


def test_accept_rate_per_position_is_conditional():
    steps = Generation(
        tokens=[0] * 7,
        verify_steps=3,
        accepted_per_step=[4, 1, 2],
        model_s=0.0,
        finished_by_eos=False,
        drafted_per_step=[3, 3, 3],
    )
    # an EOS that was itself an accepted draft: 2 tokens emitted, only the first draft counted as
    # judged
    eos_cut = Generation(
        tokens=[0] * 2,
        verify_steps=1,
        accepted_per_step=[2],
        model_s=0.0,
        finished_by_eos=True,
        drafted_per_step=[1],
    )
    assert accept_rates([steps], 3) == [2 / 3, 1 / 2, 1.0]
    assert accept_rates([steps, eos_cut], 4)[:3] == [3 / 4, 1 / 2, 1.0]


def test_same_ids_in_another_order_are_the_same_trial(engine):
    a = engine.plan(LiveSettings(eagle_aux_hidden_state_layer_ids=[9, 1, 5], **FAST))
    b = engine.plan(LiveSettings(num_draft_tokens=4, **FAST))
    assert a.fingerprint == b.fingerprint and a.effective == b.effective and b.warnings == ()


def test_ignored_and_default_settings_do_not_change_the_plan(engine):
    base = engine.plan(LiveSettings(**FAST)).fingerprint
    for extra in (
        {"concurrency": 4},
        {"env": {"NCCL_ALGO": "Ring"}},
        {"server_args": {"attention_backend": "fa3"}},
        {"eagle_aux_hidden_state_layer_ids": [1, 5, 9]},
        {"num_draft_tokens": 4},
    ):
        assert engine.plan(LiveSettings(**FAST, **extra)).fingerprint == base, extra
    assert engine.plan(LiveSettings(**{**FAST, "num_steps": 4})).fingerprint != base
    fresh = LocalEngine(engine.target_path, engine.draft_path, engine.prompts_path)
    # planning loads nothing
    assert fresh.plan(LiveSettings(**FAST)).fingerprint == base and fresh._models == {}


# Fingerprints of today's configs (before speculative_adaptive existed): a false value leaves each
# unchanged.
FINGERPRINTS = [
    ({}, "75ae9069ce5e053e"),
    ({"num_steps": 5, "eagle_aux_hidden_state_layer_ids": [2, 6, 10]}, "f3a14c8d380d29f4"),
    ({"speculative_algorithm": "none"}, "dd0f544b3e41d43b"),
]


@pytest.mark.parametrize("request_, fingerprint", FINGERPRINTS)
def test_adaptive_off_leaves_the_plan_as_it_was_and_on_is_refused(engine, request_, fingerprint):
    for off in (
        {},
        {"speculative_adaptive": False},
        {"server_args": {"speculative_adaptive": False}},
    ):
        plan = engine.plan(LiveSettings(**request_, **off))
        assert plan.fingerprint == fingerprint and "speculative_adaptive" not in plan.effective, off
    on = engine.plan(LiveSettings(**request_, speculative_adaptive=True))
    if on.is_baseline:  # the baseline drafts nothing: adaptive has nothing to adapt
        assert on.refusal is None and on.fingerprint == fingerprint
    else:
        assert on.refusal.startswith("speculative_adaptive: the local engine has no adaptive mode")
        assert "\n" not in on.refusal and on.effective["speculative_adaptive"] is True
        with pytest.raises(BadInput, match="no adaptive mode"):
            engine.run(on)


def test_baseline_trial(engine):
    result = run(engine, speculative_algorithm="none", **FAST)
    eff = result.effective
    assert result.ok and eff["eagle_aux_hidden_state_layer_ids"] is None and eff["num_steps"] == 0
    tokens = sum(r.completion_tokens for r in result.requests)
    assert result.accept_length == 1.0 and result.accept_length_hist == {1: tokens}
    assert result.accept_rate_per_position == []


def test_paired_run_interleaves_the_same_prompts_and_reports_the_geometric_mean_speedup(engine):
    import math

    spec = engine.plan(LiveSettings(num_steps=3, **{**FAST, "num_prompts": 3}))
    base = engine.plan(LiveSettings(speculative_algorithm="none", **{**FAST, "num_prompts": 3}))
    paired = engine.run_paired(spec, base)
    cand, ref = paired.candidate, paired.baseline
    assert (
        [r.id for r in cand.requests]
        == [r.id for r in ref.requests]
        == [p.id for p in engine._prompts[1:4]]
    )
    # greedy speculative decoding is lossless: the same tokens per prompt, fewer verify steps
    assert [r.completion_tokens for r in cand.requests] == [
        r.completion_tokens for r in ref.requests
    ]
    assert cand.accept_length > 1.0 == ref.accept_length
    expected = [
        (a.completion_tokens / a.latency_s) / (b.completion_tokens / b.latency_s)
        for a, b in zip(cand.requests, ref.requests, strict=True)
    ]
    assert paired.ratios == pytest.approx(expected)
    assert paired.speedup == pytest.approx(math.exp(sum(map(math.log, expected)) / 3))
    assert paired.lower <= paired.speedup <= paired.upper and paired.confidence == 0.95
    assert (
        cand.effective["aux_hidden_state_indices"] == [2, 6, 10] and ref.effective["num_steps"] == 0
    )


def test_eagle_with_eagle3_draft_runs_like_sglang(engine):
    result = run(
        engine, speculative_algorithm="EAGLE", eagle_aux_hidden_state_layer_ids=[1, 5, 9], **FAST
    )
    true = run(engine, **FAST)
    assert result.ok and result.effective["eagle_aux_hidden_state_layer_ids"] == []
    assert any("fc is skipped" in w for w in result.warnings)
    assert any("not used" in w for w in result.warnings)
    assert result.accept_length < 1.3 < true.accept_length


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"num_steps": 0}, "num_steps must be >= 1"),
        ({"eagle_aux_hidden_state_layer_ids": [1, 5, 12]}, r"12 is outside \[-1, 11\]"),
        ({"eagle_aux_hidden_state_layer_ids": [-2, 1, 5]}, r"-2 is outside \[-1, 11\]"),
        (
            {"eagle_aux_hidden_state_layer_ids": [1, 5]},
            r"the draft's fc takes 3 aux layers .*\[1, 5\] has 2",
        ),
        ({"topk": 2, "num_draft_tokens": 6}, "tree drafting"),
        ({"temperature": 0.7}, "decodes greedily"),
        ({"num_prompts": 30}, "but the file has only"),
        ({"device": "banana"}, "banana"),
    ],
)
def test_clear_errors(engine, settings, message):
    with pytest.raises(BadInput, match=message):
        run(engine, **{**FAST, **settings})


def test_repeated_ids_are_refused_before_any_plan():
    with pytest.raises(ValueError, match="layer id 5 repeats"):
        LiveSettings(eagle_aux_hidden_state_layer_ids=[1, 5, 5])


def test_decoder_refuses_zero_steps(models):
    model, draft, _ = models
    with pytest.raises(BadInput, match="num_steps must be >= 1"):
        SpeculativeDecoder(model, draft, None, 0)


def _cli():
    from bisect_eagle.cli.live import register

    app = typer.Typer()
    register(app)

    @app.callback()
    def _root() -> None:
        """Test app."""

    return app


def test_cli_live_json_and_baseline():
    args = [
        "live",
        "--scenario",
        "tiny",
        "--set",
        "num_prompts=2",
        "--set",
        "warmup_prompts=1",
        "--set",
        "max_new_tokens=8",
        "--json",
    ]
    spec = CliRunner().invoke(
        _cli(),
        [*args, "--set", "eagle_aux_hidden_state_layer_ids=[5,9,11]", "--set", "num_steps=4"],
    )
    assert spec.exit_code == 0, spec.output
    out = json.loads(spec.stdout)  # stderr: what the command is doing, with its clock
    assert out["effective"]["eagle_aux_hidden_state_layer_ids"] == [5, 9, 11]
    assert (out["effective"]["num_steps"], out["effective"]["num_draft_tokens"]) == (4, 5)
    assert len(out["accept_rate_per_position"]) == 4 and len(out["requests"]) == 2
    assert out["output_tok_s"] > 0 and out["accept_length"] >= 1
    base = CliRunner().invoke(_cli(), [*args, "--baseline"])
    assert base.exit_code == 0, base.output
    assert json.loads(base.stdout)["effective"]["speculative_algorithm"] == "none"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--set", "num_steps"], "expected key=value"),
        (["--set", "num_stepz=3"], "unknown setting num_stepz; did you mean num_steps?"),
        (["--set", "eagle_aux_hidden_state_layer_ids=[5,9"], "not a YAML scalar or list"),
        (["--baseline", "--set", "speculative_algorithm=EAGLE3"], "--baseline conflicts"),
    ],
)
def test_cli_bad_set_is_bad_input(flags, message):
    result = CliRunner().invoke(_cli(), ["live", "--scenario", "tiny", *flags])
    assert isinstance(result.exception, BadInput) and message in str(result.exception)
