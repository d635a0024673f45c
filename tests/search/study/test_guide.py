"""The throughput model in the search: forecasts, choices, skips, and what a study logs with it
on."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import optuna
import pytest
from fake_engine import BASELINE_TOK_S, FakeEngine, make_spec, search

from bisect_eagle.search.study.guide import (
    HANDOFF,
    SAMPLER_EVERY,
    STUCK_AFTER,
    ModelGuide,
    _curve,
    model_inputs,
)
from bisect_eagle.search.study.model_summary import summarize
from bisect_eagle.spec.load import load_spec
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.runs import Tracking


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("store")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return {
        "root": str(root),
        "storage": f"sqlite:///{root}/optuna.db",
        "tracking": f"sqlite:///{root}/mlflow.db",
    }


def _effective(engine: FakeEngine, **settings) -> dict:
    return engine.plan(LiveSettings(**settings)).effective


def _truth(steps: int, a: float = 0.7) -> dict:
    """A consistent chain: per-position acceptance ``a``, a verify cycle 15 % dearer per draft
    step."""
    al = 1 + sum(a**k for k in range(1, steps + 1))
    return {
        "output_tok_s": BASELINE_TOK_S * al / (1 + 0.15 * steps),
        "accept_length": al,
        "accept_rate_per_position": [a] * steps,
        "completion_tokens": 512,
        "num_requests": 8,
    }


def _taught(metric: str = "output_tok_s") -> tuple[ModelGuide, FakeEngine]:
    """A guide that has seen the baseline and two chains of the true wiring (as a study would)."""
    engine, guide = FakeEngine(), ModelGuide(engine=FakeEngine(), metric=metric, optimism=0.98)
    guide.model.update(
        _effective(engine, speculative_algorithm="none", num_steps=0),
        {"output_tok_s": BASELINE_TOK_S, "accept_length": 1.0},
        record=False,
    )
    for steps in (2, 5):
        guide.model.update(_effective(engine, num_steps=steps), _truth(steps), record=False)
    return guide, engine


def test_no_forecast_before_the_first_cost_observation():
    guide = ModelGuide(engine="local", metric="output_tok_s", optimism=0.98)
    assert not guide.ready
    assert guide.forecast(_effective(FakeEngine(), num_steps=3), target=100.0) is None


def test_forecasts_follow_what_was_measured_and_name_their_metric():
    guide, engine = _taught()
    measured = _truth(4)["output_tok_s"]
    fc = guide.forecast(_effective(engine, num_steps=4), target=measured)
    assert fc is not None and fc.low <= fc.value <= fc.high
    assert fc.value == pytest.approx(measured, rel=0.10)  # between the two chains it has seen
    assert 0.2 < fc.chance < 0.8  # a target equal to the truth is a coin flip, not a certainty
    assert fc.optimistic > fc.high
    metrics = fc.metrics()
    assert metrics["predicted_output_tok_s"] == pytest.approx(fc.value)
    assert metrics["predicted_output_tok_s_low"] <= metrics["predicted_output_tok_s_high"]
    al_guide, _ = _taught("accept_length")
    al = al_guide.forecast(_effective(engine, num_steps=4), target=3.0)
    assert al.metric == "accept_length" and "predicted_accept_length_low" in al.metrics()


def test_choose_prefers_the_likeliest_and_counts_the_hopeless():
    guide, engine = _taught()
    # stage 1's verdict
    guide.learn_gate([{"layer_ids": [-1, 1, 5], "per_position": [{"full_vocab": 0.05}] * 3}])
    guide.live_learned = 2  # _taught fed two speculative trials straight to the model
    untried = {f"s{n}": ({"num_steps": n}, _effective(engine, num_steps=n)) for n in (1, 3, 6)}
    untried["wrong"] = (
        {"ids": "x"},
        _effective(engine, num_steps=3, eagle_aux_hidden_state_layer_ids=[-1, 1, 5]),
    )
    best = max((1, 3, 6), key=lambda n: _truth(n)["output_tok_s"])
    target = _truth(best)["output_tok_s"] * 0.98
    sampled, fc, hopeless = guide.choose(untried, target=target)
    assert sampled == {"num_steps": best} and fc.chance > 0.5
    # the wrong wiring (stage 1: it accepts almost nothing); one step (truly 148 < 171) is
    assert hopeless == 1
    # predicted 145 but not ruled out: MISFIT keeps a margin for the model's own error
    none, _, all_hopeless = guide.choose(untried, target=50 * BASELINE_TOK_S)
    assert none is None and all_hopeless == len(untried)


def test_model_inputs_read_back_a_logged_trial():
    m = model_inputs(
        {"output_tok_s": 10.0, "accept_length": 2.0, "completion_tokens": 96.0},
        {"num_prompts": 3},
        rates=[0.7, 0.5],
    )
    assert m == {
        "output_tok_s": 10.0,
        "accept_length": 2.0,
        "accept_rate_per_position": [0.7, 0.5],
        "completion_tokens": 96.0,
        "num_requests": 3,
    }


def test_priors_alone_rule_nothing_out():
    """Before a speculative live trial, even a config far below the target is not hopeless (stage 1
    may be off)."""
    engine, guide = (
        FakeEngine(),
        ModelGuide(engine=FakeEngine(), metric="output_tok_s", optimism=0.98),
    )
    guide.model.update(
        _effective(engine, speculative_algorithm="none", num_steps=0),
        {"output_tok_s": BASELINE_TOK_S, "accept_length": 1.0},
        record=False,
    )
    fc = guide.forecast(_effective(engine, num_steps=1), target=50 * BASELINE_TOK_S)
    assert fc.optimistic < 50 * BASELINE_TOK_S and not guide.hopeless(
        fc, target=50 * BASELINE_TOK_S
    )
    guide.live_learned = 1
    assert guide.hopeless(fc, target=50 * BASELINE_TOK_S)


def test_judge_is_the_forecast_as_stored_and_logged_and_the_skip_in_one_value():
    engine = FakeEngine()
    guide = ModelGuide(engine=FakeEngine(), metric="output_tok_s", optimism=0.98)
    guide.model.update(
        _effective(engine, speculative_algorithm="none", num_steps=0),
        {"output_tok_s": BASELINE_TOK_S, "accept_length": 1.0},
        record=False,
    )
    guide.live_learned = 1  # earned its veto
    effective, target = _effective(engine, num_steps=1), 50 * BASELINE_TOK_S
    judged = guide.judge(effective, target=target, may_skip=True)
    fc = guide.forecast(effective, target=target)
    assert judged.forecast == fc and judged.predicted == fc.to_json()
    assert judged.start_metrics == fc.metrics()
    assert judged.skip == (
        f"predicted output_tok_s {fc.value:.4g} (optimistic {fc.optimistic:.4g}) < target "
        f"{target:.4g}"
    )
    assert guide.judge(effective, target=target, may_skip=False).skip is None  # the sampler's turn
    reachable = BASELINE_TOK_S / 10
    assert guide.judge(effective, target=reachable, may_skip=True).skip is None


def test_summarize_without_a_listed_space_names_the_measured_best(tmp_path: Path, store):
    spec = load_spec(make_spec(tmp_path, "unlisted", ratio=2.0, model=True))
    out = search(spec, FakeEngine(), store)
    tracking = Tracking.open(store["tracking"], "unlisted")
    guide = ModelGuide(engine=FakeEngine(), metric="output_tok_s", optimism=0.98)
    guide.learn_runs(
        tracking, [r.info.run_id for r in tracking.child_runs(out.parent_run_id, "live")]
    )
    assert guide.live_learned == out.counts["live_measured"]
    _, summary = summarize(
        guide,
        tracking=tracking,
        parent_run_id=out.parent_run_id,
        skipped=[],
        listed=None,
        best=out.best,
        adaptive=None,
    )
    (level,) = summary["per_concurrency"]
    assert level["measured_run_id"] == out.best["run_id"] and summary["adaptive"] is None


def test_a_study_with_the_model_predicts_each_trial_and_logs_its_error(tmp_path: Path, store):
    spec = load_spec(make_spec(tmp_path, "guided", ratio=2.0, model=True))
    engine = FakeEngine()
    out = search(spec, engine, store)
    assert out.target_reached
    tracking = Tracking.open(store["tracking"], "guided")
    live = [r for r in tracking.child_runs(out.parent_run_id) if r.data.tags["stage"] == "live"]
    # the baseline came first
    assert live and all("predicted_output_tok_s" in r.data.metrics for r in live)
    steps = [int(r.data.params["num_steps"]) for r in live]
    # what the model reads
    assert [_curve(tracking, r.info.run_id) for r in live] == [[0.6] * n for n in steps]
    study = optuna.load_study(storage=store["storage"], study_name=out.study)
    launched = [t for t in study.trials if "mlflow_run_id" in t.user_attrs]
    # the model chose, except every SAMPLER_EVERY-th live trial: the sampler's own
    by_model = [t.user_attrs.get("enqueued_by") == "model" for t in launched]
    assert launched and by_model == [(i + 1) % SAMPLER_EVERY != 0 for i in range(len(launched))]
    parent = tracking.get_run(out.parent_run_id)
    assert parent.data.metrics["model_predictions"] == len(live)
    errors = [
        abs(m["predicted_output_tok_s"] - m["output_tok_s"]) / m["output_tok_s"]
        for m in (r.data.metrics for r in live)
    ]
    assert parent.data.metrics["model_median_rel_error"] == pytest.approx(float(np.median(errors)))
    summary = json.loads(tracking.read_text(out.parent_run_id, "model.json"))
    assert summary["error"]["n"] == len(live)
    assert [level["concurrency"] for level in summary["per_concurrency"]] == [1]
    assert summary["per_concurrency"][0]["best_params"]["eagle_aux_hidden_state_layer_ids"] == [
        1,
        5,
        9,
    ]
    assert summary["adaptive"]["predicted_output_tok_s"] > 0


def test_an_accept_length_target_is_reached_though_stage_1_priors_are_pessimistic(
    tmp_path: Path, store
):
    """Accept length 4.0 needs num_steps >= 5 of the true wiring: the default prior alone predicts
    far less."""
    spec = load_spec(make_spec(tmp_path, "al", ratio=4.0, model=True, metric="accept_length"))
    out = search(spec, FakeEngine(), store)
    assert out.target_reached and out.best["value"] >= 4.0


def test_a_study_stops_when_no_untried_config_can_reach_the_target(tmp_path: Path, store):
    spec = load_spec(make_spec(tmp_path, "hopeless", ratio=10.0, budget=30, model=True))
    engine = FakeEngine()
    out = search(spec, engine, store)
    assert not out.target_reached
    assert out.stop_reason.startswith(
        "no untried config can reach the target: the model's 98% quantile of all"
    )
    assert out.stop_reason.endswith("search.model.enabled: false measures them anyway")
    distinct = {
        (tuple(s.eagle_aux_hidden_state_layer_ids or ()), s.num_steps)
        for s in engine.runs
        if not s.is_baseline
    }
    # 3 wirings x 6 depths: not all were launched
    assert len(distinct) == out.counts["live_measured"] < 18
    tracking = Tracking.open(store["tracking"], "hopeless")
    parent = tracking.get_run(out.parent_run_id)
    # distinct configs, not proposals
    assert parent.data.metrics["model_skipped"] <= out.counts["skipped"]
    study = optuna.load_study(storage=store["storage"], study_name=out.study)
    skipped = {t.user_attrs["fingerprint"] for t in study.trials if "skipped" in t.user_attrs}
    launched = {
        t.user_attrs["fingerprint"] for t in study.trials if "mlflow_run_id" in t.user_attrs
    }
    # (here the model chose every trial: nothing was proposed to skip)
    assert not skipped & launched


def test_forecasts_are_reused_until_the_model_learns_and_shared_by_configs_it_reads_alike():
    guide, engine = _taught()
    four = _effective(engine, num_steps=4)
    # another trial, the same config to the model
    more_prompts = _effective(engine, num_steps=4, num_prompts=16)
    assert (
        engine.plan(LiveSettings(num_steps=4)).fingerprint
        != engine.plan(LiveSettings(num_steps=4, num_prompts=16)).fingerprint
    )
    made = guide.forecasts
    first = guide.forecast(four, target=150.0)
    assert (
        guide.forecast(four, target=150.0) is first
        and guide.forecast(more_prompts, target=150.0) is first
    )
    untried = {"a": ({"num_steps": 4}, four), "b": ({"num_steps": 4, "p": 16}, more_prompts)}
    guide.live_learned = 1
    guide.choose(untried, target=150.0)  # the config it then runs: chosen and forecast alike, once
    assert guide.forecasts == made + 1
    # another target
    assert guide.forecast(four, target=120.0) is not first and guide.forecasts == made + 2
    guide.learned.add("seen")
    assert guide.learn_runs(None, ["seen", None]) == 0  # nothing new: every forecast stands
    assert guide.forecast(four, target=150.0) is first
    # the model learned
    guide.model.update(_effective(engine, num_steps=3), _truth(3, a=0.5), record=False)
    again = guide.forecast(four, target=150.0)
    assert again is not first and again.value < first.value and guide.forecasts == made + 3


def test_the_cold_prior_reads_the_deployment_from_the_spec(tmp_path: Path):
    from bisect_eagle.perf.prior import CPU_BANDWIDTH, GPU_BANDWIDTH
    from bisect_eagle.search.study.guide import cold_prior

    (tmp_path / "target").mkdir()
    (tmp_path / "draft").mkdir()
    (tmp_path / "target" / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 4096,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "intermediate_size": 14336,
                "vocab_size": 128256,
                "torch_dtype": "bfloat16",
            }
        )
    )
    (tmp_path / "draft" / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 4096,
                "num_hidden_layers": 1,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "intermediate_size": 14336,
                "vocab_size": 128256,
                "draft_vocab_size": 32000,
                "eagle_config": {},
            }
        )
    )
    on_node = load_spec(make_spec(tmp_path, "paths-on-the-node", model=True))
    unread = cold_prior(on_node).deployment
    # paths that exist only on the server's node
    assert (unread.target, unread.draft, unread.tp) == (None, None, 1)
    sglang = on_node.engine.model_copy(
        update={"sglang": on_node.engine.sglang.model_copy(update={"tp": 8})}
    )
    spec = on_node.model_copy(
        update={"target": tmp_path / "target", "draft": tmp_path / "draft", "engine": sglang}
    )
    deployment = cold_prior(spec).deployment
    assert deployment.tp == 8 and deployment.bandwidth == GPU_BANDWIDTH
    assert deployment.target.layers == 32 and deployment.draft.layers == 1
    assert deployment.draft.active_params < 0.1 * deployment.target.active_params
    local = spec.model_copy(update={"engine": spec.engine.model_copy(update={"kind": "local"})})
    # on cpu
    assert (cold_prior(local).deployment.bandwidth, cold_prior(local).deployment.tp) == (
        CPU_BANDWIDTH,
        1,
    )


class PlateauEngine(FakeEngine):
    """Every speculative config measures 93 % of the baseline: a shape that tops out below a target
    of 110 %, which the model's widest quantile still reaches (so it rules nothing out)."""

    def run(self, plan):
        result = super().run(plan)
        return (
            dataclasses.replace(result, output_tok_s=93.0)
            if result.ok and not plan.settings.is_baseline
            else result
        )


