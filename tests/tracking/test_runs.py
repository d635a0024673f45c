"""MLflow tracking: store location, experiment kind, parent/child runs, secrets, cache lookups,
staleness, system metrics."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bisect_eagle.engines.base import Engine, TrialResult
from bisect_eagle.engines.plan import TrialPlan, make_plan
from bisect_eagle.engines.sglang.rules import speculative_effective
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import Spec
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.owner import owner_alive, owner_id
from bisect_eagle.tracking.redact import is_hidden, redact_url
from bisect_eagle.tracking.runs import PARENT_TAG, RunEnd, Tracking, flat_params
from bisect_eagle.tracking.uris import artifact_root, default_tracking_uri, resolve_tracking_uri
from bisect_eagle.trials.context import TrialContext
from bisect_eagle.trials.live import run_live_trial
from bisect_eagle.trials.record import find_cached

SECRET = "s3cr3t-value-123"


class EchoEngine(Engine):
    """Returns a fixed good result whose launch log echoes the whole environment (secrets
    included)."""

    name = "echo"

    def plan(self, settings: LiveSettings) -> TrialPlan:
        effective, warnings, refusal = speculative_effective(settings)
        if not settings.is_baseline and effective["eagle_aux_hidden_state_layer_ids"] is None:
            effective["eagle_aux_hidden_state_layer_ids"] = [1, 5, 9]
        return make_plan(
            self.name, settings, effective=effective, warnings=warnings, refusal=refusal
        )

    def run(self, plan: TrialPlan) -> TrialResult:
        settings = plan.settings
        return TrialResult(
            engine=self.name,
            status="ok",
            requested=plan.requested,
            effective=plan.effective,
            output_tok_s=50.0,
            accept_length=2.0,
            accept_rate_per_position=[0.5],
            wall_s=0.1,
            artifacts={"launch_command.txt": f"env {settings.env}\n"},
        )


@pytest.fixture(scope="module")
def tracking(tmp_path_factory) -> Tracking:
    root = tmp_path_factory.mktemp("mlruns")
    return Tracking.open(f"sqlite:///{root}/mlflow.db", "unit")


def test_uri_precedence_and_artifact_root(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert default_tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlruns/mlflow.db"
    assert resolve_tracking_uri(None, "sqlite:///spec.db") == "sqlite:///spec.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert resolve_tracking_uri(None, "sqlite:///spec.db") == "http://127.0.0.1:5000"
    assert resolve_tracking_uri("sqlite:///flag.db", "sqlite:///spec.db") == "sqlite:///flag.db"
    assert artifact_root(f"sqlite:///{tmp_path}/mlruns/mlflow.db") == str(
        tmp_path.resolve() / "mlruns/artifacts"
    )
    assert artifact_root("http://127.0.0.1:5000") is None
    assert (
        redact_url("postgresql://bob:hunter2@db:5432/optuna")
        == "postgresql://bob:***@db:5432/optuna"
    )


def test_experiment_is_shown_as_runs_and_children_nest(tracking):
    exp = tracking.client.get_experiment(tracking.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert exp.artifact_location.endswith("/artifacts")
    parent = tracking.start_run("study", tags={"role": "study"})
    child = tracking.start_run(
        "child", tags={"stage": "live"}, params={"num_steps": "3"}, parent_run_id=parent
    )
    assert tracking.get_run(child).data.tags[PARENT_TAG] == parent
    assert [r.info.run_id for r in tracking.child_runs(parent, "live")] == [child]
    assert flat_params({"env": {"A": "1"}, "ids": [1, 5], "x": None}) == {
        "env.A": "1",
        "ids": "[1, 5]",
        "x": "None",
    }


def test_live_trial_logs_effective_settings_and_never_a_secret(tracking):
    parent = tracking.start_run("study-secrets", tags={"role": "study"})
    spec = Spec(name="unit")
    ctx = TrialContext(spec, tracking, "s", parent, engine=EchoEngine(), baseline=25.0, target=30.0)
    settings = LiveSettings(
        num_steps=3,
        num_draft_tokens=9,
        env={"HF_TOKEN": SECRET, "MY_API_KEY": SECRET, "NCCL_ALGO": "Ring"},
    )
    plan = ctx.plan(settings)
    record = run_live_trial(ctx, plan, stage="live", parent_run_id=parent, number=7)
    run = tracking.get_run(record.run_id)
    assert (
        run.info.status == "FINISHED" and run.info.run_name == "live 007 ids=1,5,9 steps=3 topk=1"
    )
    assert run.data.params["eagle_aux_hidden_state_layer_ids"] == "[1, 5, 9]"
    assert (
        run.data.params["num_draft_tokens"] == "4"
        and run.data.params["requested.num_draft_tokens"] == "9"
    )
    assert run.data.params["env.NCCL_ALGO"] == "Ring"
    assert (
        run.data.metrics["output_tok_s_ratio_to_baseline"] == 2.0
        and "ratio_to_baseline" not in run.data.metrics
    )
    curve = tracking.client.get_metric_history(record.run_id, "accept_rate_per_position")
    assert [(m.step, m.value) for m in curve] == [(0, 0.5)]
    assert not any(k.startswith("accept_rate_pos_") for k in run.data.metrics)
    assert run.data.tags["mlflow.source.name"] == "bisect-eagle" and run.data.tags["mlflow.user"]
    assert "topk == 1 forces num_draft_tokens" in run.data.tags["warnings"]
    texts = [
        tracking.read_text(record.run_id, name) for name in ("trial.json", "launch_command.txt")
    ]
    everything = json.dumps([run.data.params, run.data.tags, texts])
    assert SECRET not in everything and is_hidden(run.data.params["env.HF_TOKEN"])
    assert "<redacted>" in texts[1]
    cached = find_cached(tracking, plan.fingerprint, parent_run_id=parent)
    assert (
        cached is not None
        and cached.run_id == record.run_id
        and cached.value == 50.0
        and cached.cached
    )


def test_interrupted_runs_are_not_reused_as_cache(tracking):
    parent = tracking.start_run("study-interrupted", tags={"role": "study"})
    fp = EchoEngine().plan(LiveSettings(num_steps=5)).fingerprint
    run = tracking.start_run(
        "x",
        tags={"stage": "live", "fingerprint": fp, "outcome": "interrupted"},
        parent_run_id=parent,
    )
    tracking.finish(run, "FAILED")
    assert find_cached(tracking, fp, parent_run_id=parent) is None


def test_run_guard_leaves_a_run_alone_when_nothing_goes_wrong(tracking):
    run_id = tracking.start_run("fine", tags={})
    with tracking.run_guard(run_id):
        pass
    assert tracking.get_run(run_id).info.status == "RUNNING"


def test_a_run_starts_with_its_metrics_and_ends_with_its_result_in_one_call_each(tracking):
    run_id = tracking.start_run("r", tags={}, params={"a": "1"}, metrics={"predicted": 2.0})
    tracking.end_run(
        run_id,
        RunEnd(
            status="FAILED",
            texts={"x.txt": "hello"},
            metrics={"m": 1.0},
            tags={"outcome": "failed"},
            curves={"acc": [0.9, 0.5]},
            name_suffix=" [failed: oom]",
        ),
    )
    run = tracking.get_run(run_id)
    assert run.data.params == {"a": "1"}
    assert run.data.metrics == {"predicted": 2.0, "m": 1.0, "acc": 0.5}
    assert run.data.tags["outcome"] == "failed" and run.info.run_name == "r [failed: oom]"
    assert run.info.status == "FAILED" and tracking.read_text(run_id, "x.txt") == "hello"
    assert [m.step for m in tracking.client.get_metric_history(run_id, "acc")] == [0, 1]


def test_a_trial_run_is_one_block_started_guarded_and_ended_with_what_the_block_set(tracking):
    parent = tracking.start_run("study", tags={})
    with tracking.trial_run(
        "live 001",
        tags={"stage": "live", "fingerprint": "fp1"},
        settings={"num_steps": 4, "env": {"NCCL_ALGO": "Ring"}},
        requested={"num_steps": None, "env": {"NCCL_ALGO": "Ring"}},
        parent_run_id=parent,
        metrics={"predicted": 3.0},
    ) as run:
        assert tracking.get_run(run.run_id).info.status == "RUNNING" and run.reused is None
        run.end = RunEnd(status="FINISHED", tags={"outcome": "ok"}, metrics={"m": 1.0})
    done = tracking.get_run(run.run_id)
    assert done.info.status == "FINISHED" and done.data.metrics == {"predicted": 3.0, "m": 1.0}
    # the requested value beside the effective one only where they differ
    assert done.data.params == {
        "num_steps": "4",
        "env.NCCL_ALGO": "Ring",
        "requested.num_steps": "None",
    }
    # reused: the finished run of the fingerprint is given, nothing starts
    with tracking.trial_run(
        "live 002", tags={}, settings={}, requested={}, parent_run_id=parent, reuse="fp1"
    ) as again:
        assert again.reused.info.run_id == run.run_id and again.run_id == ""
    assert len(tracking.child_runs(parent)) == 1


def test_a_trial_run_whose_result_cannot_be_written_ends_failed_not_running(tracking, monkeypatch):
    parent = tracking.start_run("study", tags={})

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tracking, "log_texts", full)
    with (
        pytest.raises(OSError),
        tracking.trial_run(
            "live 001", tags={}, settings={}, requested={}, parent_run_id=parent
        ) as run,
    ):
        run.end = RunEnd(status="FINISHED", texts={"trial.json": "{}"})
    ended = tracking.get_run(run.run_id)
    assert ended.info.status == "FAILED" and ended.data.tags["outcome"] == "error"


@pytest.mark.parametrize(
    ("exc", "status", "outcome"),
    [
        (KeyboardInterrupt(), "KILLED", "interrupted"),
        # SIGTERM, once sigterm_as_exit turned it into SystemExit
        (SystemExit(143), "KILLED", "interrupted"),
        (RuntimeError("engine bug"), "FAILED", "error"),
    ],
)
def test_run_guard_ends_the_run_and_reraises(tracking, exc, status, outcome):
    run_id = tracking.start_run("guarded", tags={})
    with pytest.raises(type(exc)), tracking.run_guard(run_id, detail_tag="stop_reason"):
        raise exc
    run = tracking.get_run(run_id)
    assert run.info.status == status and run.data.tags["outcome"] == outcome
    assert run.data.tags["stop_reason"].startswith(type(exc).__name__)
    assert "failure_class" not in run.data.tags


def test_run_guard_classifies_known_failures_and_scrubs_secrets(tracking, monkeypatch):
    monkeypatch.setenv("MY_API_KEY", SECRET)
    run_id = tracking.start_run("bad-args", tags={})
    with (
        pytest.raises(BadInput),
        tracking.run_guard(run_id, failure_classes={BadInput: "bad_arguments"}),
    ):
        raise BadInput(f"--api-key {SECRET} is not a flag of this SGLang")
    tags = tracking.get_run(run_id).data.tags
    assert tags["failure_class"] == "bad_arguments" and tags["outcome"] == "error"
    assert tags["failure_detail"] == "--api-key <redacted> is not a flag of this SGLang"
    run_id = tracking.start_run("custom-scrub", tags={})
    with (
        pytest.raises(ValueError),
        tracking.run_guard(run_id, scrub=lambda text: text.replace("x7q", "***")),
    ):
        raise ValueError("token x7q")
    assert tracking.get_run(run_id).data.tags["failure_detail"] == "ValueError: token ***"


def test_run_guard_reraises_the_original_error_when_the_store_fails_too(tracking):
    with pytest.raises(RuntimeError, match="original"), tracking.run_guard("no-such-run-id"):
        raise RuntimeError("original")


def test_owner_liveness():
    assert owner_alive(owner_id()) is True
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    assert owner_alive(f"{socket.gethostname()}:{dead.stdout.strip()}:0") is False
    assert owner_alive(f"elsewhere-{socket.gethostname()}:{os.getpid()}:0") is None


def test_environment_info_names_versions(tracking):
    from bisect_eagle.tracking.provenance import environment_info

    info = environment_info()
    for key in (
        "version.torch",
        "version.transformers",
        "version.optuna",
        "version.mlflow",
        "git_sha",
        "host",
        "gpus",
    ):
        assert info[key]
    assert Path(tracking.uri[len("sqlite:///") :]).exists()


class FailingEngine(EchoEngine):
    def run(self, plan: TrialPlan) -> TrialResult:
        from bisect_eagle.engines.base import failed

        return failed(
            self.name,
            requested=plan.requested,
            effective=plan.effective,
            cls="out_of_memory",
            detail="CUDA out of memory",
        )


def test_a_failed_trial_keeps_its_class_in_its_name_and_tags(tracking):
    parent = tracking.start_run("study-failed", tags={"role": "study"})
    ctx = TrialContext(Spec(name="unit"), tracking, "s", parent, engine=FailingEngine())
    record = run_live_trial(
        ctx, ctx.plan(LiveSettings(num_steps=2)), stage="live", parent_run_id=parent, number=3
    )
    run = tracking.get_run(record.run_id)
    assert run.info.status == "FAILED" and run.data.tags["failure_class"] == "out_of_memory"
    assert run.info.run_name == "live 003 ids=1,5,9 steps=2 topk=1 [failed: out_of_memory]"


def test_curves_datasets_and_experiment_description(tmp_path):
    t = Tracking.open(
        f"sqlite:///{tmp_path}/mlflow.db", "described", description="what these runs are"
    )
    assert (
        t.client.get_experiment(t.experiment_id).tags["mlflow.note.content"]
        == "what these runs are"
    )
    run_id = t.start_run("r", tags={})
    t.log_curve(run_id, "acc", values=[0.9, float("nan"), 0.5])
    assert [(m.step, m.value) for m in t.client.get_metric_history(run_id, "acc")] == [
        (0, 0.9),
        (2, 0.5),
    ]
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "config.json").write_text("{}")
    t.log_datasets(
        run_id, {"draft": tmp_path / "draft", "prompts": tmp_path / "draft" / "config.json"}
    )
    inputs = t.get_run(run_id).inputs.dataset_inputs
    assert sorted(i.dataset.name for i in inputs) == ["draft", "prompts"]
    assert {i.tags[0].value for i in inputs} == {"draft", "prompts"}
    assert str((tmp_path / "draft").resolve()) in {
        json.loads(i.dataset.source)["uri"] for i in inputs
    }


def test_stage1_artifacts_carry_the_gate_decision(tracking):
    from bisect_eagle.search.gate import apply_gate, record_gate
    from bisect_eagle.trials.standalone import Verdict

    verdicts = []
    for label, acc in (("right", 0.9), ("close", 0.88), ("wrong", 0.5)):
        v = Verdict(
            label, [1], "[0]", "dump", acc, 2.0, [{"full_vocab": acc, "draft_vocab": acc}], 10
        )
        v.run_id = tracking.start_run(f"standalone {label}", tags={"stage": "standalone"})
        verdicts.append(v)
    ref = apply_gate(verdicts, margin=0.03, reference=None)
    record_gate(tracking, verdicts, reference=ref, margin=0.03)
    for v, passed in zip(verdicts, (True, True, False), strict=True):
        body = json.loads(tracking.read_text(v.run_id, "standalone.json"))
        run = tracking.get_run(v.run_id)
        assert body["passed"] is passed and json.loads(run.data.tags["verdict"])["passed"] is passed
        assert run.data.tags["gate"] == ("pass" if passed else "reject")
        assert (
            run.data.metrics["gate_threshold"] == pytest.approx(v.threshold)
            and body["gate"]["reference"] == 0.9
        )
        assert run.data.metrics["gate_distance"] == pytest.approx(v.accuracy - v.threshold)


def new_monitor_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """MLflow's system-metrics threads started since ``before`` (other tests' open runs keep
    theirs)."""
    return [t for t in set(threading.enumerate()) - before if t.name == "SystemMetricsMonitor"]


@pytest.fixture
def system_metrics_on(monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "true")


def test_a_live_trial_of_the_local_engine_carries_system_metrics_when_asked(
    tracking, tiny, system_metrics_on
):
    """MLflow's own system metrics, sampled while the trial runs and stopped with its run (no thread
    left)."""
    from bisect_eagle.engines.local import LocalEngine

    parent = tracking.start_run("study-system-metrics", tags={"role": "study"})
    before = set(threading.enumerate())
    settings = LiveSettings(
        device="cpu", num_steps=2, num_prompts=1, warmup_prompts=0, max_new_tokens=8
    )
    with LocalEngine(tiny.target, tiny.draft, tiny.prompts) as engine:
        ctx = TrialContext(Spec(name="unit"), tracking, "s", parent, engine=engine)
        record = run_live_trial(ctx, ctx.plan(settings), stage="live", parent_run_id=parent)
    run = tracking.get_run(record.run_id)
    assert record.status == "ok" and run.info.status == "FINISHED"
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= set(
        run.data.metrics
    )
    assert record.run_id not in tracking.system_metrics.running()
    assert not new_monitor_threads(before)
    # the study run: none
    assert not any(k.startswith("system/") for k in tracking.get_run(parent).data.metrics)


def test_system_metrics_go_to_their_own_run_and_stop_with_it(tracking, system_metrics_on):
    before = set(threading.enumerate())
    a = tracking.start_run("a", tags={"stage": "baseline"})
    b = tracking.start_run("b", tags={"stage": "confirm"})
    plain = tracking.start_run("s", tags={"stage": "standalone"})
    assert {a, b} <= set(
        tracking.system_metrics.running()
    ) and plain not in tracking.system_metrics.running()
    assert len(new_monitor_threads(before)) == 2
    tracking.finish(b, "FINISHED")  # b ends while a goes on
    assert a in tracking.system_metrics.running() and b not in tracking.system_metrics.running()
    assert len(new_monitor_threads(before)) == 1
    tracking.finish(a, "FINISHED")
    tracking.finish(plain, "FINISHED")
    assert not new_monitor_threads(before)
    for run_id in (a, b):  # shorter than the sampling interval: still one sample, taken at the end
        samples = tracking.client.get_metric_history(run_id, "system/cpu_utilization_percentage")
        assert samples and [m.step for m in samples] == list(range(len(samples)))
    assert not any(k.startswith("system/") for k in tracking.get_run(plain).data.metrics)


def test_an_interrupted_trial_stops_its_system_metrics(tracking, system_metrics_on):
    before = set(threading.enumerate())
    run_id = tracking.start_run("interrupted", tags={"stage": "live"})
    with pytest.raises(KeyboardInterrupt), tracking.run_guard(run_id):
        raise KeyboardInterrupt
    run = tracking.get_run(run_id)
    assert (
        run.info.status == "KILLED" and "system/system_memory_usage_percentage" in run.data.metrics
    )
    assert not new_monitor_threads(before) and run_id not in tracking.system_metrics.running()


@pytest.mark.parametrize("switch", [None, "false"])
def test_system_metrics_are_off_unless_mlflows_switch_asks_for_them(tracking, monkeypatch, switch):
    """Off by default, as in MLflow: its run page would list them before the trial's own metrics."""
    if switch is None:
        monkeypatch.delenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", raising=False)
    else:
        monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", switch)
    before = set(threading.enumerate())
    run_id = tracking.start_run("off", tags={"stage": "live"})
    assert run_id not in tracking.system_metrics.running() and not new_monitor_threads(before)
    tracking.finish(run_id, "FINISHED")
    assert not any(k.startswith("system/") for k in tracking.get_run(run_id).data.metrics)


