"""Confirmation before "target reached": the paired bound, a lucky first measurement refused, a
fixed baseline."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections import Counter
from pathlib import Path

import optuna
import pytest
from fake_engine import FakeEngine

from bisect_eagle.engines.base import TrialResult, combine_rounds
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.search.study import Options, run_study
from bisect_eagle.search.study.confirm import Confirmation
from bisect_eagle.spec.load import load_spec
from bisect_eagle.spec.schema import Spec
from bisect_eagle.stats import ratio_bounds
from bisect_eagle.tracking.runs import Tracking


def test_ratio_bounds_of_noise_free_pairs_are_the_ratio():
    assert ratio_bounds(
        [2.0, 2.0, 2.0], [1.0, 1.0, 1.0], confidence=0.95, looks=3
    ) == pytest.approx((2, 2, 2))
    assert ratio_bounds([3.0, 3.0], 1.5, confidence=0.95, looks=1) == pytest.approx((2, 2, 2))


def test_ratio_bounds_are_a_student_t_interval_on_log_ratios():
    cand, base = [1.10, 1.02, 1.06, 0.98], [1.0, 1.0, 1.0, 1.0]
    est, lo, hi = ratio_bounds(cand, base, confidence=0.95, looks=2)
    d = [math.log(c) for c in cand]
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    half = 3.1824463 * sd / 2  # t_{0.975}(3): 0.05 split over two looks
    assert est == pytest.approx(math.exp(mean))
    assert lo == pytest.approx(math.exp(mean - half), rel=1e-6) and hi == pytest.approx(
        math.exp(mean + half)
    )
    drifted = ratio_bounds([c * 0.5 for c in cand], [0.5] * 4, confidence=0.95, looks=2)
    assert drifted == pytest.approx((est, lo, hi))  # a slower machine for both sides cancels


def test_ratio_bounds_need_two_matching_pairs():
    with pytest.raises(ValueError, match="two pairs"):
        ratio_bounds([2.0], [1.0], confidence=0.95, looks=1)
    with pytest.raises(ValueError, match="baseline samples"):
        ratio_bounds([2.0, 2.0], [1.0], confidence=0.95, looks=1)


class LuckyEngine(FakeEngine):
    """The fake engine, but every speculative config's first measurement reads ``luck`` × its true
    value."""

    def __init__(self, luck: float):
        super().__init__()
        self.luck = luck
        self.seen: Counter[str] = Counter()

    def run(self, plan: TrialPlan) -> TrialResult:
        result = super().run(plan)
        if not plan.settings.is_baseline:
            self.seen[plan.fingerprint] += 1
            if self.seen[plan.fingerprint] == 1:
                result.output_tok_s *= self.luck
        return result


def spec_of(
    tmp_path: Path,
    name: str,
    *,
    baseline: str | float = "measure",
    enabled: bool = True,
    metric: str = "output_tok_s",
    ratio: float = 2.0,
) -> Spec:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        json.dumps(
            {
                "name": name,
                "target": "t",
                "draft": "d",
                "dump": "u",
                "prompts": "p.jsonl",
                "engine": {"kind": "sglang"},
                "baseline": baseline,
                # accept length 2.8 (num_steps 3): above 2.0 × 1
                "criterion": {"metric": metric, "ratio": ratio},
                "space": {
                    "eagle_aux_hidden_state_layer_ids": {
                        "type": "categorical",
                        "choices": [[1, 5, 9]],
                    },
                    # 193 tok/s: just below 200
                    "num_steps": {"type": "categorical", "choices": [3]},
                },
                "search": {
                    "sampler": "grid",
                    "max_live_trials": 4,
                    "confirm": {"enabled": enabled},
                },
            }
        )
    )
    return load_spec(path)


@pytest.fixture()
def stores(tmp_path) -> Options:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return Options(
        storage=f"sqlite:///{tmp_path}/optuna.db", tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"
    )


def test_a_lucky_first_measurement_is_not_confirmed(stores, tmp_path):
    engine = LuckyEngine(luck=1.1)  # 193 measured as 212 once, then 193 again
    out = run_study(spec_of(tmp_path, "lucky"), options=stores, engine_factory=lambda s: engine)
    assert not out.target_reached and out.stop_reason.startswith("search space exhausted")
    c = Confirmation(**out.confirmation)
    assert c.status == "not confirmed" and c.upper < 2.0 and c.pairs == 3
    assert c.candidate == pytest.approx([193.1] * 3, rel=1e-3) and c.baseline == [100.0] * 3
    assert "not confirmed (lower bound 1.93× < 2×)" in out.verdict
    tracking = Tracking.open(stores.tracking_uri, "lucky")
    parent = tracking.get_run(out.parent_run_id)
    assert (
        parent.data.tags["confirmation"].startswith("not confirmed")
        and parent.data.metrics["confirm_pairs"] == 3
    )
    confirm_runs = tracking.child_runs(out.parent_run_id, "confirm")
    # the third pair shares the study's own baseline launch: the two new ones show no drift from it
    assert Counter(r.data.tags["confirm_role"] for r in confirm_runs) == {
        "candidate": 3,
        "baseline": 2,
    }
    assert (
        c.shared_baseline == 1 and c.launches == 5 and parent.data.metrics["confirm_launches"] == 5
    )


def test_without_confirmation_the_lucky_measurement_is_taken(stores, tmp_path):
    out = run_study(
        spec_of(tmp_path, "unconfirmed", enabled=False),
        options=stores,
        engine_factory=lambda s: LuckyEngine(luck=1.1),
    )
    assert out.target_reached and out.confirmation is None
    assert out.stop_reason == "target reached (not confirmed: search.confirm.enabled is false)"


def test_a_fixed_baseline_confirms_the_candidate_alone(stores, tmp_path):
    engine = LuckyEngine(luck=1.0)
    out = run_study(
        spec_of(tmp_path, "fixed", baseline=90.0), options=stores, engine_factory=lambda s: engine
    )
    assert out.target_reached and out.stop_reason.startswith(
        "target reached (confirmed, bound 2.146"
    )
    assert out.confirmation["baseline"] == [] and out.confirmation["baseline_drift"] is None
    assert sum(s.is_baseline for s in engine.runs) == 0 and len(engine.runs) == 1 + 3


GREEDY = ("accept_length",)


@pytest.mark.parametrize(
    ("metric", "declared", "stages", "roles"),
    [
        # accept length declared deterministic: the search's measurement is the one, the baseline is
        # 1 by definition
        ("accept_length", GREEDY, {"baseline": 1, "live": 1}, {}),
        # accept length not declared deterministic: the candidate alone, min_pairs times, against 1
        ("accept_length", (), {"baseline": 1, "live": 1, "confirm": 3}, {"candidate": 3}),
        # tok/s: interleaved pairs whatever the engine declares about accept length; the third
        # pair's baseline is the study's own launch (the baseline shows no drift)
        (
            "output_tok_s",
            GREEDY,
            {"baseline": 1, "live": 1, "confirm": 5},
            {"candidate": 3, "baseline": 2},
        ),
        (
            "output_tok_s",
            (),
            {"baseline": 1, "live": 1, "confirm": 5},
            {"candidate": 3, "baseline": 2},
        ),
    ],
)
def test_engine_runs_per_stage_follow_the_metrics_noise(
    stores, tmp_path, metric, declared, stages, roles
):
    engine = FakeEngine(deterministic=declared)
    name = f"stages-{metric}-{len(declared)}"
    # 193 tok/s
    spec = spec_of(tmp_path, name, metric=metric, ratio=2.0 if metric == "accept_length" else 1.5)
    out = run_study(spec, options=stores, engine_factory=lambda s: engine)
    # stage 1: no wirings, no engine run
    assert out.target_reached and out.counts["standalone"] == 0
    tracking = Tracking.open(stores.tracking_uri, name)
    children = tracking.child_runs(out.parent_run_id)
    assert Counter(r.data.tags["stage"] for r in children) == stages
    assert len(engine.runs) == sum(stages.values())  # one engine run per child run (repeats 1)
    assert sum(s.is_baseline for s in engine.runs) == 1 + roles.get("baseline", 0)
    assert (
        Counter(r.data.tags["confirm_role"] for r in children if r.data.tags["stage"] == "confirm")
        == roles
    )
    c = Confirmation(**out.confirmation)
    assert c.confirmed and c.pairs == max(1, roles.get("candidate", 0))
    parent = tracking.get_run(out.parent_run_id)
    if metric == "accept_length":
        assert c.baseline == [] and c.candidate == [pytest.approx(2.8)] * c.pairs and c.lower >= 2.0
        assert (
            "the baseline is 1 by definition" in c.schedule
            and parent.data.tags["confirm_schedule"] == c.schedule
        )
    if declared and metric == "accept_length":
        assert c.deterministic and c.lower == c.estimate == c.upper == pytest.approx(2.8)
        assert c.schedule == (
            "confirmation: accept_length is deterministic under greedy decoding: one measurement "
            "of the candidate, the baseline is 1 by definition"
        )
        live = [r for r in children if r.data.tags["stage"] == "live"]
        assert c.run_ids == [live[0].info.run_id] and "search's own measurement" in c.detail
        assert out.stop_reason.startswith(
            "target reached (confirmed, bound 2.800 ≥ 2 × baseline; deterministic"
        )
    else:
        assert not c.deterministic


def test_a_deterministic_value_is_confirmed_at_the_target_and_refused_below(stores, tmp_path):
    """The bound of a deterministic metric is the value: confirmed at or above the ratio, never
    below; measured once when the search's measurement is not of the same plan."""
    from bisect_eagle.search.study.confirm import confirm
    from bisect_eagle.spec.schema import Confirm
    from bisect_eagle.trials.context import TrialContext

    spec = spec_of(tmp_path, "exact", metric="accept_length")
    tracking = Tracking.open(stores.tracking_uri, "exact")
    parent = tracking.start_run("parent", tags={})
    engine = FakeEngine(deterministic=GREEDY)
    ctx = TrialContext(
        spec=spec,
        tracking=tracking,
        study="exact",
        parent_run_id=parent,
        engine=engine,
        baseline=1.0,
        target=2.0,
    )
    plan = engine.plan(
        spec.fixed_settings().model_copy(
            update={"eagle_aux_hidden_state_layer_ids": [1, 5, 9], "num_steps": 3}
        )
    )
    settings = Confirm()
    below = confirm(
        ctx, candidate=plan, baseline=None, settings=settings, ratio=2.81, first_baseline=1.0
    )
    assert (
        below.status == "not confirmed" and below.upper == pytest.approx(2.8) and below.pairs == 1
    )
    assert len(engine.runs) == 1 and "measured once" in below.detail
    at = confirm(
        ctx, candidate=plan, baseline=None, settings=settings, ratio=2.8, first_baseline=1.0
    )
    assert at.confirmed and len(engine.runs) == 2  # 2.8 / 1 == 2.8 up to rounding: at the target
    reused = confirm(
        ctx,
        candidate=plan,
        baseline=None,
        settings=settings,
        ratio=2.0,
        first_baseline=1.0,
        known=(1.9, "run-x"),
    )
    assert (
        reused.status == "not confirmed" and reused.run_ids == ["run-x"] and len(engine.runs) == 2
    )


