"""Where a study lives: storage URL defaults and precedence, SQLite options, opening and finding
studies."""

from __future__ import annotations

import sqlite3

import optuna
import pytest

from bisect_eagle.errors import BadInput
from bisect_eagle.search.study.storage import (
    default_storage,
    engine_kwargs,
    latest_study,
    load_study,
    open_storage,
    resolve_storage,
)
from bisect_eagle.spec.schema import Spec


def test_storage_precedence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert default_storage() == f"sqlite:///{tmp_path.resolve()}/mlruns/optuna.db"
    spec = Spec(name="x")
    assert resolve_storage(None, spec) == default_storage()
    spec.storage.optuna = "sqlite:///spec.db"
    assert resolve_storage(None, spec) == "sqlite:///spec.db"
    assert resolve_storage("sqlite:///flag.db", spec) == "sqlite:///flag.db"


def test_sqlite_gets_its_folder_and_wal(tmp_path):
    db = tmp_path / "deep" / "optuna.db"
    kwargs = engine_kwargs(f"sqlite:///{db}")
    assert db.parent.is_dir()
    conn = kwargs["creator"]()
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    assert engine_kwargs("postgresql://u@db/optuna") == {
        "connect_args": {"connect_timeout": 4},
        "pool_pre_ping": True,
    }
    assert isinstance(conn, sqlite3.Connection)


def test_a_bad_url_is_one_line_without_the_password():
    with pytest.raises(BadInput) as e:
        open_storage("nosuchdialect://bob:hunter2@db/optuna")
    assert "hunter2" not in str(e.value) and "cannot open the Optuna storage" in str(e.value)


def test_load_and_find_the_latest_study_of_a_spec(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = open_storage(f"sqlite:///{tmp_path}/optuna.db")
    spec = Spec(name="mine")
    assert latest_study(storage, spec) is None
    for name, owner in (("mine-1", "mine"), ("other-1", "other"), ("mine-2", "mine")):
        optuna.create_study(storage=storage, study_name=name).set_user_attr("spec_name", owner)
    assert latest_study(storage, spec) == "mine-2"
    assert load_study(storage, "mine-1").study_name == "mine-1"
    with pytest.raises(BadInput, match="not found"):
        load_study(storage, "absent")


CONCURRENT_OPEN = """
import sys, optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
from bisect_eagle.search.study.api import _create_study
from bisect_eagle.search.study.storage import open_storage
from bisect_eagle.tracking.stores import first_open_lock
from bisect_eagle.tracking.runs import Tracking
folder = sys.argv[1]
url = f"sqlite:///{folder}/mlruns/optuna.db"
study = _create_study(open_storage(url), name="tiny-20260101-000000", url=url, named=False)
with first_open_lock(f"sqlite:///{folder}/mlruns/mlflow.db"):
    Tracking.open(f"sqlite:///{folder}/mlruns/mlflow.db", "tiny")
print(study.study_name)
"""


def test_concurrent_first_opens_in_a_fresh_folder_all_work(tmp_path):
    """Three `run`s started together in a fresh folder: each opens both stores and gets a study of
    its own."""
    import subprocess
    import sys

    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT_OPEN, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-1500:] for _, err in outs]
    assert sorted(out.strip() for out, _ in outs) == [
        "tiny-20260101-000000",
        "tiny-20260101-000000-2",
        "tiny-20260101-000000-3",
    ]


def test_an_explicit_study_name_taken_says_so(tmp_path):
    from bisect_eagle.search.study.api import _create_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path}/optuna.db"
    storage = open_storage(url)
    _create_study(storage, name="mine", url=url, named=True)
    with pytest.raises(BadInput, match="'mine' already exists.*--resume"):
        _create_study(storage, name="mine", url=url, named=True)