def _runs_with_ids(
    monkeypatch, tracking: Tracking, ids: list[str], *, experiment: str | None = None
) -> list[str]:
    """Runs created with these exact ids (MLflow's own id generator patched), in ``experiment`` when
    given."""
    import types

    from mlflow.store.tracking import sqlalchemy_store

    queue = list(ids)
    monkeypatch.setattr(
        sqlalchemy_store,
        "uuid",
        types.SimpleNamespace(uuid4=lambda: types.SimpleNamespace(hex=queue.pop(0))),
    )
    target = Tracking.open(tracking.uri, experiment) if experiment else tracking
    made = [target.start_run(f"r{i}", tags={"role": "unit"}) for i in range(len(ids))]
    monkeypatch.undo()
    return made


def test_a_unique_prefix_of_six_or_more_characters_names_its_run_in_any_experiment(
    tracking, monkeypatch
):
    a, b = _runs_with_ids(
        monkeypatch, tracking, ["c0ffee01" + "0" * 24, "c0ffee02" + "1" * 24], experiment="other"
    )
    for text in ("c0ffee01", "C0FFEE01", "c0ffee0211", b):
        store, run = Tracking.of_run(tracking.uri, text)
        assert run.info.run_id == (a if text.lower().startswith("c0ffee01") else b)
        assert store.experiment_id == run.info.experiment_id != tracking.experiment_id


def test_an_ambiguous_prefix_names_its_candidates_in_one_line(tracking, monkeypatch):
    a, b = _runs_with_ids(monkeypatch, tracking, ["facade11" + "2" * 24, "facade19" + "3" * 24])
    with pytest.raises(BadInput) as e:
        Tracking.of_run(tracking.uri, "facade1")
    text = str(e.value)
    assert "\n" not in text and "ambiguous" in text and "2 runs" in text
    assert a[:9] in text and b[:9] in text


@pytest.mark.parametrize(
    "text, says",
    [
        ("abc12", "at least 6"),
        ("zzzzzzzz", "at least 6"),
        ("0123456789", "not found"),
        ("f" * 32, "not found"),
    ],
)
def test_a_short_foreign_or_unknown_run_id_is_one_line(tracking, text, says):
    with pytest.raises(BadInput) as e:
        Tracking.of_run(tracking.uri, text)
    assert says in str(e.value) and "\n" not in str(e.value)
