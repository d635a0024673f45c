"""Report: the trials table, the best config and PNG plots per setting, also logged to the parent run."""

from __future__ import annotations

import optuna
import pytest

from bisect_eagle.report import best_row, find_parent, trials_frame, varying_settings, write_report
from bisect_eagle.search.study import Options, run_study
from bisect_eagle.spec import load_spec
from bisect_eagle.tracking import Tracking

from helpers import load_fake_engine

SPEC = """\
name: report
target: t
draft: d
dump: u
prompts: p.jsonl
criterion: {ratio: 10.0}
space:
  eagle_aux_hidden_state_layer_ids: {type: categorical, choices: [[1, 5, 9], [5, 9, 11]]}
  num_steps: {type: int, low: 1, high: 3}
search: {sampler: grid, max_live_trials: 6}
"""



@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    (root / "spec.yaml").write_text(SPEC)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    engine = load_fake_engine()(crash_steps=(2,))
    out = run_study(load_spec(root / "spec.yaml"), Options(f"sqlite:///{root}/optuna.db",
                                                            f"sqlite:///{root}/mlflow.db"), lambda s: engine)
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
    rep = write_report(tracking, parent, root / "out")
    names = sorted(f.name for f in rep.files)
    assert names == ["accept_length_per_setting.png", "best.json", "output_tok_s_per_setting.png", "trials.csv"]
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