class RoundsEngine(FakeEngine):
    """The fake engine with benchmark rounds on one launch: tok/s × exp(launch effect + round
    noise), a launch reported as ``launch_s`` seconds; ``drift`` multiplies the baseline by ``1 +
    drift`` at every launch (the study's own baseline measurement, given as the pool, was the last
    one before)."""

    rounds_share_launch = True

    def __init__(self, *, launch_sd: float, round_sd: float, drift: float = 0.0, seed: int = 0):
        super().__init__()
        self.launch_sd, self.round_sd, self.drift = launch_sd, round_sd, drift
        self.rng = random.Random(seed)
        self.launched: list[tuple[bool, int]] = []  # (baseline, rounds) per launch
        self.baseline_launches = 0

    def run_rounds(self, plan: TrialPlan, *, rounds: int) -> TrialResult:
        launch = self.rng.gauss(0, self.launch_sd)
        base = plan.settings.is_baseline
        self.launched.append((base, rounds))
        # since the study's baseline
        scale = (1 + self.drift) ** (self.baseline_launches + 1) if base else 1.0
        self.baseline_launches += base
        results = []
        for _ in range(rounds):
            r = super().run(plan)
            r.output_tok_s *= scale * math.exp(launch + self.rng.gauss(0, self.round_sd))
            results.append(r)
        out = combine_rounds(results)
        out.launch_s = 600.0
        return out

    def run(self, plan: TrialPlan) -> TrialResult:
        return self.run_rounds(plan, rounds=1)