def test_a_model_stuck_below_the_target_hands_the_next_trials_to_the_sampler(tmp_path: Path, store):
    spec = load_spec(make_spec(tmp_path, "plateau", ratio=1.1, budget=12, model=True))
    events: list[str] = []
    out = search(spec, PlateauEngine(), store, progress=lambda p: events.append(p.message))
    stuck = [i for i, e in enumerate(events) if e.startswith("model stuck:")]
    assert stuck, events
    assert f"the sampler proposes the next {HANDOFF}" in events[stuck[0]]
    study = optuna.load_study(storage=store["storage"], study_name=out.study)
    launched = [t for t in study.trials if "mlflow_run_id" in t.user_attrs]
    by_model = [t.user_attrs.get("enqueued_by") == "model" for t in launched]
    # the model's picks before the hand-off: at least STUCK_AFTER in a row measured nothing better
    first_handoff = next(
        i
        for i in range(STUCK_AFTER, len(by_model) - HANDOFF + 1)
        if not any(by_model[i : i + HANDOFF]) and all(by_model[i - 2 : i])
    )
    assert sum(by_model[:first_handoff]) >= STUCK_AFTER
    values = [t.value for t in launched[:first_handoff]]
    assert max(values) < spec.criterion.ratio * 100.0  # stuck below the target


