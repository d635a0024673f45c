"""Report, the model's side: predicted-vs-measured plot, the adaptive reference, best per
concurrency, and what the report says when the study carries no prediction. Studies fabricated in a
temporary MLflow store with the metrics and ``model.json`` the search logs."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from bisect_eagle.report import study as report
from bisect_eagle.report.model import adaptive_lines, model_error, prediction_points, read_artifact
from bisect_eagle.report.study import find_parent, trials_frame, write_report
from bisect_eagle.tracking.runs import Tracking

SPEC = """\
name: fabricated
scenario: tiny
criterion: {ratio: 1.5}
space:
  num_steps: {type: int, low: 1, high: 3}
"""
# what MLflow's system-metrics monitor adds to a run
SYSTEM_METRIC = "system/cpu_utilization_percentage"
# (name, params, metrics, outcome): t1 ran before the model could predict; t6 failed (no
# measurement); t2 carries a system metric
TRIALS = [
    ("t1", {"num_steps": "1", "concurrency": "1"}, {"output_tok_s": 110.0}, "ok"),
    (
        "t2",
        {"num_steps": "2", "concurrency": "1"},
        {
            "output_tok_s": 130.0,
            "predicted_output_tok_s": 125.0,
            "predicted_output_tok_s_low": 115.0,
            "predicted_output_tok_s_high": 135.0,
            SYSTEM_METRIC: 37.5,
        },
        "ok",
    ),
    (
        "t3",
        {"num_steps": "3", "concurrency": "1"},
        {
            "output_tok_s": 160.0,
            "predicted_output_tok_s": 150.0,
            "predicted_output_tok_s_low": 140.0,
            "predicted_output_tok_s_high": 155.0,
        },
        "ok",
    ),
    (
        "t4",
        {"num_steps": "3", "concurrency": "4"},
        {
            "output_tok_s": 300.0,
            "predicted_output_tok_s": 330.0,
            "predicted_output_tok_s_low": 290.0,
            "predicted_output_tok_s_high": 360.0,
        },
        "ok",
    ),
    (
        "t5",
        {"num_steps": "3", "concurrency": "1", "speculative_adaptive": "True"},
        {
            "output_tok_s": 145.0,
            "predicted_output_tok_s": 140.0,
            "predicted_output_tok_s_low": 125.0,
            "predicted_output_tok_s_high": 155.0,
        },
        "ok",
    ),
    (
        "t6",
        {"num_steps": "2", "concurrency": "4"},
        {
            "predicted_output_tok_s": 250.0,
            "predicted_output_tok_s_low": 200.0,
            "predicted_output_tok_s_high": 300.0,
        },
        "failed",
    ),
]
MODEL_JSON = {
    "error": {
        "n": 4,
        "median_rel_error": 0.05,
        "mean_rel_error": 0.06,
        "p90_rel_error": 0.09,
        "coverage": 0.75,
    },
    "skipped": [
        {
            "params": {"num_steps": 1, "concurrency": 4},
            "predicted_output_tok_s": 90.0,
            "high": 120.0,
        }
    ],
    "adaptive": {
        "params": {"num_steps": 3, "concurrency": 1},
        "predicted_output_tok_s": 140.0,
        "low": 125.0,
        "high": 155.0,
    },
    "per_concurrency": [
        {
            "concurrency": 4,
            "best_params": {"num_steps": 2, "topk": 1},
            "predicted_output_tok_s": 340.0,
            "low": 300.0,
            "high": 380.0,
            "baseline_predicted_output_tok_s": 280.0,
            "measured_run_id": None,
        },
        {
            "concurrency": 1,
            "best_params": {"num_steps": 3, "topk": 1},
            "predicted_output_tok_s": 150.0,
            "low": 140.0,
            "high": 155.0,
            "baseline_predicted_output_tok_s": 100.0,
            "measured_run_id": "RUN-OF-T3",
        },
    ],
}


def _study(
    tracking: Tracking, name: str, *, metrics: dict, trials: list, artifact: str | None
) -> dict[str, str]:
    """A finished parent run of study ``name`` with a baseline and ``trials``; returns run ids by
    trial name."""
    pid = tracking.start_run(
        name, tags={"role": "study", "study": name}, params={"criterion.metric": "output_tok_s"}
    )
    tracking.log(
        pid,
        metrics={"baseline_output_tok_s": 100.0, "target_output_tok_s": 150.0, **metrics},
        tags={"outcome": "target reached", "verdict": "reached"},
    )
    ids = {}
    for trial, params, values, outcome in [
        ("baseline", {"concurrency": "1"}, {"output_tok_s": 100.0}, "ok"),
        *trials,
    ]:
        stage = "baseline" if trial == "baseline" else "live"
        rid = tracking.start_run(
            trial, tags={"stage": stage, "outcome": outcome}, params=params, parent_run_id=pid
        )
        tracking.log(rid, metrics=values)
        tracking.finish(rid, "FINISHED" if outcome == "ok" else "FAILED")
        ids[trial] = rid
    if artifact is not None:
        tracking.log_texts(pid, {"model.json": artifact.replace("RUN-OF-T3", ids.get("t3", ""))})
    tracking.finish(pid, "FINISHED")
    return ids


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("report_model")
    (root / "spec.yaml").write_text(SPEC)
    uri = f"sqlite:///{root}/mlflow.db"
    tracking = Tracking.open(uri, "fabricated")
    model = {
        "model_median_rel_error": 0.05,
        "model_coverage": 0.75,
        "model_predictions": 4.0,
        "model_skipped": 12.0,
        "predicted_adaptive_output_tok_s": 140.0,
        "predicted_adaptive_output_tok_s_low": 125.0,
        "predicted_adaptive_output_tok_s_high": 155.0,
    }
    ids = _study(
        tracking, "with-model", metrics=model, trials=TRIALS, artifact=json.dumps(MODEL_JSON)
    )
    plain = [(n, p, {"output_tok_s": v["output_tok_s"]}, o) for n, p, v, o in TRIALS[:3]]
    _study(tracking, "no-model", metrics={}, trials=plain, artifact=None)
    _study(
        tracking,
        "model-no-prediction",
        metrics={"model_predictions": 0.0},
        trials=plain,
        artifact=None,
    )
    _study(tracking, "bad-artifact", metrics={}, trials=plain[:1], artifact="{not json")
    return root, uri, tracking, ids


@pytest.fixture
def figures(monkeypatch):
    """The figures the report draws, by title, kept open to read back what was passed to
    matplotlib."""
    drawn = {}
    real = report.pyplot

    class Keep:
        def __init__(self, plt):
            self.plt = plt

        def __getattr__(self, name):
            return getattr(self.plt, name)

        def close(self, fig):
            drawn[fig._suptitle.get_text()] = fig

    monkeypatch.setattr(report, "pyplot", lambda: Keep(real()))
    yield drawn
    for fig in drawn.values():
        real().close(fig)


def test_points_are_the_predicted_trials_that_were_measured(store):
    _, _, tracking, ids = store
    frame = trials_frame(tracking, find_parent(tracking, "with-model").info.run_id)
    points = prediction_points(frame)
    # not t1, not failed t6
    assert sorted(points["run_id"]) == sorted(ids[t] for t in ("t2", "t3", "t4", "t5"))
    inside = dict(zip(points["run_id"], points["inside"], strict=True))
    assert not inside[ids["t3"]] and inside[ids["t2"]] and inside[ids["t4"]]
    error = model_error(points)
    assert (error.n, error.inside) == (4, 3)
    # of 3.4 %, 3.8 %, 6.2 %, 10 %
    assert error.median_rel_error == pytest.approx((5 / 130 + 10 / 160) / 2)


def test_a_pruned_trial_counts_its_measurement_as_the_search_does():
    frame = pd.DataFrame(
        {
            "run_id": ["a", "b", "c"],
            "stage": ["live", "live", "baseline"],
            "outcome": ["pruned", "ok", "ok"],
            "output_tok_s": [80.0, 120.0, 100.0],
            "predicted_output_tok_s": [100.0, 120.0, 100.0],
            "predicted_output_tok_s_low": [90.0, 110.0, 90.0],
            "predicted_output_tok_s_high": [110.0, 130.0, 110.0],
        }
    )
    points = prediction_points(frame)
    assert list(points["run_id"]) == ["a", "b"] and list(points["inside"]) == [False, True]
    assert list(points["rel_error"]) == [0.25, 0.0]


def test_report_plots_predicted_against_measured_and_the_adaptive_reference(store, figures):
    root, _, tracking, _ = store
    parent = find_parent(tracking, "with-model")
    rep = write_report(tracking, parent, out=root / "with-model")
    names = {f.name for f in rep.files}
    assert (
        "predicted_vs_measured_output_tok_s.png" in names
        and "output_tok_s_per_setting.png" in names
    )
    png = root / "with-model" / "predicted_vs_measured_output_tok_s.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    logged = {a.path for a in tracking.client.list_artifacts(parent.info.run_id, "report")}
    assert "report/predicted_vs_measured_output_tok_s.png" in logged
    title = "predicted vs measured: median error 5.0 %, 3/4 inside the 80 % interval"
    ax = figures[title].axes[0]
    xs = sorted(x for c in ax.containers for x in c.lines[0].get_xdata())
    assert xs == [130.0, 145.0, 160.0, 300.0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {
        "target 150",
        "predicted = measured",
        "inside the 80 % interval (3)",
        "outside the 80 % interval (1)",
    } <= set(legend)
    tok_s = figures["output_tok_s per setting (live trials that finished ok)"].axes[0]
    legend = {t.get_text() for t in tok_s.get_legend().get_texts()}
    assert {
        "SGLang adaptive (predicted) 140.0",
        "SGLang adaptive (measured) 145.0",
        "target 150.0",
        "adaptive predicted 80 % interval",
    } <= legend
    lines, band = adaptive_lines(rep.model.adaptive)
    assert lines == {"SGLang adaptive (predicted)": 140.0, "SGLang adaptive (measured)": 145.0}
    assert band == ("adaptive predicted 80 % interval", 125.0, 155.0)


def test_report_command_states_the_model_adaptive_and_concurrency(store, monkeypatch):
    from bisect_eagle.cli import app

    root, uri, _, ids = store
    monkeypatch.setenv("COLUMNS", "80")
    done = CliRunner().invoke(
        app,
        [
            "report",
            str(root / "spec.yaml"),
            "--tracking-uri",
            uri,
            "--study-name",
            "with-model",
            "--out",
            str(root / "cli"),
        ],
    )
    assert done.exit_code == 0, done.output
    assert max(len(line) for line in done.output.splitlines()) <= 80 and "…" not in done.output
    text = " ".join(done.output.split())
    assert (
        "model: median error 5.0 % over 4 trials, 3/4 inside the 80 % interval; 12 configs skipped "
        "as predicted below the target"
    ) in text
    assert (
        "SGLang adaptive (--speculative-adaptive) on the best config: predicted 140.0 tok/s (80 % "
        "interval "
        # at concurrency 1, not 300
        "125.0 to 155.0); the best measured config (160.0) beats it"
    ) in text
    assert f"SGLang adaptive measured: 145.0 tok/s (run {ids['t5'][:8]})" in text
    predicted = text.split("best config per concurrency (predicted by the model): ")[1]
    assert predicted.startswith(
        "concurrency 1: 150.0 tok/s (80 %: 140.0 to 155.0), 1.50× baseline 100.0; steps=3; "
        f"measured in run {ids['t3'][:8]} concurrency 4: 340.0 tok/s (80 %: 300.0 to 380.0), 1.21× "
        "baseline 280.0; steps=2; not measured deploy a measured config (the best above: "
        "bisect-eagle export); a predicted one that was not measured is one to measure next"
    )
    assert (
        f"best measured per concurrency: concurrency 1: 160.0 tok/s, run {ids['t3'][:8]}; steps=3 "
        f"concurrency 4: 300.0 tok/s, run {ids['t4'][:8]}; steps=3"
    ) in text
    assert "predicted_vs_measured_output_tok_s.png" in text
    done = CliRunner().invoke(
        app,
        [
            "report",
            str(root / "spec.yaml"),
            "--tracking-uri",
            uri,
            "--json",
            "--study-name",
            "with-model",
            "--out",
            str(root / "cli"),
        ],
    )
    body = json.loads(done.stdout)
    assert not any(k.startswith("system/") for trial in body["trials"] for k in trial)
    model = body["model"]
    assert model["error"] == {
        "n": 4,
        "inside": 3,
        "median_rel_error": pytest.approx((5 / 130 + 10 / 160) / 2),
    }
    assert (
        len(model["points"]) == 4
        and model["skipped"] == 12
        and model["artifact"] == json.loads(json.dumps(MODEL_JSON).replace("RUN-OF-T3", ids["t3"]))
    )


@pytest.mark.parametrize(
    "study, said",
    [
        (
            "model-no-prediction",
            ["model: no live trial carries a prediction (no predicted-vs-measured plot)"],
        ),
        (
            "no-model",
            [],
        ),  # search.model.enabled: false: nothing to say about a model that never ran
    ],
)
def test_no_prediction_means_no_plot_and_one_line_when_the_model_was_on(
    store, monkeypatch, study, said
):
    from bisect_eagle.cli import app

    root, uri, tracking, _ = store
    rep = write_report(tracking, find_parent(tracking, study), out=root / study)
    assert "predicted_vs_measured_output_tok_s.png" not in {f.name for f in rep.files}
    assert not (root / study / "predicted_vs_measured_output_tok_s.png").exists()
    assert rep.model.error is None and rep.model.adaptive is None and rep.model.artifact is None
    monkeypatch.setenv("COLUMNS", "80")
    done = CliRunner().invoke(
        app,
        [
            "report",
            str(root / "spec.yaml"),
            "--tracking-uri",
            uri,
            "--study-name",
            study,
            "--out",
            str(root / f"cli-{study}"),
        ],
    )
    assert done.exit_code == 0 and done.exception is None, done.output
    model = [line for line in done.output.splitlines() if line.startswith("model:")]
    assert model == said
    assert "adaptive" not in done.output and "per concurrency" not in done.output


def test_system_metrics_are_not_trial_columns(store):
    _, _, tracking, ids = store
    run = tracking.client.get_run(ids["t2"])
    assert SYSTEM_METRIC in run.data.metrics  # logged, as the monitor logs it
    frame = trials_frame(tracking, find_parent(tracking, "with-model").info.run_id)
    assert SYSTEM_METRIC not in frame.columns and not any(
        c.startswith("system/") for c in frame.columns
    )
    assert frame.set_index("run_id").loc[ids["t2"], "output_tok_s"] == 130.0


def test_an_unreadable_model_json_is_named_not_raised(store):
    _, _, tracking, _ = store
    parent = find_parent(tracking, "bad-artifact")
    body, why = read_artifact(tracking, parent.info.run_id)
    assert body is None and why.startswith("model.json of the study's run is not JSON")
    assert read_artifact(tracking, find_parent(tracking, "no-model").info.run_id) == (None, None)


def test_the_models_counts_are_worded_in_the_right_number():
    from bisect_eagle.cli.report import model_lines
    from bisect_eagle.report.model import ModelError, ModelView
    from bisect_eagle.report.study import Report

    def lines(n: int, skipped: int | None) -> str:
        view = ModelView(
            points=pd.DataFrame(),
            error=ModelError(n=n, inside=n, median_rel_error=0.05),
            artifact=None,
            adaptive=None,
            skipped=skipped,
            notes=[],
        )
        return " ".join(
            " ".join(
                model_lines(Report(pd.DataFrame(), None, [], "output_tok_s", view), settings=[])
            ).split()
        )  # wrapped at 80 columns

    assert lines(1, 0) == (
        "model: median error 5.0 % over 1 trial, 1/1 inside the 80 % interval; 0 configs skipped "
        "as predicted below the target"
    )
    assert lines(2, 1).endswith(
        "over 2 trials, 2/2 inside the 80 % interval; 1 config skipped as predicted below the "
        "target"
    )
