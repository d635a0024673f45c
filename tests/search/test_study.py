"""Stage 2 and the whole study with a deterministic fake engine: dedupe, crashes, budgets, resume,
workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna
import pytest
from fake_engine import FakeEngine, make_spec, search

from bisect_eagle.poll import wait_until
from bisect_eagle.search.study import Claims
from bisect_eagle.spec.load import load_spec
from bisect_eagle.tracking.runs import Tracking

from helpers import ctrl_c_heard

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict[str, str]:
    """One Optuna database and one MLflow store for the module (creating them is the slow part)."""
    root = tmp_path_factory.mktemp("store")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return {
        "root": str(root),
        "storage": f"sqlite:///{root}/optuna.db",
        "tracking": f"sqlite:///{root}/mlflow.db",
    }


def live_fingerprints(engine: FakeEngine) -> list[tuple]:
    return [
        (tuple(s.eagle_aux_hidden_state_layer_ids or ()), s.num_steps)
        for s in engine.runs
        if not s.is_baseline
    ]


def test_reaches_target_without_measuring_a_config_twice(tmp_path, store):
    spec = load_spec(make_spec(tmp_path, "reach"))
    engine = FakeEngine()
    out = search(spec, engine, store)
    assert out.target_reached and out.stop_reason.startswith("target reached (confirmed, bound ")
    assert (
        out.verdict.startswith("target reached: output tok/s ")
        and "95 % lower bound 2." in out.verdict
    )
    assert out.best["params"]["eagle_aux_hidden_state_layer_ids"] == [1, 5, 9]
    assert out.best["value"] >= out.target == pytest.approx(200.0)
    assert out.best["metrics"]["output_tok_s_ratio_to_baseline"] >= 2.0
    pairs = out.confirmation["pairs"]
    assert pairs == 3 and out.confirmation["lower"] >= 2.0  # no noise: the first look confirms
    runs = Counter(live_fingerprints(engine))  # every config once; the winner again in each pair
    best = (
        tuple(out.best["params"]["eagle_aux_hidden_state_layer_ids"]),
        out.best["params"]["num_steps"],
    )
    assert runs.pop(best) == 1 + pairs and set(runs.values()) <= {1}
    assert len(runs) + 1 == out.counts["live_measured"]
    tracking = Tracking.open(store["tracking"], "reach")
    children = tracking.child_runs(out.parent_run_id)
    stages = Counter(r.data.tags["stage"] for r in children)
    # the study's own baseline launch serves as one of the confirmation's: one baseline launch fewer
    # than pairs
    assert stages == {"baseline": 1, "live": out.counts["live_measured"], "confirm": 2 * pairs - 1}
    roles = Counter(
        r.data.tags["confirm_role"] for r in children if r.data.tags["stage"] == "confirm"
    )
    assert roles == {"candidate": pairs, "baseline": pairs - 1}
    parent = tracking.get_run(out.parent_run_id)
    assert parent.data.metrics["confirm_bound"] >= 2.0 and parent.data.metrics[
        "baseline_drift"
    ] == pytest.approx(1.0)
    assert parent.data.tags["confirmation"].startswith("confirmed, bound")
    assert all(r.info.status == "FINISHED" for r in children)
    study = optuna.load_study(storage=store["storage"], study_name=out.study)
    measured = [t for t in study.trials if "mlflow_run_id" in t.user_attrs]
    assert {t.user_attrs["mlflow_run_id"] for t in measured} == {
        r.info.run_id for r in children if r.data.tags["stage"] == "live"
    }
    for t in study.trials:
        if "duplicate_of" in t.user_attrs:  # told the cached value, nothing ran
            original = next(
                m for m in measured if m.user_attrs["fingerprint"] == t.user_attrs["fingerprint"]
            )
            assert t.value == original.value


def test_crashed_configs_are_recorded_and_never_measured_again(tmp_path, store):
    spec = load_spec(make_spec(tmp_path, "crash", ratio=10.0, high=3, budget=9, sampler="random"))
    engine = FakeEngine(crash_steps=(2,))
    out = search(spec, engine, store)
    runs = live_fingerprints(engine)
    assert len(runs) == len(set(runs)) == 9
    assert not out.target_reached and out.stop_reason.startswith("search space exhausted")
    assert out.counts["failed"] == 3
    study = optuna.load_study(storage=store["storage"], study_name=out.study)
    crashed = [t for t in study.trials if "failure_class" in t.user_attrs]
    assert crashed
    assert all(
        t.state == optuna.trial.TrialState.PRUNED and t.constraints == {"crashed": 1.0}
        for t in crashed
    )
    tracking = Tracking.open(store["tracking"], "crash")
    failed = [
        r for r in tracking.child_runs(out.parent_run_id, "live") if r.info.status == "FAILED"
    ]
    assert len(failed) == 3 and {r.data.tags["failure_class"] for r in failed} == {
        "crash_during_benchmark"
    }


def test_budget_ends_a_search_that_cannot_reach_the_target(tmp_path, store):
    spec = load_spec(make_spec(tmp_path, "budget", ratio=5.0, budget=4))
    out = search(spec, FakeEngine(), store)
    assert not out.target_reached
    assert out.stop_reason == "budget: max_live_trials (4) used"
    assert out.counts["live_measured"] == 4
    parent = Tracking.open(store["tracking"], "budget").get_run(out.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["outcome"] == "target not reached"
    assert parent.data.params["version.optuna"] == optuna.__version__


def test_prune_below_stops_repeating_a_hopeless_config(tmp_path, store):
    path = make_spec(tmp_path, "prune", ratio=2.0, high=2, budget=6, sampler="grid")
    path.write_text(path.read_text().replace("seed: 0,", "seed: 0, repeats: 2, prune_below: 0.5,"))
    engine = FakeEngine()
    out = search(load_spec(path), engine, store)
    runs = Counter(live_fingerprints(engine))
    assert runs[((1, 5, 9), 1)] == 2  # 139 tok/s: above half the target (100), measured twice
    assert runs[((5, 9, 11), 1)] == 1  # 91 tok/s: pruned after one measurement
    tracking = Tracking.open(store["tracking"], "prune")
    statuses = Counter(
        (r.data.tags["outcome"], r.info.status)
        for r in tracking.child_runs(out.parent_run_id, "live")
    )
    assert statuses == {("ok", "FINISHED"): 2, ("pruned", "KILLED"): 4}
    # repeats launch, pruning saves
    assert out.launches["live"] == 2 * 2 + 4 * 1 == len(live_fingerprints(engine))
    study = optuna.load_study(storage=store["storage"], study_name=out.study)
    assert sum(t.state == optuna.trial.TrialState.PRUNED for t in study.trials) >= 4


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_ends_the_trial_and_the_study_run_killed(tmp_path, store, sig):
    """SIGTERM (an exit) and SIGINT (Ctrl-C) alike end the live trial and the study's run KILLED."""
    name = f"term-{sig.name.lower()}"
    spec_path = make_spec(tmp_path, name, ratio=10.0, high=3, budget=6)
    log = tmp_path / "runs.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "study_proc.py"),
            "run",
            str(spec_path),
            store["storage"],
            store["tracking"],
            "2.0",
            str(log),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=ctrl_c_heard,
    )
    _wait_for_lines(log, 2, proc)  # the baseline done, a live trial in progress
    proc.send_signal(sig)
    code = proc.wait(timeout=60)
    assert code == 128 + signal.SIGTERM if sig == signal.SIGTERM else code != 0
    tracking = Tracking.open(store["tracking"], name)
    parent = tracking.client.search_runs([tracking.experiment_id], "tags.role = 'study'")[0]
    assert parent.info.status == "KILLED"
    live = tracking.child_runs(parent.info.run_id, "live")
    assert [(r.info.status, r.data.tags["outcome"]) for r in live] == [("KILLED", "interrupted")]
    # released: measured again on resume
    assert Claims(store["storage"], parent.data.tags["study"]).all() == []


