"""Report: the trials table, the best config and PNG plots per setting, also logged to the parent
run."""

from __future__ import annotations

import re

import optuna
import pandas as pd
import pytest

from bisect_eagle.report.study import (
    best_row,
    find_parent,
    trials_frame,
    varying_settings,
    write_report,
)
from bisect_eagle.search.study import Options, run_study
from bisect_eagle.spec.load import load_spec
from bisect_eagle.tracking.runs import Tracking

from helpers import load_fake_engine

# The model off: a blind grid runs all 6 configs although the target (10x) is out of reach.
SPEC = """\
name: report
scenario: tiny
criterion: {ratio: 10.0}
space:
  eagle_aux_hidden_state_layer_ids: {type: categorical, choices: [[1, 5, 9], [5, 9, 11]]}
  num_steps: {type: int, low: 1, high: 3}
search: {sampler: grid, max_live_trials: 6, model: {enabled: false}}
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    (root / "spec.yaml").write_text(SPEC)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    engine = load_fake_engine()(crash_steps=(2,))
    opts = Options(
        storage=f"sqlite:///{root}/optuna.db", tracking_uri=f"sqlite:///{root}/mlflow.db"
    )
    out = run_study(load_spec(root / "spec.yaml"), options=opts, engine_factory=lambda s: engine)
    return root, out


def test_table_best_and_plots(study):
    root, out = study
    tracking = Tracking.open(out.tracking_uri, "report")
    parent = find_parent(tracking)
    assert parent.info.run_id == out.parent_run_id
    frame = trials_frame(tracking, out.parent_run_id)
    assert sorted(frame["stage"].unique()) == ["baseline", "live"]
    assert len(frame[frame["stage"] == "live"]) == 6
    live_ok = frame[(frame["stage"] == "live") & (frame["outcome"] == "ok")]
    assert set(varying_settings(live_ok)) >= {"eagle_aux_hidden_state_layer_ids", "num_steps"}
    best = best_row(frame, "output_tok_s")
    assert best["eagle_aux_hidden_state_layer_ids"] == "[1, 5, 9]" and best["num_steps"] == "3"
    assert best["run_id"] == out.best["run_id"]
    rep = write_report(tracking, parent, out=root / "out")
    names = sorted(f.name for f in rep.files)
    assert names == [
        "accept_length_per_setting.png",
        "best.json",
        "output_tok_s_per_setting.png",
        "trials.csv",
    ]
    assert "report/output_tok_s_per_setting.png" in {  # the study logged its plots when it finished
        a.path for a in tracking.client.list_artifacts(out.parent_run_id, "report")
    }
    for f in rep.files:
        if f.suffix == ".png":
            assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f.stat().st_size > 5000
    logged = {a.path for a in tracking.client.list_artifacts(out.parent_run_id, "report")}
    assert "report/output_tok_s_per_setting.png" in logged and "report/trials.csv" in logged


def test_failed_trials_are_rows_with_their_class(study):
    _, out = study
    frame = trials_frame(Tracking.open(out.tracking_uri, "report"), out.parent_run_id)
    failed = frame[frame["status"] == "FAILED"]
    assert len(failed) == 2 and set(failed["failure_class"]) == {"crash_during_benchmark"}


def test_the_parent_run_is_the_answer(study):
    _, out = study
    tracking = Tracking.open(out.tracking_uri, "report")
    parent = tracking.get_run(out.parent_run_id)
    m = parent.data.metrics
    assert (
        m["best_output_tok_s"] == out.best["value"] and m["baseline_output_tok_s"] == out.baseline
    )
    assert m["target_output_tok_s"] == out.target
    assert m["best_output_tok_s_ratio_to_baseline"] == pytest.approx(
        out.best["value"] / out.baseline
    )
    note = parent.data.tags["mlflow.note.content"]
    assert (
        note.startswith("**Target not reached: best output tok/s")
        and note.count("target not reached") == 0
    )
    assert (
        parent.data.tags["verdict"] == out.verdict
        and note.count(out.verdict[len("target not reached") :]) == 1
    )
    assert f"(#/experiments/{out.experiment_id}/runs/{out.best['run_id']})" in note
    assert f"bisect-eagle export {out.best['run_id'][:8]} --tracking-uri" in note
    assert "| num_steps | `3` |" in note
    inputs = {i.dataset.name for i in parent.inputs.dataset_inputs}
    assert inputs == {"target", "draft", "dump", "prompts"}
    assert (
        parent.data.tags["mlflow.source.name"] == "bisect-eagle"
        and "mlflow.user" in parent.data.tags
    )
    experiment = tracking.client.get_experiment(out.experiment_id)
    assert "bisect-eagle studies of spec `spec.yaml`" in experiment.tags["mlflow.note.content"]
    for child in tracking.child_runs(out.parent_run_id):
        assert child.data.tags["target"] == parent.data.tags["target"]


def test_num_draft_tokens_is_not_a_panel_when_num_steps_decides_it():
    frame = pd.DataFrame(
        {
            "num_steps": ["1", "2", "3", "2"],
            "num_draft_tokens": ["2", "3", "4", "3"],
            "topk": ["1", "1", "1", "1"],
            "ids": ["[1]", "[1]", "[2]", "[2]"],
            "accept_length": [1.0, 2.0, 3.0, 2.5],
        }
    )
    assert varying_settings(frame) == ["num_steps", "ids"]


def test_report_command_fits_80_columns(study, monkeypatch):
    from typer.testing import CliRunner

    from bisect_eagle.cli import app

    root, out = study
    monkeypatch.setenv("COLUMNS", "80")
    done = CliRunner().invoke(
        app,
        [
            "report",
            str(root / "spec.yaml"),
            "--tracking-uri",
            out.tracking_uri,
            "--out",
            str(root / "cli"),
        ],
    )
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in done.output
    text = " ".join(done.output.split())
    # said once
    assert text.count(out.verdict) == 1 and len(re.findall(r"\btarget (not )?reached\b", text)) == 1
    assert (
        out.verdict.startswith("target not reached: best output tok/s ")
        and "target ≥ " in out.verdict
    )
    assert out.speed_text and out.speed_text in text  # tok/s against the baseline's
    (best,) = [t for t in out.trials if t["run_id"] == out.best["run_id"] and not t["duplicate"]]
    assert f"best: live {best['number']:03d} (run {out.best['run_id'][:8]})" in done.output
    # search.model.enabled: false, nothing to say
    assert not any(line.startswith("model:") for line in lines)
    assert not any(
        len(x) > 8 for line in lines for x in line.split() if x.replace(".", "").isdigit()
    )


def test_a_single_trial_is_drawn_as_a_point_with_its_lines(tmp_path):
    """No setting varied (one trial): the plot still shows the measurement, not an empty panel."""
    from matplotlib.image import imread

    from bisect_eagle.report.study import plot_per_setting

    live = pd.DataFrame({"run_id": ["7ca37e03aa"], "accept_length": [2.5]})
    drawn = imread(
        plot_per_setting(
            live, "accept_length", settings=[], out=tmp_path, lines={"baseline": 1.0, "target": 3.0}
        )
    )
    point = (
        (abs(drawn[..., 0] - 0x08 / 255) < 0.05)
        & (abs(drawn[..., 1] - 0x51 / 255) < 0.05)
        & (abs(drawn[..., 2] - 0x9C / 255) < 0.05)
    )
    assert point.sum() > 20  # the trial's marker
    red = (drawn[..., 0] > 0.75) & (drawn[..., 1] < 0.3) & (drawn[..., 2] < 0.3)
    assert red.sum() > 50  # the target line


def test_a_trial_row_is_labelled_by_its_name_else_its_run():
    from bisect_eagle.report.study import trial_label

    assert trial_label(pd.Series({"run_id": "7ca37e03aa11", "trial": "live 003"})) == "live 003"
    # logged unnamed
    assert trial_label(pd.Series({"run_id": "7ca37e03aa11", "trial": float("nan")})) == "7ca37e03"
    assert trial_label(pd.Series({"run_id": "7ca37e03aa11"})) == "7ca37e03"
