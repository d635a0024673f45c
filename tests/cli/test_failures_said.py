"""What the CLI says when a store fails or a trial did not finish: one line, never a
runnable-looking answer."""

from __future__ import annotations

import os
import re
import sqlite3
from types import SimpleNamespace

import pytest

from bisect_eagle.cli.logs import store_failure
from bisect_eagle.errors import BadInput
from bisect_eagle.tracking.runs import Tracking
from bisect_eagle.trials.record import read_trial, trial_failure

from helpers import cli


def _run(status: str, **tags: str) -> SimpleNamespace:
    return SimpleNamespace(
        info=SimpleNamespace(status=status, run_id="r1"), data=SimpleNamespace(tags=tags)
    )


def test_a_full_disk_is_a_store_error_through_its_chain():
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as inner:
            raise RuntimeError("logging failed") from inner
    except RuntimeError as e:
        assert store_failure(e) == "full"
    assert store_failure(OSError(28, "No space left on device")) == "full"
    assert (
        store_failure(sqlite3.OperationalError("attempt to write a readonly database"))
        == "read_only"
    )
    assert store_failure(sqlite3.OperationalError("database is locked")) == "failed"
    assert store_failure(ValueError("a bug")) is None


def test_a_failed_or_killed_trial_says_so():
    assert trial_failure(_run("FINISHED", outcome="ok")) is None
    failed = trial_failure(
        _run("FAILED", outcome="failed", failure_class="out_of_memory", failure_detail="CUDA oom")
    )
    assert "FAILED" in failed and "out_of_memory" in failed and "CUDA oom" in failed
    assert "KILLED" in trial_failure(_run("KILLED", outcome="interrupted"))


def test_a_run_killed_before_its_trial_was_recorded_is_bad_input(tmp_path):
    tracking = Tracking.open(f"sqlite:///{tmp_path}/m.db", "killed")
    run_id = tracking.start_run("live 001", tags={"stage": "live"})
    tracking.finish(run_id, "KILLED")
    with pytest.raises(
        BadInput, match=rf"run {run_id}: no readable trial.json \(the run ended KILLED"
    ):
        read_trial(tracking, run_id)


DISK_FULL = '''
import sqlite3

from sqlalchemy import event
from sqlalchemy.engine import Engine

full = False


@event.listens_for(Engine, "before_cursor_execute")
def disk_full(conn, cursor, statement, parameters, context, executemany):
    """From the first metric on, every write to the MLflow store fails as SQLite fails on a full
    disk."""
    global full
    if not str(conn.engine.url.database or "").endswith("mlflow.db"):
        return
    head = statement.lstrip().upper()
    full = full or head.startswith("INSERT INTO METRICS")
    if full and head.startswith(("INSERT", "UPDATE", "DELETE")):
        raise sqlite3.OperationalError("database or disk is full")
'''
# the command's own progress (wrapped)
PROGRESS = re.compile(r"^(\[?\d+:\d\d:\d\d\]? |[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏] |\s)")


def test_a_full_disk_mid_run_is_one_line_and_exit_2_without_a_library_traceback(tmp_path):
    """The MLflow store's disk fills at the first metric: MLflow logs each failed write with its
    traceback and the run's guards fail to end their runs; none of it reaches the terminal, only the
    one line with the fix."""
    inject = tmp_path / "inject"
    inject.mkdir()
    # imported at the command's start: SQLite's own error
    (inject / "sitecustomize.py").write_text(DISK_FULL)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(inject), os.environ.get("PYTHONPATH", "")]),
    }
    done = cli("run", cwd=cwd, env=env)
    said = [line for line in done.stderr.splitlines() if line.strip() and not PROGRESS.match(line)]
    assert done.returncode == 2, done.stderr[-3000:]
    assert said == [
        "error: the disk of the tracking or study store is full (OperationalError: database or "
        "disk is full): free space, then run the command again (`run` continues with --resume)"
    ], done.stderr
    assert "Traceback" not in done.stderr and "mlflow" not in done.stderr.lower()


def test_a_log_record_is_one_line_and_a_store_failure_is_held_unless_the_command_ends_on_it(
    capsys,
):
    import logging

    from bisect_eagle.cli.logs import end_logging, quiet_libraries

    quiet_libraries()
    try:
        try:
            raise ValueError("bad header\nsecond line")
        except ValueError:
            logging.getLogger("mlflow.store.artifact").exception("upload failed\nmore detail")
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError:
            logging.getLogger("mlflow.store.db.utils").exception("SQLAlchemy database error.")
        logging.getLogger("bisect_eagle.tracking.runs").info("below the warning level: never said")
    finally:
        held = end_logging()
    # no traceback
    assert capsys.readouterr().err == "error: upload failed (mlflow.store.artifact)\n"
    assert held == ["error: SQLAlchemy database error. (mlflow.store.db.utils)"]
    assert end_logging() == []  # handed back once; the policy ends with the command
