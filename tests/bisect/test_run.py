"""run_bisect with engines that need no model: plan-based changes, one measurement per plan,
sequential probes on a seeded noisy engine, and no secret in anything bisect writes."""

from __future__ import annotations

import collections
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_engine import FakeEngine

from bisect_eagle.bisect.ddmin import BisectStatus
from bisect_eagle.bisect.run import BisectOptions, run_bisect
from bisect_eagle.engines.base import Engine, TrialResult
from bisect_eagle.engines.plan import TrialPlan, make_plan
from bisect_eagle.engines.sglang.rules import speculative_effective
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.redact import is_hidden
from bisect_eagle.tracking.runs import Tracking

HARMLESS = {
    "max_new_tokens": 32,
    "server_args.cuda_graph_max_bs": 8,
    "server_args.disable_custom_all_reduce": True,
    "env.NCCL_ALGO": "Tree",
    "env.NCCL_PROTO": "Simple",
}


class NoisyEngine(Engine):
    """Like a server engine, it runs env and server_args; ``value(effective)`` × (1 + noise × N(0,
    1)), seeded.

    ``topk > 1`` without a draft-token count plans the engine's default of 8.
    """

    name = "noisy"

    def __init__(
        self, value: Callable[[dict[str, Any]], float], *, noise: float = 0.0, seed: int = 0
    ):
        self.value, self.noise, self.rng = value, noise, random.Random(seed)
        self.runs: collections.Counter[str] = collections.Counter()

    def plan(self, settings: LiveSettings) -> TrialPlan:
        if settings.topk > 1 and settings.num_draft_tokens is None:
            settings = settings.model_copy(update={"num_draft_tokens": 8})
        effective, warnings, refusal = speculative_effective(settings)
        if effective["eagle_aux_hidden_state_layer_ids"] is None:
            effective["eagle_aux_hidden_state_layer_ids"] = [1, 5, 9]
        return make_plan(
            self.name, settings, effective=effective, warnings=warnings, refusal=refusal
        )

    def run(self, plan: TrialPlan) -> TrialResult:
        self.runs[plan.fingerprint] += 1
        v = self.value(plan.effective) * (1 + self.noise * self.rng.gauss(0, 1))
        return TrialResult(
            engine=self.name,
            status="ok",
            requested=plan.requested,
            effective=plan.effective,
            output_tok_s=v,
            accept_length=v / 30,
        )


