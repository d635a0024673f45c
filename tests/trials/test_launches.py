"""Launches: every engine run a live trial makes is recorded on its child run and counted by
stage."""

from __future__ import annotations

import dataclasses

import pytest
from fake_engine import FakeEngine

from bisect_eagle.engines.base import TrialResult, failed
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.spec.schema import Spec
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.runs import Tracking
from bisect_eagle.trials.context import TrialContext
from bisect_eagle.trials.launches import Launches, Meter, count_launches, launch_unit, run_launches
from bisect_eagle.trials.live import run_live_trial


def _spec(kind: str, **search) -> Spec:
    return Spec.model_validate(
        {
            "name": "l",
            "target": "t",
            "draft": "d",
            "dump": "u",
            "prompts": "p.jsonl",
            "engine": {"kind": kind},
            "search": search,
        }
    )


class FailsSecond(FakeEngine):
    """Fails every second run: a failed repeat ends the trial after it launched."""

    def run(self, plan: TrialPlan) -> TrialResult:
        result = super().run(plan)
        if len(self.runs) % 2 == 0:
            return failed(self.name, requested={}, effective={}, cls="out_of_memory", detail="OOM")
        return result


@pytest.fixture
def tracking(tmp_path) -> Tracking:
    return Tracking.open(f"sqlite:///{tmp_path}/mlflow.db", "launches")


def test_a_trial_records_its_engine_runs_and_the_meter_counts_them(tracking):
    engine = FakeEngine()
    ctx = TrialContext(
        spec=_spec("sglang", repeats=3),
        tracking=tracking,
        study="s",
        parent_run_id=tracking.start_run("p", tags={}),
        engine=engine,
    )
    live = run_live_trial(
        ctx, engine.plan(LiveSettings(num_steps=2)), stage="live", parent_run_id=ctx.parent_run_id
    )
    assert tracking.get_run(live.run_id).data.metrics["launches"] == 3 == len(engine.runs)
    one = dataclasses.replace(ctx, engine=FailsSecond())  # a copy of the context shares its meter
    failed_trial = run_live_trial(
        one,
        one.engine.plan(LiveSettings(num_steps=1)),
        stage="confirm",
        parent_run_id=ctx.parent_run_id,
    )
    assert failed_trial.status == "failed"
    # the failing repeat launched too
    assert tracking.get_run(failed_trial.run_id).data.metrics["launches"] == 2
    refused = engine.plan(LiveSettings(num_steps=1, topk=4))
    assert refused.refusal is not None
    record = run_live_trial(ctx, refused, stage="baseline", parent_run_id=ctx.parent_run_id)
    assert tracking.get_run(record.run_id).data.metrics["launches"] == 0  # refused: nothing ran
    assert ctx.meter.runs == 5 and ctx.meter.engine_s > 0
    assert count_launches(tracking, ctx.parent_run_id) == Launches(live=3, confirm=2, baseline=0)


def test_runs_without_a_recorded_count_count_their_repeats_or_one(tracking):
    parent = tracking.start_run("p", tags={})
    for stage, metrics in (
        ("live", {"repeats": 2.0}),
        ("live", {}),
        ("confirm", {"launches": 4.0}),
        ("baseline", {"launches": 1.0}),
        ("standalone", {"launches": 9.0}),
    ):
        run = tracking.start_run(stage, tags={"stage": stage}, parent_run_id=parent)
        tracking.log(run, metrics=metrics)
    counted = count_launches(tracking, parent, unit="runs")
    # another stage is not a launch
    assert counted == Launches(live=3, confirm=4, baseline=1, unit="runs")
    assert counted.total == 8 and run_launches({}) == 1


def test_launches_read_back_from_json_and_become_the_parent_metrics():
    counted = Launches(live=4, confirm=12, baseline=1)
    assert counted.to_json() == {
        "total": 17,
        "live": 4,
        "confirm": 12,
        "baseline": 1,
        "unit": "launches",
    }
    assert Launches.from_json(counted.to_json()) == counted
    assert counted.metrics() == {
        "launches": 17.0,
        "launches_live": 4.0,
        "launches_confirm": 12.0,
        "launches_baseline": 1.0,
    }
    assert counted.summary() == "17 launches (live 4, confirm 12, baseline 1)"


def test_the_local_engine_runs_in_process_and_a_server_engine_launches():
    assert launch_unit(_spec("local")) == "runs"
    assert launch_unit(_spec("sglang")) == launch_unit(_spec("vllm")) == "launches"


def test_a_meter_adds_runs_and_seconds():
    meter = Meter()
    meter.add(1.5)
    meter.add(0.25)
    assert (meter.runs, meter.engine_s) == (2, 1.75)