def _confirming(tmp_path, stores, name: str, engine):
    from bisect_eagle.trials.context import TrialContext

    spec = spec_of(tmp_path, name, ratio=1.5)
    tracking = Tracking.open(stores.tracking_uri, name)
    ctx = TrialContext(
        spec=spec,
        tracking=tracking,
        study=name,
        parent_run_id=tracking.start_run("parent", tags={}),
        engine=engine,
        baseline=BASELINE,
        target=1.5 * BASELINE,
    )
    fixed = spec.fixed_settings()
    plan = engine.plan(
        fixed.model_copy(update={"eagle_aux_hidden_state_layer_ids": [1, 5, 9], "num_steps": 3})
    )
    baseline = engine.plan(fixed.model_copy(update={"speculative_algorithm": "none"}))
    return ctx, plan, baseline


# the fake engine's baseline tok/s; its candidate (1,5,9; 3 steps) measures 193 = 1.93 × it
BASELINE = 100.0


def test_noise_in_the_rounds_is_averaged_on_one_launch(stores, tmp_path):
    """No launch effect: after the first launches (3 rounds each) measure the split, every launch
    measures the most rounds; the verdict says how the noise split and what each launch measured."""
    from bisect_eagle.search.study.confirm import Sample, confirm
    from bisect_eagle.spec.schema import Confirm

    engine = RoundsEngine(launch_sd=0.0, round_sd=0.05)
    ctx, plan, baseline = _confirming(tmp_path, stores, "rounds", engine)
    c = confirm(
        ctx,
        candidate=plan,
        baseline=baseline,
        settings=Confirm(),
        ratio=1.9,
        first_baseline=BASELINE,
        pool=[Sample(value=BASELINE, run_id="study-baseline")],
    )
    assert engine.launched[:2] == [(False, 3), (True, 3)]  # the split unmeasured: first_rounds
    assert {k for _, k in engine.launched[2:]} == {8}  # no launch effect: max_rounds
    assert c.rounds[0] == 3 and c.noise_split["round_sd"] == pytest.approx(0.05, rel=0.5)
    assert c.noise_split["launch_sd"] < 0.03 and c.launches == len(engine.launched)
    runs = Tracking.open(stores.tracking_uri, "rounds").child_runs(ctx.parent_run_id, "confirm")
    assert sorted(int(r.data.tags["confirm_rounds"]) for r in runs) == sorted(
        k for _, k in engine.launched
    )
    assert all(r.data.metrics.get("rounds", 1) == int(r.data.tags["confirm_rounds"]) for r in runs)


