"""Which side of the throughput each breaking set acts on: the rule, the good configuration's
profile, and a bisect whose two breaking sets lie one on each side."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from bisect_eagle.bisect.ddmin import ProbeOutcome
from bisect_eagle.bisect.measurement import Measurement
from bisect_eagle.bisect.run import BisectOptions, run_bisect
from bisect_eagle.bisect.sides import classify, good_profile
from bisect_eagle.engines.base import Engine, TrialResult
from bisect_eagle.engines.plan import TrialPlan, make_plan
from bisect_eagle.engines.sglang.rules import speculative_effective
from bisect_eagle.spec.settings import LiveSettings, unconditional_rates
from bisect_eagle.tracking.runs import Tracking

TRUE_IDS = [1, 5, 9]
CURVE = [0.9, 0.9, 0.8]  # the trained wiring's conditional acceptance per position
GOOD_AL = 1 + sum(unconditional_rates(CURVE))  # 1 + 0.9 + 0.81 + 0.648


class SplitEngine(Engine):
    """tok/s = accept length × cycles per second. The accept length follows the wiring
    (:data:`CURVE` with the trained ids, 1.3 otherwise) unless acceptance is pinned (then ``1 +
    sum(rates)``); ``env.NCCL_PROTO=LL`` halves the cycles (the cost side). ``noise``: relative,
    seeded, on tok/s."""

    name = "split"

    def __init__(self, *, noise: float = 0.0, seed: int = 0):
        self.noise, self.rng = noise, random.Random(seed)
        self.deterministic_metrics = () if noise else ("output_tok_s", "accept_length")
        self.pinned_runs = 0

    def plan(self, settings: LiveSettings) -> TrialPlan:
        effective, warnings, refusal = speculative_effective(settings)
        if effective["eagle_aux_hidden_state_layer_ids"] is None:
            effective["eagle_aux_hidden_state_layer_ids"] = TRUE_IDS
        return make_plan(
            self.name, settings, effective=effective, warnings=warnings, refusal=refusal
        )

    def run(self, plan: TrialPlan) -> TrialResult:
        e = plan.effective
        rates = e.get("pinned_acceptance")
        self.pinned_runs += rates is not None
        trained = sorted(e["eagle_aux_hidden_state_layer_ids"]) == TRUE_IDS
        al = 1 + sum(rates) if rates else (GOOD_AL if trained else 1.3)
        cycles = 30.0 * (0.5 if (e.get("env") or {}).get("NCCL_PROTO") == "LL" else 1.0)
        tok_s = al * cycles * (1 + self.noise * self.rng.gauss(0, 1))
        curve = CURVE[: e["num_steps"]] if trained and not rates else []
        return TrialResult(
            engine=self.name,
            status="ok",
            requested=plan.requested,
            effective=e,
            output_tok_s=tok_s,
            accept_length=al,
            accept_rate_per_position=curve,
        )


def write_spec(path: Path, **settings: Any) -> Path:
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


def bisect(tmp_path: Path, engine: SplitEngine, **options: Any):
    tmp_path.mkdir(exist_ok=True)
    good = write_spec(tmp_path / "good.yaml")
    bad = write_spec(
        tmp_path / "bad.yaml",
        eagle_aux_hidden_state_layer_ids=[-1, 1, 5],
        **{"env.NCCL_PROTO": "LL"},
    )
    return run_bisect(
        BisectOptions(
            good=str(good),
            bad=str(bad),
            tracking_uri=f"sqlite:///{tmp_path / 'm.db'}",
            log_path=tmp_path / "b.log",
            **options,
        ),
        engine_factory=lambda spec: engine,
    )


@pytest.mark.parametrize(
    ("pinned", "natural", "side"),
    [
        (ProbeOutcome.GOOD, 1.3, "acceptance"),  # the good acceptance recovers it
        # still slow with the good acceptance, its own acceptance intact
        (ProbeOutcome.BAD, 3.4, "cost"),
        # still slow, and its acceptance alone is below 0.9 × the good one's
        (ProbeOutcome.BAD, 1.3, "both"),
        (ProbeOutcome.BAD, 3.2, "cost"),  # 3.2 / 3.4 = 0.94: not below the ratio
        (ProbeOutcome.UNRESOLVED, 1.3, "unknown"),
    ],
)
def test_the_side_follows_the_pinned_verdict_and_the_accept_lengths(pinned, natural, side):
    assert classify(pinned, natural=natural, good=3.4, ratio=0.9) == side


def test_the_good_profile_is_its_measured_curve_made_unconditional_or_its_accept_length():
    good = Measurement(
        "fp",
        "measured",
        samples=[100.0, 101.0],
        accept_lengths=[3.0, 3.2],
        curves=[[0.8, 0.75, 0.5], [0.8, 0.75, 0.5]],
    )
    rates, how = good_profile(good, 3)
    assert (
        rates == pytest.approx([0.8, 0.6, 0.3]) and "per-position acceptance over 2 launches" in how
    )
    rates, how = good_profile(good, 5)  # another step count: the accept length (3.1) as a profile
    assert rates == pytest.approx([1.0, 1.0, 0.1, 0.0, 0.0]) and "accept length 3.1" in how
    rates, how = good_profile(good, 1)  # clamped to what one step can accept
    assert rates == [1.0]
    assert good_profile(Measurement("fp", "measured", samples=[1.0]), 3) == (
        None,
        "the good configuration's accept length was not measured",
    )


def test_a_wiring_fault_acts_on_acceptance_and_a_cost_fault_on_cost(tmp_path):
    """Two breaking sets, one on each side: pinned to the good configuration's acceptance, the wrong
    wiring runs as fast as the good one; NCCL_PROTO=LL stays at half. Each side is in the JSON and
    on the parent run."""
    engine = SplitEngine()
    report = bisect(tmp_path, engine)
    body = report.to_json()
    assert body["status"] == "isolated", body["notes"]
    sides = {tuple(s["changes"]): s for s in body["sets"]}
    assert set(sides) == {("eagle_aux_hidden_state_layer_ids",), ("env.NCCL_PROTO",)}
    wiring, nccl = sides[("eagle_aux_hidden_state_layer_ids",)], sides[("env.NCCL_PROTO",)]
    assert (wiring["side"], nccl["side"]) == ("acceptance", "cost")
    assert wiring["pinned"]["outcome"] == "GOOD"
    # its acceptance is the good one's already
    assert nccl["pinned"] is None and nccl["side_detail"].startswith(
        f"not launched pinned: its accept length is {GOOD_AL:.3g} against the good configuration's "
        f"{GOOD_AL:.3g}"
    )
    # the good configuration's own curve
    assert wiring["pinned"]["rates"] == pytest.approx([0.9, 0.81, 0.648])
    assert wiring["pinned"]["accept_length"] == pytest.approx(GOOD_AL)
    assert wiring["pinned"]["natural_accept_length"] == pytest.approx(1.3)
    assert "with acceptance pinned to the good configuration's" in wiring["side_detail"]
    # two endpoints, two sets, the wiring pinned
    assert engine.pinned_runs == 1 and report.launches == 5
    _, parent = Tracking.of_run(f"sqlite:///{tmp_path / 'm.db'}", body["parent_run_id"])
    tags = {
        parent.data.tags[f"breaking_set_{i}"]: parent.data.tags[f"breaking_set_{i}_side"]
        for i in (1, 2)
    }
    assert tags == {"eagle_aux_hidden_state_layer_ids": "acceptance", "env.NCCL_PROTO": "cost"}
    assert "acts on **acceptance**" in parent.data.tags["mlflow.note.content"]


def test_the_sides_are_probed_under_noise_within_the_budget(tmp_path):
    """With 3 % noise the pinned probes are judged as any probe is (repeats, the same level) and
    still split."""
    report = bisect(tmp_path, SplitEngine(noise=0.03, seed=4))
    sides = {tuple(s["changes"]): s["side"] for s in report.sets}
    assert sides == {
        ("eagle_aux_hidden_state_layer_ids",): "acceptance",
        ("env.NCCL_PROTO",): "cost",
    }
    assert report.launches <= report.max_launches


def test_no_sides_without_asking_and_none_for_an_accept_length_bisect(tmp_path):
    engine = SplitEngine()
    report = bisect(tmp_path / "off", engine, sides=False)
    assert engine.pinned_runs == 0 and all("side" not in s for s in report.sets)
    engine = SplitEngine()
    report = bisect(tmp_path / "al", engine, metric="accept_length")
    # a set that breaks the accept length acts on acceptance: nothing to pin
    assert engine.pinned_runs == 0
    assert [s["side"] for s in report.sets] == ["acceptance"]


def test_a_spent_budget_leaves_the_side_unknown(tmp_path):
    """With 5 launches (and looks) the search takes 4; NCCL_PROTO's side needs no launch, only a
    look, and then nothing is left to launch the wiring pinned."""
    engine = SplitEngine()
    report = bisect(tmp_path, engine, max_launches=5)
    assert report.status.value == "isolated" and engine.pinned_runs == 0 and report.launches == 4
    assert [s["side"] for s in report.sets] == ["unknown", "cost"]
    assert (
        "the launch budget is spent" in report.sets[0]["side_detail"]
        and report.sets[0]["pinned"] is None
    )
