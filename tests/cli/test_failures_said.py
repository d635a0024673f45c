"""What the CLI says when a store fails or a trial did not finish: one line, never a runnable-looking answer."""

from __future__ import annotations

import sqlite3
from types import SimpleNamespace

import pytest

from bisect_eagle.cli import _is_store_error
from bisect_eagle.errors import BadInput
from bisect_eagle.tracking.runs import Tracking
from bisect_eagle.trials.record import read_trial, trial_failure


def _run(status: str, **tags: str) -> SimpleNamespace:
    return SimpleNamespace(info=SimpleNamespace(status=status, run_id="r1"), data=SimpleNamespace(tags=tags))


def test_a_full_disk_is_a_store_error_through_its_chain():
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as inner:
            raise RuntimeError("logging failed") from inner
    except RuntimeError as e:
        assert _is_store_error(e)
    assert _is_store_error(OSError(28, "No space left on device"))
    assert not _is_store_error(ValueError("a bug"))


def test_a_failed_or_killed_trial_says_so():
    assert trial_failure(_run("FINISHED", outcome="ok")) is None
    failed = trial_failure(_run("FAILED", outcome="failed", failure_class="out_of_memory", failure_detail="CUDA oom"))
    assert "FAILED" in failed and "out_of_memory" in failed and "CUDA oom" in failed
    assert "KILLED" in trial_failure(_run("KILLED", outcome="interrupted"))


def test_a_run_killed_before_its_trial_was_recorded_is_bad_input(tmp_path):
    tracking = Tracking.open(f"sqlite:///{tmp_path}/m.db", "killed")
    run_id = tracking.start_run("live 001", tags={"stage": "live"})
    tracking.finish(run_id, "KILLED")
    with pytest.raises(BadInput, match=rf"run {run_id}: no readable trial.json \(the run ended KILLED"):
        read_trial(tracking, run_id)