def test_noise_in_the_launches_gets_one_round_a_launch(stores, tmp_path):
    from bisect_eagle.search.study.confirm import Sample, confirm
    from bisect_eagle.spec.schema import Confirm

    engine = RoundsEngine(launch_sd=0.05, round_sd=0.0005, seed=3)
    ctx, plan, baseline = _confirming(tmp_path, stores, "launches", engine)
    c = confirm(
        ctx,
        candidate=plan,
        baseline=baseline,
        settings=Confirm(),
        ratio=1.9,
        first_baseline=BASELINE,
        pool=[Sample(value=BASELINE, run_id="study-baseline")],
    )
    assert engine.launched[0][1] == 3 and len(engine.launched) > 3
    # once both variances are measured on a few launches, rounds buy nothing: √(3000 · 2.5e-7 /
    # 2.5e-3) < 1
    assert {k for _, k in engine.launched[4:]} == {1}
    assert c.noise_split["launch_sd"] > 10 * c.noise_split["round_sd"]


def test_a_second_candidate_pairs_with_the_baselines_launches_and_a_drift_stops_the_sharing(
    stores, tmp_path
):
    """A steady baseline: the first confirmation launches it until three launches show no drift, the
    second launches none. A drifting one: every candidate launch is followed by a baseline launch,
    and the bound is the paired one."""
    from bisect_eagle.search.study.confirm import Sample, confirm
    from bisect_eagle.spec.schema import Confirm

    settings = Confirm(max_rounds=1)
    engine = RoundsEngine(launch_sd=0.0, round_sd=0.0)
    ctx, plan, baseline = _confirming(tmp_path, stores, "shared", engine)
    pool = [Sample(value=BASELINE, run_id="study-baseline")]
    first = confirm(
        ctx,
        candidate=plan,
        baseline=baseline,
        settings=settings,
        ratio=1.5,
        first_baseline=BASELINE,
        pool=pool,
    )
    assert first.confirmed and len(first.new_baseline) == 2 and first.shared_baseline == 1
    assert "noise pooled" in first.detail
    pool += [Sample(**b) for b in first.new_baseline]
    launched = len(engine.launched)
    second = confirm(
        ctx,
        candidate=plan,
        baseline=baseline,
        settings=settings,
        ratio=1.5,
        first_baseline=BASELINE,
        pool=pool,
        others=[first.candidate],
    )
    assert second.confirmed and second.new_baseline == [] and second.shared_baseline == 3
    # candidate launches only
    assert [b for b, _ in engine.launched[launched:]] == [False] * second.pairs

    drifting = RoundsEngine(launch_sd=0.001, round_sd=0.0, drift=0.05, seed=2)
    ctx, plan, baseline = _confirming(tmp_path, stores, "drift", drifting)
    c = confirm(
        ctx,
        candidate=plan,
        baseline=baseline,
        settings=settings,
        ratio=1.5,
        first_baseline=BASELINE,
        pool=[Sample(value=BASELINE, run_id="study-baseline")],
    )
    # interleaved pairs throughout
    assert [b for b, _ in drifting.launched] == [False, True] * c.pairs
    assert "the baseline drifted: paired" in c.detail and c.baseline_drift > 1.05


