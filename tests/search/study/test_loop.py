"""The study loop's baseline: a failed baseline trial ends the study with a reason, not a
traceback."""

from __future__ import annotations

import json

import optuna
import pytest
from fake_engine import FakeEngine

from bisect_eagle.engines.base import TrialResult, failed
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.search.study import Options, run_study
from bisect_eagle.search.study.loop import BaselineFailed
from bisect_eagle.spec.load import load_spec
from bisect_eagle.tracking.runs import Tracking


class NoBaseline(FakeEngine):
    def run(self, plan: TrialPlan) -> TrialResult:
        if plan.settings.is_baseline:
            return failed(
                self.name,
                requested={},
                effective={},
                cls="out_of_memory",
                detail="CUDA out of memory.\nTried to allocate 2 GiB",
            )
        return super().run(plan)


def test_a_failed_baseline_fails_the_parent_run_with_its_class(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = tmp_path / "nobase.yaml"
    path.write_text(
        json.dumps(
            {
                "name": "nobase",
                "target": "t",
                "draft": "d",
                "dump": "u",
                "prompts": "p.jsonl",
                "engine": {"kind": "sglang"},
                "baseline": "measure",
                "space": {"num_steps": {"type": "int", "low": 1, "high": 3}},
            }
        )
    )
    spec = load_spec(path)
    opts = Options(
        storage=f"sqlite:///{tmp_path}/optuna.db", tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"
    )
    engine = NoBaseline()
    with pytest.raises(BaselineFailed) as caught:
        run_study(spec, options=opts, engine_factory=lambda s: engine)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(
        "the baseline trial failed (out_of_memory): CUDA out of"
    )
    assert caught.value.failure_class == "out_of_memory"
    assert engine.runs == []  # no live trial after it
    tracking = Tracking.open(opts.tracking_uri, "nobase")
    (parent,) = tracking.client.search_runs([tracking.experiment_id], "tags.role = 'study'")
    assert parent.info.status == "FAILED" and parent.data.tags["failure_class"] == "out_of_memory"
    assert parent.data.tags["baseline_run_id"] == caught.value.run_id


class BeatChecking(FakeEngine):
    """Records, at each live trial, which RUNNING Optuna trials hold a heartbeat row in the study's
    database."""

    def __init__(self, db: str) -> None:
        super().__init__()
        self.db = db
        self.unbeaten: list[int] = []

    def run(self, plan: TrialPlan) -> TrialResult:
        import sqlite3

        with sqlite3.connect(self.db) as c:
            self.unbeaten += [
                row[0]
                for row in c.execute(
                    "select t.trial_id from trials t left join trial_heartbeats h on h.trial_id = "
                    "t.trial_id where t.state = 'RUNNING' and h.trial_id is null"
                )
            ]
        return super().run(plan)


def test_a_trial_holds_a_heartbeat_before_its_engine_runs(tmp_path):
    """A process SIGKILLed in its first second of a trial must leave a trial Optuna sees as stale:
    Optuna never fails a RUNNING trial that holds no heartbeat, so the first beat is recorded as the
    trial is asked."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = tmp_path / "beats.yaml"
    path.write_text(
        json.dumps(
            {
                "name": "beats",
                "target": "t",
                "draft": "d",
                "dump": "u",
                "prompts": "p.jsonl",
                "engine": {"kind": "sglang"},
                "baseline": "measure",
                "search": {"sampler": "grid", "max_live_trials": 3, "model": {"enabled": False}},
                "space": {"num_steps": {"type": "int", "low": 1, "high": 3}},
            }
        )
    )
    opts = Options(
        storage=f"sqlite:///{tmp_path}/optuna.db", tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"
    )
    engine = BeatChecking(str(tmp_path / "optuna.db"))
    run_study(load_spec(path), options=opts, engine_factory=lambda s: engine)
    assert len(engine.runs) >= 2
    assert engine.unbeaten == []


def test_optuna_dashboard_sees_the_objective_by_name_and_the_target(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = tmp_path / "named.yaml"
    path.write_text(
        json.dumps(
            {
                "name": "named",
                "target": "t",
                "draft": "d",
                "dump": "u",
                "prompts": "p.jsonl",
                "engine": {"kind": "sglang"},
                "baseline": "measure",
                "criterion": {"metric": "output_tok_s"},
                "search": {"sampler": "grid", "max_live_trials": 1, "model": {"enabled": False}},
                "space": {"num_steps": {"type": "int", "low": 1, "high": 2}},
            }
        )
    )
    opts = Options(
        storage=f"sqlite:///{tmp_path}/optuna.db", tracking_uri=f"sqlite:///{tmp_path}/mlflow.db"
    )
    spec = load_spec(path)
    run_study(spec, options=opts, engine_factory=lambda s: FakeEngine())
    (study,) = [
        optuna.load_study(storage=opts.storage, study_name=n)
        for n in optuna.get_all_study_names(opts.storage)
    ]
    assert study.metric_names == ["output_tok_s"]
    assert study.user_attrs["baseline"] > 0
    assert study.user_attrs["target"] == pytest.approx(
        study.user_attrs["baseline"] * spec.criterion.ratio
    )


@pytest.fixture(scope="module")
def confirmed(tmp_path_factory):
    """A fake-engine grid study on output tok/s whose candidate is confirmed on 3 interleaved pairs;
    its progress messages are kept."""
    from fake_engine import make_spec, search

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    root = tmp_path_factory.mktemp("names")
    spec = load_spec(make_spec(root, "names", ratio=1.5, high=4, budget=8, sampler="grid"))
    store = {"storage": f"sqlite:///{root}/optuna.db", "tracking": f"sqlite:///{root}/mlflow.db"}
    messages: list[tuple[str, str]] = []
    out = search(
        spec, FakeEngine(), store, progress=lambda p: messages.append((p.stage, p.message))
    )
    study = optuna.load_study(storage=store["storage"], study_name=out.study)
    return out, study, Tracking.open(out.tracking_uri, "names"), messages


def test_an_optuna_trial_and_its_mlflow_run_have_one_name_and_number(confirmed):
    out, study, tracking, messages = confirmed
    runs = {r.info.run_id: r for r in tracking.child_runs(out.parent_run_id)}
    measured = [t for t in study.trials if "mlflow_run_id" in t.user_attrs]
    assert len(measured) == out.counts["live_measured"] >= 4
    for t in study.trials:
        # optuna-dashboard shows it beside number=N
        assert t.user_attrs["name"] == f"live {t.number:03d}"
    for t in measured:
        run = runs[t.user_attrs["mlflow_run_id"]]
        assert run.data.tags["trial"] == t.user_attrs["name"] and run.data.tags[
            "trial_number"
        ] == str(t.number)
        assert run.info.run_name.startswith(t.user_attrs["name"] + " ids=")
        assert (
            "live",
            f"{t.user_attrs['name']}: {t.value:.2f} (ok), run {run.info.run_id[:8]}",
        ) in messages
    assert study.best_trial.user_attrs["name"] == runs[out.best["run_id"]].data.tags["trial"]
    assert study.best_trial.user_attrs["mlflow_run_id"] == out.best["run_id"]


def test_the_baseline_is_named_once_and_confirmation_runs_by_pair_and_role(confirmed):
    out, _, tracking, _ = confirmed
    children = tracking.child_runs(out.parent_run_id)
    names = [r.info.run_name for r in children]
    assert len(set(names)) == len(names)
    assert [r.info.run_name for r in children if r.data.tags["stage"] == "baseline"] == ["baseline"]
    assert [n for n in names if "baseline" in n and not n.startswith("confirm ")] == ["baseline"]
    candidate = tracking.get_run(out.best["run_id"]).data.tags["trial"]
    pairs = out.confirmation["pairs"]
    assert candidate.startswith("live ") and pairs >= 3
    confirm = [r for r in children if r.data.tags["stage"] == "confirm"]
    # named from the tags the confirmation step sets: its pair (0-based there) and role
    for r in confirm:
        role, pair = r.data.tags["confirm_role"], int(r.data.tags["confirm_pair"]) + 1
        assert (
            r.info.run_name
            == r.data.tags["trial"]
            == " ".join(["confirm", str(pair), role, *([candidate] if role == "candidate" else [])])
        )
    assert sorted(
        r.info.run_name for r in confirm if r.data.tags["confirm_role"] == "candidate"
    ) == [f"confirm {k} candidate {candidate}" for k in range(1, pairs + 1)]
    assert {r.data.tags["confirm_role"] for r in confirm} == {"candidate", "baseline"}


def test_a_pinned_acceptance_config_is_never_a_search_trial(tmp_path):
    """Pinned acceptance measures cost alone: the search refuses it as a trial (never a winner or a
    sample)."""
    from fake_engine import make_spec, search

    store = {
        "storage": f"sqlite:///{tmp_path}/optuna.db",
        "tracking": f"sqlite:///{tmp_path}/mlflow.db",
    }
    path = make_spec(tmp_path, "pinned", ratio=1.2, budget=4)
    pinned = "engine: {kind: sglang, settings: {num_steps: 2, pinned_acceptance: [0.9, 0.8]}}"
    path.write_text(
        path.read_text()
        .replace("engine: {kind: sglang}", pinned)
        .replace("  num_steps: {type: int, low: 1, high: 6}\n", "")
    )
    out = search(load_spec(path, check_inputs=False), FakeEngine(), store)
    assert out.counts["live_measured"] == 0 and not out.target_reached
    assert all(
        "pinned_acceptance" in t.get("invalid", "") for t in out.trials if t.get("invalid")
    ), out.trials


def test_optuna_dashboard_sees_each_trials_effective_values(confirmed):
    """A default the engine resolved (num_draft_tokens None -> num_steps + 1 for a chain) is shown
    as it ran."""
    _, study, _, _ = confirmed
    trial = study.best_trial
    effective = trial.user_attrs["effective"]
    assert effective["num_draft_tokens"] == effective["num_steps"] + 1
    assert trial.user_attrs["effective.num_draft_tokens"] == effective["num_draft_tokens"]
    assert trial.user_attrs["effective.num_steps"] == trial.params["num_steps"]
