"""`bisect-eagle run` end to end on the embedded tiny spec (real stage 1, local engine), then the
commands that read its store: run --resume, report, export, reproduce. One run is shared by the
module."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cli

OTHER_RATIOS = re.compile(r"÷|\dx\b|x base")  # every ratio to the baseline reads "1.04× baseline"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, dict]:
    cwd = tmp_path_factory.mktemp("tiny-run")
    done = cli("run", "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr[-4000:]
    return cwd, done, json.loads(done.stdout)  # stdout is exactly one JSON object


def test_default_run_selects_the_true_wiring_and_reaches_the_target(tiny_run):
    cwd, _, out = tiny_run
    assert out["target_reached"] and out["stop_reason"].startswith(
        "target reached (confirmed, bound 4."
    )
    # accept length is deterministic: the search's own measurement, no baseline
    confirmation = out["confirmation"]
    assert confirmation["status"] == "confirmed" and confirmation["pairs"] == 1
    assert confirmation["candidate"] == [out["best"]["value"]] and confirmation["baseline"] == []
    assert out["best"]["params"]["eagle_aux_hidden_state_layer_ids"] == [1, 5, 9]
    assert out["best"]["metrics"]["accept_length"] >= out["target"] == pytest.approx(4.5)
    gate = {tuple(v["layer_ids"]): v["passed"] for v in out["gate"]}
    assert set(gate) == {(1, 5, 9), (5, 9, 11), (-1, 1, 5), (0, 4, 8), (2, 6, 10)}
    # the true wiring passes, the incident's two fail; the ±1 shifts read neighbouring states,
    # within the gate's error of the true wiring on 32 samples, and the live trials tell them apart
    assert gate[(1, 5, 9)] and not gate[(5, 9, 11)] and not gate[(-1, 1, 5)]
    assert out["tracking_uri"] == f"sqlite:///{cwd.resolve()}/mlruns/mlflow.db"
    assert (cwd / "mlruns" / "optuna.db").is_file() and (cwd / "mlruns" / "artifacts").is_dir()
    live = [t for t in out["trials"] if not t["duplicate"]]
    assert all(t["params"]["eagle_aux_hidden_state_layer_ids"] == [1, 5, 9] for t in live)
    # its speed (tool_overhead_s_per_trial): scripts/bench_search.py
    assert out["counts"]["live_measured"] <= 8


def test_the_first_run_in_a_new_directory_prints_no_third_party_log_line(tiny_run):
    """A new store is created (MLflow's tables, Optuna's): none of the libraries' own log lines
    (which go to stderr whatever the output mode) reach the user."""
    _, done, _ = tiny_run
    lines = done.stderr.splitlines()
    assert not [
        line
        for line in lines
        if re.search(
            r"\b(INFO|WARNING|DEBUG)\b|mlflow\.|alembic|optuna\.|Downloading artifacts|Traceback",
            line,
        )
    ]


def test_resume_of_a_finished_study_measures_nothing_new_and_prints_where_runs_are(tiny_run):
    cwd, _, out = tiny_run
    done = cli("run", "--resume", cwd=cwd)
    assert done.returncode == 0, done.stderr[-4000:]
    text = done.stdout
    assert "target reached" in text and f"parent run {out['parent_run_id'][:8]}" in text
    (best,) = [
        t for t in out["trials"] if t["run_id"] == out["best"]["run_id"] and not t["duplicate"]
    ]
    assert (
        f"best: live {best['number']:03d} (run {out['best']['run_id'][:8]})\n  accept_length "
        in text
    )
    assert "eagle_aux_hidden_state_layer_ids: [1, 5, 9]" in text
    assert "× baseline" in text and not OTHER_RATIOS.search(text)  # one ratio notation
    said = " ".join(text.split())  # the verdict sentence, wrapped at the console's width
    assert "target reached: accept length " in said and ", confirmed by one measurement" in said
    assert "\n  bisect-eagle ui\n" in text  # the default store: the command needs no URI


def test_export_prints_the_sglang_launch_of_the_best_trial(tiny_run):
    cwd, _, out = tiny_run
    done = cli("export", "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr[-4000:]
    plan = json.loads(done.stdout)
    assert plan["run_id"] == out["best"]["run_id"]
    argv = plan["argv"]
    steps = out["best"]["params"]["num_steps"]
    assert argv[argv.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert argv[argv.index("--speculative-num-steps") + 1] == str(steps)
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == str(steps + 1)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert plan["draft_config_patch"] == {
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 5, 9]}
    }


def test_report_writes_table_best_and_plots(tiny_run):
    cwd, _, out = tiny_run
    done = cli("report", "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr[-4000:]
    rep = json.loads(done.stdout)
    assert (
        rep["parent_run_id"] == out["parent_run_id"]
        and rep["best"]["run_id"] == out["best"]["run_id"]
    )
    assert {Path(f).name for f in rep["files"]} >= {"trials.csv", "accept_length_per_setting.png"}
    assert all(Path(f).is_file() for f in rep["files"])
    assert {t["stage"] for t in rep["trials"]} <= {"standalone", "baseline", "live", "confirm"}


def test_reproduce_reruns_a_trial_and_compares(tiny_run):
    cwd, _, out = tiny_run
    done = cli("reproduce", out["best"]["run_id"], "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr[-4000:]
    rep = json.loads(done.stdout)
    rows = {r["metric"]: r for r in rep["metrics"]}
    assert rep["status"] == "ok" and rep["new_run_id"] != out["best"]["run_id"]
    # greedy decoding: the same tokens, the same acceptance
    assert rows["accept_length"]["rel_diff"] == 0.0
    assert "output_tok_s" in rows


def test_bad_spec_is_one_line_and_exit_2(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\nscenario: tiny\nsearch: {max_live_trials: 0}\n")
    done = cli("run", str(spec), cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and lines[0].startswith("error: ") and "search.max_live_trials" in lines[0]
    )
    assert str(spec) in lines[0]


def test_a_second_run_on_a_held_store_is_one_line_naming_the_holder_and_exit_2(tmp_path):
    """One measuring command per local store: a `run` on the store another command holds (here
    this test process) exits 2 with one line naming it, and creates nothing (no study database)."""
    from bisect_eagle.tracking.stores import store_lock

    (tmp_path / "mlruns").mkdir()
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    with store_lock(uri, command="bisect-eagle run experiments/a.yaml"):
        done = cli("run", "--json", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    head = f"error: tracking store {tmp_path / 'mlruns'}: pid {os.getpid()} "
    assert len(lines) == 1 and lines[0].startswith(head)
    assert "(bisect-eagle run experiments/a.yaml, started " in lines[0]
    assert sorted(p.name for p in (tmp_path / "mlruns").iterdir()) == ["mlflow.db.run-lock"]


def test_failed_baseline_is_one_line_and_exit_3(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import bisect_eagle.search.study as study
    from bisect_eagle.cli import app
    from bisect_eagle.search.study.loop import BaselineFailed

    def fail(spec, *, options, engine_factory):
        raise BaselineFailed(
            "the baseline trial failed (out_of_memory): CUDA OOM; see run abc",
            run_id="abc",
            failure_class="out_of_memory",
        )

    monkeypatch.setattr(study, "run_study", fail)
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(app, ["run", "--json"])
    assert done.exit_code == 3
    assert (
        "the baseline trial failed (out_of_memory)" in done.output
        and "Traceback" not in done.output
    )


@pytest.mark.skipif(
    os.environ.get("BISECT_EAGLE_LOAD_CHECK") != "1",
    reason="tens of minutes on 2 cores: run it (or scripts/check_under_load.py) by hand",
)
def test_three_runs_beside_cpu_burners_agree(tmp_path):
    """The short version of scripts/check_under_load.py: three runs of the tiny spec (two live
    trials each) beside two busy loops reach the same verdict and best wiring."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "check_under_load.py"
    done = subprocess.run(
        [sys.executable, str(script), "--runs", "3", "--burners", "2", "--max-live-trials", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0 and summary["same"], done.stdout + done.stderr[-2000:]
    assert [r["best_wiring"] for r in summary["runs"]] == [[1, 5, 9]] * 3


def test_an_interpreter_without_the_engine_is_one_line_and_exit_2_before_anything_is_created(
    tmp_path,
):
    """The vLLM spec pointed at this project's interpreter (no vLLM in it): refused before the
    study, its store or a baseline exists, naming the file, the key and the fix."""
    import yaml

    raw = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "experiments" / "tiny-vllm.yaml").read_text()
    )
    raw["engine"]["vllm"]["python"] = sys.executable
    spec = tmp_path / "vllm-less.yaml"
    spec.write_text(yaml.safe_dump(raw))
    done = cli("run", str(spec), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    # the Activity clock
    lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("[")]
    assert len(lines) == 1 and lines[0].startswith(f"error: {spec}: key 'engine.vllm.python': "), (
        lines
    )
    assert "has no 'vllm' module" in lines[0] and "scripts/setup_vllm_env.sh" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vllm-less.yaml"]  # no mlruns/, no study
