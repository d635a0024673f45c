"""ThroughputModel: predictions from a planted synthetic engine, learning as trials arrive,
concurrency."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from synthetic_engine import effective, fitted_model, synthetic_trial

from bisect_eagle.artifacts import scenarios
from bisect_eagle.engines import benchmark_of
from bisect_eagle.engines.base import RequestRecord, TrialResult
from bisect_eagle.engines.local import LocalEngine
from bisect_eagle.engines.oracle import Description, Option
from bisect_eagle.engines.sglang import SglangEngine
from bisect_eagle.engines.sglang.oracle import SglangVerdict
from bisect_eagle.engines.sglang.planner import Planner
from bisect_eagle.engines.sglang.rules import speculative_effective
from bisect_eagle.perf.benchmark import STEADY_STATE, Benchmark
from bisect_eagle.perf.model import Config, ThroughputModel, metrics_from_result
from bisect_eagle.spec.schema import SglangServer
from bisect_eagle.spec.settings import LiveSettings, parse_settings


def test_config_reads_the_plans_effective_settings():
    """num_draft_tokens is the plan's (the engine applied SGLang's topk == 1 rule), never filled in
    again."""
    planned, _, _ = speculative_effective(
        LiveSettings(num_steps=4, num_draft_tokens=16, concurrency=8, env={"NCCL_ALGO": "Tree"})
    )
    cfg = Config.from_effective(planned)
    assert (cfg.num_steps, cfg.topk, cfg.num_draft_tokens, cfg.batch) == (4, 1, 5, 8)
    assert cfg.context == ("env:NCCL_ALGO=Tree",)
    assert Config.from_effective(effective(steps=0)).speculative is False
    assert Config.from_effective(effective(steps=4), concurrency=2).batch == 2
    assert (
        Config.from_effective(
            {**effective(steps=4), "topk": 4, "num_draft_tokens": 8}
        ).num_draft_tokens
        == 8
    )
    for missing in (None, 0):
        with pytest.raises(ValueError, match="num_draft_tokens"):
            Config.from_effective({**effective(steps=4), "num_draft_tokens": missing})


def test_predicts_a_planted_engine_before_measuring_it():
    model = fitted_model()
    for ids, steps in (((1, 5, 9), 3), ((1, 5, 9), 8), ((5, 9, 11), 5)):
        want = synthetic_trial(ids, steps)
        pred = model.predict(effective(ids, steps))
        assert pred.tok_s == pytest.approx(want["output_tok_s"], rel=0.05)
        assert pred.accept_length == pytest.approx(want["accept_length"], rel=0.05)
        assert pred.low <= pred.tok_s <= pred.high
    assert model.predict(effective(steps=0)).tok_s == pytest.approx(
        synthetic_trial(steps=0)["output_tok_s"], rel=0.01
    )


def test_update_records_prediction_before_measurement():
    model = ThroughputModel()
    # nothing to predict with yet
    assert model.update(effective(steps=0), synthetic_trial(steps=0)) is None
    before = model.update(effective(steps=2), synthetic_trial(steps=2))
    assert before is not None
    rng = np.random.default_rng(0)
    for s in (1, 3, 4, 5, 6, 7, 8):
        model.update(effective(steps=s), synthetic_trial(steps=s, noise=0.02, rng=rng))
    report = model.error_report()
    assert report.n == 8
    assert report.records[0].predicted is before
    assert report.median_rel_error < 0.1
    assert math.isfinite(report.accept_length_median_rel_error)
    assert set(report.to_json()) >= {"n", "median_rel_error", "coverage"}


def test_uncertainty_shrinks_with_data():
    cfg = effective((1, 5, 9), 5)
    early = ThroughputModel()
    early.set_standalone([1, 5, 9], [0.85, 0.85, 0.8, 0.7, 0.65, 0.6])
    early.update(effective(steps=0), synthetic_trial(steps=0))
    late = fitted_model(configs=((1, 5, 9),), steps=(1, 2, 3, 4, 6, 7, 8))
    width = lambda m: (m.predict(cfg).high - m.predict(cfg).low) / m.predict(cfg).tok_s  # noqa: E731
    assert width(late) < 0.5 * width(early)


def test_concurrency_lowers_the_predicted_speedup():
    model = fitted_model()
    speedups = [model.predict(effective(steps=4), concurrency=b).speedup for b in (1, 4, 16, 64)]
    assert speedups[0] > 1.5
    assert all(a > b for a, b in zip(speedups, speedups[1:], strict=False))
    assert model.predict(effective(steps=4, concurrency=16)).concurrency == 16


def test_learnt_environment_factor():
    model = fitted_model()
    env = {"NCCL_ALGO": "Ring"}
    for s in (0, 1, 3, 5):
        model.update(effective(steps=s, env=env), synthetic_trial(steps=s, env_factor=1.25))
    slow, fast = (
        model.predict(effective(steps=4, env=env)).tok_s,
        model.predict(effective(steps=4)).tok_s,
    )
    assert fast / slow == pytest.approx(
        synthetic_trial(steps=4)["output_tok_s"]
        / synthetic_trial(steps=4, env_factor=1.25)["output_tok_s"],
        rel=0.05,
    )
    assert model.predict(effective(steps=4, env={"NCCL_OTHER": "1"})).tok_s == pytest.approx(
        fast, rel=1e-6
    )


def test_tree_prediction_and_rank_decay_update():
    model = fitted_model()
    tree = effective(steps=4, topk=4, num_draft_tokens=12)
    before = model.predict(tree)
    assert before.accept_length > model.predict(effective(steps=4)).accept_length * 0.99
    model.update(tree, {"output_tok_s": before.tok_s, "accept_length": before.accept_length * 0.9})
    assert model.rank_decay != 0.6
    assert model.predict(tree).accept_length < before.accept_length


def test_finite_horizon_local_engine_and_trial_result():
    model = ThroughputModel(benchmark=LocalEngine.benchmark)
    model.set_standalone([1, 5, 9], [0.9, 0.9, 0.8])
    reqs = [
        RequestRecord(
            id=str(i), prompt_tokens=64, completion_tokens=48, verify_steps=48, latency_s=0.5
        )
        for i in range(4)
    ]
    base = TrialResult(
        engine="local",
        status="ok",
        requested={},
        effective={},
        output_tok_s=96.0,
        accept_length=1.0,
        requests=reqs,
    )
    model.update(effective(steps=0, max_new_tokens=48), base)
    m = metrics_from_result(base)
    assert (m["verify_steps"], m["completion_tokens"], m["num_requests"]) == (192, 192, 4)
    assert model.predict(effective(steps=0, max_new_tokens=48)).tok_s == pytest.approx(
        96.0, rel=0.02
    )
    pred = model.predict(effective(steps=3, max_new_tokens=48))
    assert 1 < pred.accept_length < 4 and pred.tok_s > 0


def test_each_engine_says_which_model_fits_it():
    """The local engine times whole finite generations with truncated drafts; a server is steady
    state."""
    assert LocalEngine.benchmark == Benchmark(finite_horizon=True, truncate_drafts=True)
    assert SglangEngine.benchmark == STEADY_STATE == ThroughputModel().benchmark
    assert benchmark_of("local") == benchmark_of(LocalEngine) == LocalEngine.benchmark
    assert benchmark_of("a-test-engine") == STEADY_STATE
    local, server = ThroughputModel(benchmark=LocalEngine.benchmark), ThroughputModel()
    assert local.config(effective(steps=3, max_new_tokens=48)).tokens == 48
    assert server.config(effective(steps=3, max_new_tokens=48)).tokens is None


def test_adaptive_settings_dispatch():
    model = fitted_model()
    pred = model.predict({**effective(steps=3), "speculative_adaptive": True})
    assert set(pred.details["occupancy"]) == {"1", "3", "5", "7"}


def test_chain_trial_without_rates_updates_acceptance_from_accept_length():
    model = fitted_model(configs=())
    before = model.predict(effective(steps=5)).accept_length
    want = synthetic_trial(steps=5)
    model.update(
        effective(steps=5),
        {
            "output_tok_s": want["output_tok_s"],
            "accept_length": want["accept_length"],
            "verify_steps": 1000,
        },
    )
    after = model.predict(effective(steps=5)).accept_length
    assert abs(after - want["accept_length"]) < 0.5 * abs(before - want["accept_length"])


def _resolving_planner(tmp_path: Path) -> Planner:
    """The sglang planner with an oracle that answers as SGLang's parser and resolution do for an
    argv: the attention backend asked for (fa3 when none is), custom all-reduce on, the speculative
    values as given."""
    tiny = scenarios.get("tiny")
    planner = Planner(
        SglangServer(launch_command=["python", "-m", "sglang.launch_server"]),
        tiny.target,
        tiny.draft,
        check=False,
    )
    parser = Description(
        prog="sglang",
        version="0.5.23",
        options=[
            Option(("--attention-backend",), "attention_backend", None, None, True, False),
            Option(
                ("--disable-custom-all-reduce",),
                "disable_custom_all_reduce",
                False,
                None,
                False,
                False,
            ),
        ],
    )

    def judge(argv, *, resolve):
        given = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
        resolved = {
            "attention_backend": given.get("--attention-backend", "fa3"),
            "disable_custom_all_reduce": "--disable-custom-all-reduce" in argv,
        }
        for flag in (
            "--speculative-num-steps",
            "--speculative-eagle-topk",
            "--speculative-num-draft-tokens",
        ):
            if flag in given:
                resolved[flag[2:].replace("-", "_")] = int(given[flag])
        return SglangVerdict(ok=True, stage="", error=None, resolved=resolved)

    planner.oracle = lambda: SimpleNamespace(
        available=True, judge=judge, describe=lambda: parser, failure=None
    )
    return planner


def test_a_planned_sglang_trial_whose_attention_backend_sglang_resolved_changes_the_prediction(
    tmp_path,
):
    """SGLang's resolution moves the backend out of ``server_args`` into ``effective["server"]``:
    the model reads it there, so triton and fa3 are two contexts and what a trial taught about one
    is not predicted for the other."""
    planner = _resolving_planner(tmp_path)

    def planned(**settings) -> dict:
        return planner.plan(
            parse_settings(settings, "test"), port=30000, draft_dir=Path("/tmp/trial/draft")
        ).effective

    base = planned(speculative_algorithm="none", server_args={"attention_backend": "fa3"})
    fa3 = planned(num_steps=3, server_args={"attention_backend": "fa3"})
    triton = planned(num_steps=3, server_args={"attention_backend": "triton"})
    assert (
        "attention_backend" not in fa3["server_args"]
        and "attention_backend" not in triton["server_args"]
    )
    assert (fa3["server"]["attention_backend"], triton["server"]["attention_backend"]) == (
        "fa3",
        "triton",
    )
    model = ThroughputModel()
    model.update(base, synthetic_trial(steps=0))
    model.update(fa3, synthetic_trial(steps=3))
    # triton's verify forwards 1.5x slower
    model.update(triton, synthetic_trial(steps=3, env_factor=1.5))
    measured = (
        synthetic_trial(steps=3)["output_tok_s"]
        / synthetic_trial(steps=3, env_factor=1.5)["output_tok_s"]
    )
    predicted = model.predict(fa3).tok_s / model.predict(triton).tok_s
    # most of the measured gap, where one context would predict none
    assert predicted > 1 + (measured - 1) / 2
    assert Config.from_effective(fa3).context != Config.from_effective(triton).context
    assert "server_args:attention_backend=triton" in Config.from_effective(triton).context
    assert "server_args:disable_custom_all_reduce=False" in Config.from_effective(triton).context


def test_a_resolved_server_setting_and_the_same_requested_argument_are_one_factor():
    """Planned with resolution (``server``) or without (``server_args`` only), a setting has one
    key; the resolved value is the one the server runs."""
    requested = effective(steps=3, server_args={"attention_backend": "triton"})
    resolved = effective(
        steps=3, server_args={}, server={"attention_backend": "triton", "page_size": 64}
    )
    overridden = effective(
        steps=3, server_args={"attention_backend": "fa3"}, server={"attention_backend": "triton"}
    )
    keys = Config.from_effective(requested).context
    assert keys == ("server_args:attention_backend=triton",)
    assert Config.from_effective(overridden).context == keys
    assert Config.from_effective(resolved).context == (*keys, "server_args:page_size=64")


def test_shared_parts_of_predictions_give_the_numbers_of_a_prediction_made_alone():
    """Within a model state the acceptance part and the target alone are computed once per shape and
    context; each prediction is still exactly the one a model that predicted nothing else would
    make."""
    configs = [
        effective((1, 5, 9), 3),
        {**effective((1, 5, 9), 3), "env": {"NCCL_ALGO": "Ring"}},
        {**effective((5, 9, 11), 5), "concurrency": 4},
        {**effective((1, 5, 9), 2), "topk": 4, "num_draft_tokens": 8},
        effective(steps=0),
    ]
    shared = fitted_model()
    together = [shared.predict(e) for e in configs] + [shared.predict(configs[0])]
    alone = [fitted_model().predict(e) for e in [*configs, configs[0]]]
    for a, b in zip(together, alone, strict=True):
        assert (a.tok_s, a.low, a.high, a.baseline_tok_s, a.accept_length) == (
            b.tok_s,
            b.low,
            b.high,
            b.baseline_tok_s,
            b.accept_length,
        )


def test_every_learning_call_advances_the_models_state():
    model = ThroughputModel()
    states = [model.state]
    model.update(effective(steps=0), synthetic_trial(steps=0))
    states.append(model.state)
    model.set_standalone([1, 5, 9], [0.8, 0.7])
    states.append(model.state)
    model.add_timing("verify", 0.01)
    states.append(model.state)
    assert states == sorted(set(states))
    before = model.predict(effective(steps=2)).tok_s
    model.update(effective(steps=2), synthetic_trial(steps=2, env_factor=2.0))
    assert model.predict(effective(steps=2)).tok_s != before  # nothing kept from the state before