def test_a_sigterm_while_the_verdict_is_written_ends_the_study_run_killed(
    tmp_path, store, monkeypatch
):
    """The search is done, its report plots are being drawn when SIGTERM arrives (the CLI turns it
    into an exit): the study's run ends KILLED, not RUNNING, and `--resume` writes the verdict."""
    import bisect_eagle.search.study.parent as parent_module

    def killed(*args, **kwargs):
        raise SystemExit(128 + signal.SIGTERM)

    spec = load_spec(make_spec(tmp_path, "verdict", ratio=10.0, high=2, budget=2))
    with monkeypatch.context() as patch:
        patch.setattr(parent_module, "write_report", killed)
        with pytest.raises(SystemExit):
            search(spec, FakeEngine(), store)
    tracking = Tracking.open(store["tracking"], "verdict")
    parent = tracking.client.search_runs([tracking.experiment_id], "tags.role = 'study'")[0]
    assert parent.info.status == "KILLED" and parent.data.tags["outcome"] == "interrupted"
    engine = FakeEngine()
    out = search(spec, engine, store, resume=True)
    assert out.parent_run_id == parent.info.run_id and engine.runs == []  # nothing measured again
    assert tracking.get_run(parent.info.run_id).info.status == "FINISHED"


def _wait_for_lines(log: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    def enough() -> bool:
        if log.exists() and len(log.read_text().splitlines()) >= n:
            return True
        assert proc.poll() is None, proc.stdout.read()
        return False

    assert wait_until(enough, timeout_s=timeout, max_interval_s=0.2, what=f"{n} lines in {log}"), (
        f"{log} never reached {n} lines"
    )


def test_sigkill_then_resume_repeats_no_finished_trial(tmp_path, store):
    spec_path = make_spec(tmp_path, "killed", ratio=10.0, high=3, budget=6)
    log = tmp_path / "runs.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "study_proc.py"),
            "run",
            str(spec_path),
            store["storage"],
            store["tracking"],
            "1.5",
            str(log),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        # the baseline, two finished live trials, the third in progress
        _wait_for_lines(log, 4, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    tracking = Tracking.open(store["tracking"], "killed")
    parent = tracking.client.search_runs([tracking.experiment_id], "tags.role = 'study'")[0]
    before = {
        r.data.tags["fingerprint"]: r.info.status for r in tracking.child_runs(parent.info.run_id)
    }
    assert "RUNNING" in before.values()
    finished_before = {fp for fp, status in before.items() if status == "FINISHED"}

    spec = load_spec(spec_path)
    engine = FakeEngine()
    out = search(spec, engine, store, resume=True)
    assert out.parent_run_id == parent.info.run_id
    assert out.stop_reason == "budget: max_live_trials (6) used"
    rerun = {engine.plan(s).fingerprint for s in engine.runs}
    assert not rerun & finished_before
    children = tracking.child_runs(parent.info.run_id)
    killed = [r for r in children if r.data.tags.get("outcome") == "interrupted"]
    assert len(killed) == 1 and killed[0].info.status == "KILLED"
    study = optuna.load_study(storage=store["storage"], study_name=out.study)
    by_trial = [
        t.user_attrs["mlflow_run_id"] for t in study.trials if "mlflow_run_id" in t.user_attrs
    ]
    assert (
        len(by_trial)
        == len(set(by_trial))
        == len([r for r in children if r.data.tags["stage"] == "live"])
    )
    assert {r.info.status for r in children if r.data.tags.get("outcome") != "interrupted"} == {
        "FINISHED"
    }
    assert tracking.get_run(parent.info.run_id).info.status == "FINISHED"


def test_a_new_run_after_a_sigkill_ends_the_killed_runs_runs(tmp_path, store):
    """SIGKILL reaches no handler: the study's run and its live trial stay RUNNING. The next `run`
    of the spec (a new study, not a resume) ends them KILLED, outcome ``interrupted``, before it
    starts; its own runs finish."""
    spec_path = make_spec(tmp_path, "orphans", ratio=10.0, high=3, budget=3)
    log = tmp_path / "runs.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "study_proc.py"),
            "run",
            str(spec_path),
            store["storage"],
            store["tracking"],
            "2.0",
            str(log),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for_lines(log, 2, proc)  # the baseline done, a live trial in progress
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    tracking = Tracking.open(store["tracking"], "orphans")
    running = {
        r.info.run_id
        for r in tracking.client.search_runs(
            [tracking.experiment_id], "attributes.status = 'RUNNING'"
        )
    }
    assert len(running) == 2  # the study's run and the live trial's
    out = search(load_spec(spec_path), FakeEngine(), store)
    assert out.parent_run_id not in running
    runs = tracking.client.search_runs([tracking.experiment_id])
    assert not [r for r in runs if r.info.status == "RUNNING"]
    killed = {r.info.run_id: r.data.tags["outcome"] for r in runs if r.info.status == "KILLED"}
    assert killed == dict.fromkeys(running, "interrupted")


def test_two_workers_never_run_the_same_fingerprint(tmp_path, store):
    spec_path = make_spec(tmp_path, "workers", ratio=10.0, high=4, budget=10, seed=3)
    log = tmp_path / "runs.log"
    args = [str(spec_path), store["storage"], store["tracking"], "0.4", str(log)]
    first = subprocess.Popen(
        [sys.executable, str(HERE / "study_proc.py"), "run-with-worker", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    _wait_for_lines(log, 1, first)
    second = subprocess.Popen(
        [sys.executable, str(HERE / "study_proc.py"), "worker", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out1, _ = first.communicate(timeout=240)
    out2, _ = second.communicate(timeout=240)
    assert first.returncode == 0, out1
    assert second.returncode == 0, out2
    lines = [line.split(" ", 1) for line in log.read_text().splitlines()]
    live = [cfg for _, cfg in lines if not cfg.startswith("None 0")]
    assert len(live) == len(set(live)) == 10, live
    assert len({pid for pid, _ in lines}) == 2  # both processes measured trials
    claims = Claims(store["storage"], _study_of(store, "workers")).all()
    assert len(claims) == 10 and all(c.state == "ok" for c in claims)


def _study_of(store: dict[str, str], spec_name: str) -> str:
    return next(
        s.study_name
        for s in optuna.get_all_study_summaries(store["storage"])
        if s.user_attrs.get("spec_name") == spec_name
    )