def write_spec(path: Path, **settings: Any) -> Path:
    """A spec named after its test's directory: each test its own MLflow experiment (no cache across
    tests)."""
    path.write_text(
        yaml.safe_dump(
            {
                "name": f"{path.parent.name}-{path.stem}",
                "scenario": "tiny",
                "engine": {"kind": "local", "settings": {"num_prompts": 2, **settings}},
                "criterion": {"metric": "output_tok_s"},
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One MLflow store for the module (creating one takes seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"


def bisect(tmp: Path, store: str, engine: Engine, good: dict, bad: dict, **opts: Any):
    seen: list[str] = []
    good_spec, bad_spec = write_spec(tmp / "good.yaml", **good), write_spec(tmp / "bad.yaml", **bad)
    options = BisectOptions(
        good=str(good_spec),
        bad=str(bad_spec),
        metric="output_tok_s",
        tracking_uri=store,
        log_path=tmp / "b.log",
        **opts,
    )
    report = run_bisect(options, engine_factory=lambda spec: engine, progress=seen.append)
    return report, report.to_json(), seen


def test_settings_the_engine_ignores_leave_nothing_to_bisect(tmp_path, store):
    """The local-like fake engine ignores env and concurrency; explicit defaults and the draft's ids
    are no change."""
    bad = {
        "env.NCCL_ALGO": "Ring",
        "concurrency": 4,
        "num_steps": 3,
        "eagle_aux_hidden_state_layer_ids": [1, 5, 9],
        "env.HF_TOKEN": "hf_only_in_bad_42",
    }
    with pytest.raises(BadInput, match="plan the same trial on the fake engine") as err:
        bisect(tmp_path, store, FakeEngine(), {}, bad)
    message = str(err.value)
    assert "nothing to bisect" in message and "hf_only_in_bad_42" not in message
    for name in (
        "env.NCCL_ALGO",
        "concurrency",
        "eagle_aux_hidden_state_layer_ids",
        "env.HF_TOKEN",
    ):
        assert name in message


def test_the_changes_and_the_not_changes_are_said_before_the_first_probe(tmp_path, store):
    bad = {"num_steps": 1, "env.NCCL_ALGO": "Ring", "eagle_aux_hidden_state_layer_ids": [1, 5, 9]}
    _, out, seen = bisect(tmp_path, store, FakeEngine(), {}, bad)
    assert out["breaking_sets"] == [["num_steps"]]
    first_probe = next(
        i for i, line in enumerate(seen) if "measuring" in line or line.startswith("probe ")
    )
    assert seen[:first_probe] == [
        "1 change to bisect (good -> bad, as the engine runs them):",
        "  num_steps: 3 -> 1",
        "2 requested differences not bisected:",
        "  eagle_aux_hidden_state_layer_ids: not a change, the engine runs it as [1, 5, 9] at both "
        "ends",
        "  env.NCCL_ALGO: not a change, the fake engine does not use it",
        "expect about 8 launches (budget 48: --max-launches); each verdict at level 0.001 = 0.05 / "
        "48 looks, so the chance of any false culprit in this bisect is at most 0.05",
    ]


def test_configurations_that_plan_alike_are_measured_once(tmp_path, store):
    """num_draft_tokens applied alone runs as num_steps + 1 (topk 1): the good plan, answered from
    memory."""
    engine = NoisyEngine(lambda eff: 60.0 if eff["topk"] > 1 else 100.0)
    report, out, _ = bisect(tmp_path, store, engine, {}, {"topk": 2, "num_draft_tokens": 4})
    assert [c["name"] for c in out["changes"]] == ["topk", "num_draft_tokens"]
    assert out["breaking_sets"] == [["topk"]] and out["repair_set"] == ["topk"]
    good = out["probes"][0]
    alone, again = [p for p in out["probes"] if p["applied"] == ["num_draft_tokens"]]
    assert alone["source"] == "memory" and alone["fingerprint"] == good["fingerprint"]
    assert alone["outcome"] == "GOOD" and alone["samples"] == good["samples"]
    # the repair set reverted: asked again
    assert again["verifies"] == "repair" and again["source"] == "memory"
    # topk 1 overrides it in the good configuration
    assert out["changes"][1]["masked_by"] == {"good": ["topk"]}
    # no second trial of the good plan
    assert engine.runs[good["fingerprint"]] == len(good["samples"]) == 3
    measured = [p["fingerprint"] for p in out["probes"] if p["source"] == "measured"]
    # each set's side: one plan more each
    pinned = [s["pinned"]["run_id"] for s in out["sets"] if s["pinned"]]
    assert (
        len(measured) == len(set(measured)) == out["live_trials"] - len(pinned) and len(pinned) == 1
    )
    # every engine run is one launch
    assert sum(engine.runs.values()) == out["samples"] == out["launches"]
    assert out["launch_unit"] == "runs"  # a local spec: the in-process engine's runs
    tracking, _ = Tracking.of_run(store, out["parent_run_id"])
    assert tracking.get_run(out["parent_run_id"]).data.metrics["launches"] == sum(
        engine.runs.values()
    )
    live = [r for r in tracking.child_runs(out["parent_run_id"]) if r.data.tags["stage"] == "live"]
    side = [r for r in live if r.data.tags.get("role") == "bisect-side-probe"]
    assert [r.data.tags["acceptance"] for r in side] == ["pinned"] and [
        r.info.run_id for r in side
    ] == pinned
    assert collections.Counter(
        r.data.tags["fingerprint"] for r in live if r not in side
    ) == collections.Counter(measured)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_good_configuration_4_percent_above_the_limit_resolves_and_the_culprit_is_exact(
    tmp_path, store, seed
):
    """2 % noise; the good configuration and every harmless probe sit 4 % above the threshold."""
    threshold = 100.0 / 1.04
    engine = NoisyEngine(
        lambda eff: 70.0 if eff["num_steps"] == 1 else 100.0, noise=0.02, seed=seed
    )
    report, out, seen = bisect(
        tmp_path, store, engine, {}, {"num_steps": 1, **HARMLESS}, threshold=threshold
    )
    assert out["status"] == "isolated", out["notes"]
    assert out["breaking_sets"] == [["num_steps"]] and out["repair_set"] == ["num_steps"]
    assert out["unresolved"] == []
    assert out["probes"][0]["outcome"] == "GOOD"
    # some probes took more samples
    assert sum(engine.runs.values()) == out["samples"] > out["live_trials"]
    for p in out["probes"]:
        assert len(p["samples"]) <= 2 * report.judge["max_samples"]
        if p["source"] == "measured":
            # every sample of a plan on its one trial
            assert engine.runs[p["fingerprint"]] == len(p["samples"])
    assert out["judge"]["noise"]["dof"] > 0 and 0.005 < out["judge"]["noise"]["sd_log"] < 0.05
    assert any("settings left" in m for m in seen)


@pytest.mark.parametrize("seed", [0, 1])
def test_interacting_culprits_give_a_breaking_set_of_two_and_a_repair_set_of_one(
    tmp_path, store, seed, capsys
):
    """Only NCCL_ALGO=Tree with NCCL_PROTO=Simple is slow: both break the good one; reverting either
    repairs."""

    def value(eff: dict) -> float:
        return (
            80.0
            if eff["env"].get("NCCL_ALGO") == "Tree" and eff["env"].get("NCCL_PROTO") == "Simple"
            else 100.0
        )

    engine = NoisyEngine(value, noise=0.02, seed=seed)
    report, out, _ = bisect(tmp_path, store, engine, {}, {"num_steps": 2, **HARMLESS}, ratio=0.9)
    assert out["status"] == "isolated", out["notes"]
    assert out["breaking_sets"] == [["env.NCCL_ALGO", "env.NCCL_PROTO"]]
    assert out["repair_set"] in (["env.NCCL_ALGO"], ["env.NCCL_PROTO"])
    from bisect_eagle.cli.bisect import _print

    _print(report)
    printed = capsys.readouterr().out
    assert (
        "breaks the good configuration when applied to it: env.NCCL_ALGO + env.NCCL_PROTO"
        in printed
    )
    assert f"repairs the bad configuration when reverted from it: {out['repair_set'][0]}" in printed


def test_no_secret_reaches_the_log_the_result_the_report_or_the_runs(tmp_path, store):
    secret, typed = "hf_PLANTED_secret_123", "x7q-typed-secret"
    engine = NoisyEngine(lambda eff: 70.0 if eff["num_steps"] == 1 else 100.0)
    report, out, seen = bisect(
        tmp_path,
        store,
        engine,
        {},
        {"num_steps": 1, "env.HF_TOKEN": secret},
        overrides={"env.MY_TOKEN": typed},
    )
    assert report.status is BisectStatus.ISOLATED and out["culprits"][0]["name"] == "num_steps"
    # a server engine runs it: a change
    hf = next(c for c in out["changes"] if c["name"] == "env.HF_TOKEN")
    assert is_hidden(hf["bad"])
    tracking, parent = Tracking.of_run(store, out["parent_run_id"])
    texts = [
        (tmp_path / "b.log").read_text(),
        json.dumps(out),
        "\n".join(seen),
        tracking.read_text(out["parent_run_id"], "bisect.log"),
        tracking.read_text(out["parent_run_id"], "result.json"),
    ]
    for run in [parent, *tracking.child_runs(out["parent_run_id"])]:
        texts.append(
            json.dumps(
                {"params": run.data.params, "tags": run.data.tags, "metrics": run.data.metrics}
            )
        )
        if run.data.tags.get("stage") == "live":
            texts.append(tracking.read_text(run.info.run_id, "trial.json"))
    for text in texts:
        assert secret not in text and typed not in text
    assert "env.MY_TOKEN" in texts[0]  # the name is kept, its value redacted


def test_replay_asks_again_for_a_secret_the_log_hides(tmp_path, store):
    engine = NoisyEngine(lambda eff: 70.0 if eff["num_steps"] == 1 else 100.0)
    bisect(
        tmp_path,
        store,
        engine,
        {},
        {"num_steps": 1},
        overrides={"env.MY_TOKEN": "x7q-typed-secret"},
    )
    with pytest.raises(BadInput, match="hides the value of env.MY_TOKEN; give it again with --set"):
        run_bisect(
            BisectOptions(replay=tmp_path / "b.log", tracking_uri=store),
            engine_factory=lambda spec: engine,
        )
    again = run_bisect(
        BisectOptions(
            replay=tmp_path / "b.log",
            overrides={"env.MY_TOKEN": "x7q-typed-secret"},
            tracking_uri=store,
            log_path=tmp_path / "r.log",
        ),
        engine_factory=lambda spec: engine,
    ).to_json()
    assert again["breaking_sets"] == [["num_steps"]] and again["live_trials"] == 0
    assert all(p["source"] == "replay" for p in again["probes"])


def reverted_value(engine: NoisyEngine, good: dict, bad: dict, names: list[str]) -> float:
    """The noise-free value of the bad configuration with ``names`` set back to the good one's
    values."""
    from bisect_eagle.spec.schema import settings_from

    values = {
        **{k: v for k, v in bad.items() if k not in names},
        **{n: good[n] for n in names if n in good},
    }
    return engine.value(engine.plan(settings_from({"num_prompts": 2, **values}, "test")).effective)


@pytest.mark.parametrize("seed", [0, 1])
def test_topk_1_hides_a_wrong_draft_token_count_in_the_bad_configuration(
    tmp_path, store, seed, capsys
):
    """Bad: topk 1 (slow) and 2 draft tokens (slow with a tree), hidden by topk 1. Reverting topk
    alone leaves topk 2 with 2 draft tokens: still slow. The repair set is both, verified GOOD; each
    breaking set BAD."""

    def value(eff: dict) -> float:
        return 75.0 if eff["topk"] == 1 else 100.0 if eff["num_draft_tokens"] >= 4 else 70.0

    engine = NoisyEngine(value, noise=0.02, seed=seed)
    good, bad = {"topk": 2, "num_draft_tokens": 8}, {"topk": 1, "num_draft_tokens": 2, **HARMLESS}
    report, out, seen = bisect(tmp_path, store, engine, good, bad, ratio=0.9)
    assert out["status"] == "isolated" and out["verified"], out["notes"]
    ndt = next(c for c in out["changes"] if c["name"] == "num_draft_tokens")
    assert ndt["masked_by"] == {"bad": ["topk"]} and (ndt["good"], ndt["bad"]) == (8, 2)
    assert sorted(out["breaking_sets"]) == [["num_draft_tokens"], ["topk"]]
    assert sorted(out["repair_set"]) == ["num_draft_tokens", "topk"]
    assert (
        reverted_value(engine, good, bad, ["topk"])
        < 90
        <= reverted_value(engine, good, bad, out["repair_set"])
    )
    checks = {(v["check"], tuple(v["changes"])): v for v in out["verification"]}
    assert {k: (v["expected"], v["outcome"]) for k, v in checks.items()} == {
        ("breaking", ("topk",)): ("BAD", "BAD"),
        ("breaking", ("num_draft_tokens",)): ("BAD", "BAD"),
        ("repair", tuple(out["repair_set"])): ("GOOD", "GOOD"),
    }
    # each verification is a probe of its own, of the configuration it names
    for v in out["verification"]:
        probe = out["probes"][v["probe"] - 1]
        assert (
            probe["verifies"] == v["check"]
            and probe["applied"] == v["applied"]
            and probe["outcome"] == v["outcome"]
        )
    repair = checks[("repair", tuple(out["repair_set"]))]
    assert set(repair["applied"]) == set(HARMLESS)  # the bad configuration with both reverted
    assert {v["check"] for v in ndt["verification"]} == {"breaking", "repair"}
    assert out["interactions"][0].startswith(
        "topk=1 hides num_draft_tokens in the bad configuration: revert both"
    )
    from bisect_eagle.cli.bisect import _print

    _print(report)
    printed = " ".join(capsys.readouterr().out.split())
    assert (
        "interaction: topk=1 hides num_draft_tokens in the bad configuration: revert both"
        in printed
    )
    assert f"(verified: probe {repair['probe']} measured GOOD" in printed
    tracking, parent = Tracking.of_run(store, out["parent_run_id"])
    assert (
        parent.data.tags["verified"] == "true"
        and "num_draft_tokens<bad:topk" in parent.data.tags["masked"]
    )
    values = {k: v for k, v in parent.data.params.items() if k.startswith("change.")}
    assert values == {
        f"change.{c['name']}.{side}": json.dumps(c[side])
        for c in out["changes"]
        # each change's good and bad value, as the report has them
        for side in ("good", "bad")
    }
    assert (values["change.topk.good"], values["change.topk.bad"]) == ("2", "1")
    assert (
        values["change.env.NCCL_ALGO.good"] == "null"
        and values["change.env.NCCL_ALGO.bad"] == '"Tree"'
    )
    assert "**Verification** (every answer held)" in parent.data.tags["mlflow.note.content"]
    assert (
        json.loads(tracking.read_text(out["parent_run_id"], "result.json"))["verification"]
        == out["verification"]
    )


def test_a_not_change_that_matters_after_the_repair_is_followed(tmp_path, store):
    """Bad: the baseline (no speculation), topk 2 and 16 draft tokens. The draft-token count is
    inert alone from both ends (topk 1 in the good configuration, no speculation in the bad one), so
    it is no change; but reverting the algorithm alone runs topk 2 with 16 draft tokens, which is
    slow. Verification measures that, the count becomes a change, and the repair set that is
    reported repairs the bad configuration."""

    def value(eff: dict) -> float:
        if eff["speculative_algorithm"] == "none":
            return 50.0
        return 60.0 if eff["topk"] > 1 and eff["num_draft_tokens"] >= 16 else 100.0

    engine = NoisyEngine(value, noise=0.02, seed=3)
    good, bad = (
        {},
        {"speculative_algorithm": "none", "topk": 2, "num_draft_tokens": 16, "max_new_tokens": 32},
    )
    report, out, seen = bisect(tmp_path, store, engine, good, bad, ratio=0.9)
    assert out["status"] == "isolated" and out["verified"], out["notes"]
    assert out["promoted"] == ["num_draft_tokens"] and "num_draft_tokens" not in out["not_changes"]
    assert any("bisect continues with num_draft_tokens as a change" in n for n in out["notes"])
    first = next(p for p in out["probes"] if p["verifies"] == "repair")
    # the answer it would have given
    assert first["outcome"] == "BAD" and "num_draft_tokens" in first["applied"]
    assert "speculative_algorithm" in out["repair_set"] and len(out["repair_set"]) == 2
    assert reverted_value(engine, good, bad, ["speculative_algorithm"]) < 90
    assert reverted_value(engine, good, bad, out["repair_set"]) >= 90
    ndt = next(c for c in out["changes"] if c["name"] == "num_draft_tokens")
    assert ndt["masked_by"] == {"good": ["topk"], "bad": ["speculative_algorithm"]}
    assert (
        "num_draft_tokens breaks the good configuration only together with topk (topk=1 hides it "
        "there)" in out["interactions"]
    )
    assert out["probes_used"] <= out["probe_bound"]
    log = (tmp_path / "b.log").read_text()
    assert (
        '# inert: ["num_draft_tokens"]' in log and "bad topk,max_new_tokens,num_draft_tokens" in log
    )


class GreedyEngine(NoisyEngine):
    """The noisy engine without noise, declaring its accept length deterministic (as greedy decoding
    makes it)."""

    deterministic_metrics = ("accept_length",)


def test_a_deterministic_metric_takes_one_sample_per_endpoint_and_per_probe(tmp_path, store):
    # accept length 2.33 vs 3.33
    engine = GreedyEngine(lambda eff: 70.0 if eff["num_steps"] == 1 else 100.0)
    seen: list[str] = []
    good, bad = (
        write_spec(tmp_path / "good.yaml"),
        write_spec(tmp_path / "bad.yaml", num_steps=1, **HARMLESS),
    )
    options = BisectOptions(
        good=str(good),
        bad=str(bad),
        metric="accept_length",
        tracking_uri=store,
        log_path=tmp_path / "b.log",
    )
    out = run_bisect(options, engine_factory=lambda spec: engine, progress=seen.append).to_json()
    assert out["status"] == "isolated" and out["breaking_sets"] == [["num_steps"]], out["notes"]
    assert (
        out["judge"]["repeats"]
        == out["judge"]["max_samples"]
        == out["judge"]["endpoint_samples"]
        == 1
    )
    assert set(engine.runs.values()) == {1} and out["samples"] == out["live_trials"] == sum(
        engine.runs.values()
    )
    assert all(len(p["samples"]) == 1 for p in out["probes"] if p["source"] == "measured")
    note = (
        "accept_length is deterministic on the noisy engine (greedy decoding): one sample per "
        "endpoint and per probe, no noise estimate"
    )
    assert note in seen and note in out["notes"]
    assert out["judge"]["noise"]["dof"] == 0


def test_set_adaptive_in_the_flag_spelling_replaces_the_field_at_both_ends(tmp_path, store):
    """Both ends load with speculative_adaptive (the field); --set
    server_args.speculative_adaptive=false replaces it in every probe (one setting, two spellings),
    so the bisect runs instead of refusing the pair."""
    engine = NoisyEngine(lambda e: 100.0 if e["num_steps"] > 1 else 50.0)
    ends = {"server_args.speculative_adaptive": True}
    _, out, _ = bisect(
        tmp_path,
        store,
        engine,
        {**ends},
        {**ends, "num_steps": 1},
        overrides={"server_args.speculative_adaptive": False},
    )
    assert out["breaking_sets"] == [["num_steps"]]
