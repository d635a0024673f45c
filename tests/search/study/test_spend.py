"""What a study spends: its launches by stage (outcome, parent run, the max_launches budget) and the
tool's own seconds, steering and confirmation included, the engine's excluded."""

from __future__ import annotations

import time
from types import SimpleNamespace

import optuna
import pytest
from fake_engine import FakeEngine, make_spec, search

from bisect_eagle.search.study import loop
from bisect_eagle.search.study.spend import Spend
from bisect_eagle.spec.load import load_spec
from bisect_eagle.tracking.runs import Tracking
from bisect_eagle.trials.launches import Meter


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("store")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return {"storage": f"sqlite:///{root}/optuna.db", "tracking": f"sqlite:///{root}/mlflow.db"}


def _stages(tracking: Tracking, parent: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for run in tracking.child_runs(parent):
        out[run.data.tags["stage"]] = out.get(run.data.tags["stage"], 0) + 1
    return out


def test_every_launch_is_counted_by_stage_in_the_outcome_and_on_the_parent_run(tmp_path, store):
    path = make_spec(tmp_path, "spent", ratio=1.5, high=3, sampler="grid")
    path.write_text(path.read_text().replace("seed: 0,", "seed: 0, repeats: 2,"))
    engine = FakeEngine()
    out = search(load_spec(path), engine, store)
    assert out.target_reached
    tracking = Tracking.open(store["tracking"], "spent")
    stages = _stages(tracking, out.parent_run_id)
    launches = out.launches
    assert launches["total"] == len(engine.runs)  # every engine run, nothing else
    assert (
        launches["baseline"] == 2
        and launches["live"] == 2 * out.counts["live_measured"] == 2 * stages["live"]
    )
    # one repeat each: the candidate's launches and the baseline's, less the study's own baseline it
    # shares
    assert (
        launches["confirm"]
        == stages["confirm"]
        == out.confirmation["launches"]
        == 2 * out.confirmation["pairs"] - 1
    )
    assert launches["unit"] == "launches"
    metrics = tracking.get_run(out.parent_run_id).data.metrics
    assert {
        k: metrics[k]
        for k in ("launches", "launches_live", "launches_confirm", "launches_baseline")
    } == {
        "launches": launches["total"],
        "launches_live": launches["live"],
        "launches_confirm": launches["confirm"],
        "launches_baseline": launches["baseline"],
    }


def test_max_launches_stops_the_study_like_max_live_trials(tmp_path, store):
    # unreachable: only a budget stops it
    path = make_spec(tmp_path, "launchcap", ratio=5.0, budget=20)
    path.write_text(path.read_text().replace("seed: 0,", "seed: 0, max_launches: 4,"))
    engine = FakeEngine()
    out = search(load_spec(path), engine, store)
    assert out.stop_reason == "budget: max_launches (4) used: 4 launches"
    # the baseline and 3 live trials
    assert len(engine.runs) == 4 and out.counts["live_measured"] == 3
    assert out.launches == {"total": 4, "live": 3, "confirm": 0, "baseline": 1, "unit": "launches"}


def test_the_tool_time_counts_steering_and_stopping_but_not_the_engine(
    tmp_path, store, monkeypatch
):
    """Deciding whether to stop (where confirmation and the model's steering happen) was once left
    out."""
    original = loop.reached

    def slow_reached(run):
        time.sleep(0.3)
        return original(run)

    monkeypatch.setattr(loop, "reached", slow_reached)
    spec = load_spec(make_spec(tmp_path, "overhead", ratio=5.0, budget=3, sampler="grid"))
    out = search(spec, FakeEngine(sleep_s=1.0), store)
    assert out.counts["live_measured"] == 3
    # 4 looks at the stop condition for 3 trials: >= 0.4 s per trial; the engine's 1 s per run (the
    # baseline and 3 trials) is not in it, however busy the machine; the looks sleep, so the tool's
    # CPU is less than its wall time
    assert 0.4 <= out.tool_overhead_s_per_trial <= (out.elapsed_s - 4 * 1.0) / 3
    assert 0 <= out.tool_cpu_s_per_trial < out.tool_overhead_s_per_trial


def test_tool_time_excludes_the_engine_seconds_inside_it():
    spend = Spend(meter=Meter())
    with spend.tool_time():
        time.sleep(0.05)
        spend.meter.add(10.0)  # an engine run inside the step: its seconds are the engine's
    assert 0.04 < spend.tool_s + 10.0 < 0.5
    assert spend.per_trial() is None
    spend.measured = 2
    assert spend.per_trial() == pytest.approx(spend.tool_s / 2)


class CountingTracking:
    """A tracking store that only answers child_runs, counting the queries."""

    def __init__(self) -> None:
        self.queries = 0
        self.runs = [
            SimpleNamespace(data=SimpleNamespace(tags={"stage": "live"}, metrics={"launches": 2.0}))
        ]

    def child_runs(self, parent_run_id: str, stage: str | None = None) -> list:
        self.queries += 1
        return list(self.runs)


def test_launches_are_read_again_only_when_something_may_have_launched():
    tracking, spend = CountingTracking(), Spend(meter=Meter())
    assert spend.launches(tracking, "p", state=("a",)).total == 2
    assert spend.launches(tracking, "p", state=("a",)).total == 2 and tracking.queries == 1
    tracking.runs *= 2
    spend.meter.add(1.0)  # this process ran the engine
    assert spend.launches(tracking, "p", state=("a",)).total == 4 and tracking.queries == 2
    tracking.runs *= 2
    # another worker
    assert spend.launches(tracking, "p", state=("a", "b")).total == 8 and tracking.queries == 3