class JitterEngine(FakeEngine):
    """The fake engine with ±0.3 % alternating jitter on every speculative measurement."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def run(self, plan: TrialPlan) -> TrialResult:
        result = super().run(plan)
        if not plan.settings.is_baseline:
            self.n += 1
            result.output_tok_s *= 1.003 if self.n % 2 else 0.997
        return result


def test_a_candidate_next_to_the_target_is_set_aside_within_the_indifference_zone(stores, tmp_path):
    """193.1 tok/s against a target of 1.93 × 100: its bound cannot clear the target, nor exclude
    it, and never shows more than 2 % of margin: set aside at the first look instead of spending
    every launch on it."""
    out = run_study(
        spec_of(tmp_path, "near", ratio=1.93),
        options=stores,
        engine_factory=lambda s: JitterEngine(),
    )
    c = Confirmation(**out.confirmation)
    assert c.status == "at target" and c.pairs == 3 and c.lower < 1.93 <= c.upper < 1.93 * 1.02
    assert not out.target_reached and c.summary().startswith("at target: ")
    assert c.launches < 20


def test_a_resume_after_a_sigterm_in_confirmation_launches_only_the_samples_left(stores, tmp_path):
    """SIGTERM during the second candidate launch of a confirmation: no run is left RUNNING, and
    `--resume` keeps the two samples measured before the kill (a candidate and its baseline),
    launches the interrupted one and those after it, and reaches the verdict an uninterrupted study
    reaches (3 candidate and 2 baseline launches)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    spec = spec_of(tmp_path, "confirm-term", ratio=1.5)
    log = tmp_path / "launches.log"  # a line as each launch starts: baseline, live, candidate, ...
    script = Path(__file__).resolve().parents[1] / "study_proc.py"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(script),
            "run",
            str(spec.source),
            stores.storage,
            stores.tracking_uri,
            "2.0",
            str(log),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while (
            not (log.exists() and len(log.read_text().splitlines()) >= 5)
            and proc.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        assert proc.poll() is None, proc.stdout.read()
        os.killpg(proc.pid, signal.SIGTERM)  # while the 5th launch, the second candidate's, runs
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    tracking = Tracking.open(stores.tracking_uri, "confirm-term")
    runs = tracking.client.search_runs([tracking.experiment_id])
    assert not [r for r in runs if r.info.status == "RUNNING"]
    before = [r for r in runs if r.data.tags.get("stage") == "confirm"]
    assert Counter((r.data.tags["confirm_role"], r.info.status) for r in before) == {
        ("candidate", "FINISHED"): 1,
        ("baseline", "FINISHED"): 1,
        ("candidate", "KILLED"): 1,
    }

    engine = FakeEngine()
    out = run_study(
        spec, options=dataclasses.replace(stores, resume=True), engine_factory=lambda s: engine
    )
    assert out.target_reached
    c = Confirmation(**out.confirmation)
    assert c.confirmed and c.pairs == 3 and c.resumed == 2 and c.launches == 5
    # launched: the interrupted candidate, its baseline, the third; nothing measured before
    assert [s.is_baseline for s in engine.runs] == [False, True, False]
    children = tracking.child_runs(out.parent_run_id, "confirm")
    assert Counter((r.data.tags["confirm_role"], r.info.status) for r in children) == {
        ("candidate", "FINISHED"): 3,
        ("baseline", "FINISHED"): 2,
        ("candidate", "KILLED"): 1,
    }
    assert set(c.run_ids) == {r.info.run_id for r in children if r.info.status == "FINISHED"}
    runs = tracking.client.search_runs([tracking.experiment_id])
    assert not [r for r in runs if r.info.status == "RUNNING"]