def test_an_unidentified_verify_cost_is_identified_before_the_model_rules_anything_out():
    guide, engine = _taught()
    guide.shapes = {(1, 4, 4)}  # every speculative trial so far: one step, a tree of 4 tokens
    guide.live_learned = 1
    four = _effective(engine, num_steps=3, topk=4, num_draft_tokens=4)
    eight = _effective(engine, num_steps=3, topk=4, num_draft_tokens=8)
    _, fc, _ = guide.choose(
        {"a": ({"n": 4}, four), "b": ({"n": 8}, eight)}, target=50 * BASELINE_TOK_S
    )
    # no variation in verified tokens: nothing ruled out
    assert guide.unidentified() and not guide.vetoes()
    sampled, _, _ = guide.choose(
        {"a": ({"n": 4}, four), "b": ({"n": 8}, eight)}, target=50 * BASELINE_TOK_S
    )
    assert sampled == {"n": 8} and guide.note.startswith(
        "identifying verify_token: every speculative trial so far verified 4 tokens"
    )


def _logged(tracking: Tracking, name: str, effective: dict, truth: dict) -> str:
    """A finished live run as a study logs it: its effective settings, metrics and acceptance
    curve."""
    run_id = tracking.start_run(name, tags={"effective": json.dumps(effective)})
    tracking.log(
        run_id,
        metrics={
            k: float(truth[k]) for k in ("output_tok_s", "accept_length", "completion_tokens")
        },
    )
    tracking.log_curve(run_id, "accept_rate_per_position", values=truth["accept_rate_per_position"])
    tracking.finish(run_id, "FINISHED")
    return run_id


