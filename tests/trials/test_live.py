"""One trial as one call (``run_live_trial``): a stored trial reused without a launch, the forecast
logged when the run starts, and the run a raising trial leaves named on the context, with no
callback."""

from __future__ import annotations

import pytest

from bisect_eagle.engines.base import Engine, TrialResult
from bisect_eagle.engines.plan import TrialPlan, make_plan
from bisect_eagle.engines.sglang.rules import speculative_effective
from bisect_eagle.spec.schema import Spec
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.runs import Tracking
from bisect_eagle.trials.context import TrialContext
from bisect_eagle.trials.live import run_live_trial


class CountingEngine(Engine):
    """A good result every run, counted; ``broken`` makes a run raise as an engine bug would."""

    name = "counting"

    def __init__(self, *, broken: bool = False):
        self.runs = 0
        self.broken = broken

    def plan(self, settings: LiveSettings) -> TrialPlan:
        effective, warnings, refusal = speculative_effective(settings)
        return make_plan(
            self.name, settings, effective=effective, warnings=warnings, refusal=refusal
        )

    def run(self, plan: TrialPlan) -> TrialResult:
        self.runs += 1
        if self.broken:
            raise RuntimeError("the engine broke mid-trial")
        return TrialResult(
            engine=self.name,
            status="ok",
            requested=plan.requested,
            effective=plan.effective,
            output_tok_s=40.0,
            accept_length=2.5,
            accept_rate_per_position=[0.8, 0.7],
            wall_s=0.1,
        )


@pytest.fixture
def ctx(tmp_path) -> TrialContext:
    tracking = Tracking.open(f"sqlite:///{tmp_path}/mlflow.db", "live")
    parent = tracking.start_run("study", tags={"role": "study"})
    return TrialContext(Spec(name="unit"), tracking, "s", parent, engine=CountingEngine())


def test_reuse_returns_the_stored_trial_without_a_launch(ctx):
    plan = ctx.plan(LiveSettings(num_steps=2))
    first = run_live_trial(ctx, plan, stage="live", parent_run_id=ctx.parent_run_id, reuse=True)
    again = run_live_trial(ctx, plan, stage="live", parent_run_id=ctx.parent_run_id, reuse=True)
    assert ctx.engine.runs == 1 and not first.cached
    assert again.cached and again.run_id == first.run_id and again.value == first.value
    # reuse off: measured
    fresh = run_live_trial(ctx, plan, stage="live", parent_run_id=ctx.parent_run_id)
    assert ctx.engine.runs == 2 and fresh.run_id != first.run_id


def test_the_forecast_is_on_the_run_from_its_start(ctx):
    record = run_live_trial(
        ctx,
        ctx.plan(LiveSettings(num_steps=2)),
        stage="live",
        parent_run_id=ctx.parent_run_id,
        start_metrics={"predicted_output_tok_s": 37.5},
    )
    metrics = ctx.tracking.get_run(record.run_id).data.metrics
    assert metrics["predicted_output_tok_s"] == 37.5 and metrics["output_tok_s"] == 40.0
    assert ctx.run_id == record.run_id


def test_a_trial_that_raises_leaves_its_run_named_on_the_context_and_ended(ctx):
    ctx.engine = CountingEngine(broken=True)
    with pytest.raises(RuntimeError, match="broke mid-trial"):
        run_live_trial(
            ctx, ctx.plan(LiveSettings(num_steps=2)), stage="live", parent_run_id=ctx.parent_run_id
        )
    assert ctx.run_id is not None
    assert ctx.tracking.get_run(ctx.run_id).info.status == "FAILED"