def test_a_pinned_trial_teaches_the_cost_terms_alone(tmp_path: Path):
    """A trial with acceptance pinned adds a cost row (its shape identifies a cost term) but never
    moves the acceptance posterior, the error record or the count of live trials that earns the
    model its veto."""
    tracking = Tracking.open(f"sqlite:///{tmp_path}/mlflow.db", "pinned-cost")
    guide, engine = _taught()
    wiring = guide.model.config(_effective(engine, num_steps=3)).wiring
    posterior, rows, state = (
        guide.model.acceptance.mean(wiring, 3),
        guide.model.cost.n_obs,
        guide.model.state,
    )
    pinned = _effective(engine, num_steps=3, pinned_acceptance=[0.95, 0.95, 0.95])
    assert pinned["pinned_acceptance"] == [0.95, 0.95, 0.95]
    # a slow context
    drawn = {**_truth(3, a=0.95), "output_tok_s": _truth(3, a=0.95)["output_tok_s"] * 0.5}
    assert guide.learn_runs(tracking, [_logged(tracking, "pinned", pinned, drawn)]) == 1
    assert guide.model.cost.n_obs == rows + 1 and guide.model.state > state
    # the drawn 0.95s taught nothing
    assert np.allclose(guide.model.acceptance.mean(wiring, 3), posterior)
    assert (guide.cost_learned, guide.live_learned, guide.errors) == (1, 0, [])
    assert (3, 1, guide.model.config(pinned).num_draft_tokens) in guide.shapes
    natural = _effective(engine, num_steps=3)
    assert (
        guide.learn_runs(tracking, [_logged(tracking, "natural", natural, _truth(3, a=0.95))]) == 1
    )
    assert not np.allclose(guide.model.acceptance.mean(wiring, 3), posterior)  # a natural one does
    assert (guide.cost_learned, guide.live_learned) == (1, 1)
