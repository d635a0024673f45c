"""Fail fast on unreachable stores (one line, exit 2, no password, seconds), one measuring command
per local store, and PostgreSQL really working for both the Optuna storage and MLflow's backend
store (psycopg 3 under SQLAlchemy 2.1, plain ``postgresql://``)."""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest

from bisect_eagle.search.study.storage import open_storage
from bisect_eagle.tracking.redact import redact_url
from bisect_eagle.tracking.runs import Tracking
from bisect_eagle.tracking.stores import (
    StoreReadOnly,
    StoreUnreachable,
    check_stores,
    check_writable,
    read_only_url,
    store_unwritable,
)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_hide_password_covers_database_and_http_urls():
    assert redact_url("postgresql://bob:hunter2@db:5432/x") == "postgresql://bob:***@db:5432/x"
    assert redact_url("http://u:pw@h:5000") == "http://u:***@h:5000"
    assert redact_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


@pytest.mark.parametrize("kind", ["storage", "tracking-http", "tracking-postgres"])
def test_unreachable_stores_fail_in_seconds_with_one_line(kind):
    port = closed_port()
    pg = f"postgresql://bob:hunter2@127.0.0.1:{port}/optuna"
    kwargs = {
        "storage": pg if kind == "storage" else None,
        "tracking_uri": {
            "storage": None,
            "tracking-http": f"http://127.0.0.1:{port}",
            "tracking-postgres": pg,
        }[kind],
    }
    start = time.monotonic()
    with pytest.raises(StoreUnreachable) as e:
        check_stores(**kwargs)
    assert time.monotonic() - start < 5
    message = str(e.value)
    assert "hunter2" not in message and "\n" not in message and f"127.0.0.1:{port}" in message


def test_run_with_an_unreachable_postgres_storage_exits_2_with_one_line(tmp_path):
    url = f"postgresql://bob:hunter2@127.0.0.1:{closed_port()}/optuna"
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "bisect_eagle.cli", "run", "--storage", url, "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"},
    )
    took = time.monotonic() - start
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --storage postgresql://bob:***@"), (
        done.stderr
    )
    assert "hunter2" not in done.stderr + done.stdout and "Traceback" not in done.stderr
    assert not (tmp_path / "mlruns").exists()  # nothing written
    # the check itself takes well under a second here (above); this bounds the whole command
    assert took < 60


def _postgres_bin() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found and shutil.which("runuser") else None


@pytest.fixture(scope="module")
def postgres():
    """A throwaway PostgreSQL server on 127.0.0.1 (Debian's package), with a password-protected
    role."""
    bin_dir = _postgres_bin()
    missing = (
        "PostgreSQL is not installed (apt-get install postgresql)"
        if bin_dir is None
        else "not root: no server to test against"
        if os.geteuid() != 0
        else "the psycopg driver is not installed (pip install -e '.[postgres]')"
        if importlib.util.find_spec("psycopg") is None
        else None
    )
    if missing:
        if os.environ.get("BISECT_EAGLE_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"BISECT_EAGLE_REQUIRE_POSTGRES=1 but {missing}")
        pytest.skip(missing)
    root = tempfile.mkdtemp(prefix="bisect-eagle-pg-")  # /tmp: the postgres user must reach it
    shutil.chown(root, "postgres")
    port = closed_port()
    as_pg = ["runuser", "-u", "postgres", "--"]  # PostgreSQL refuses to run as root
    subprocess.run(
        [
            *as_pg,
            f"{bin_dir}/initdb",
            "-D",
            f"{root}/data",
            "-U",
            "postgres",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
        ],
        check=True,
        capture_output=True,
        cwd="/",
    )
    subprocess.run(
        [
            *as_pg,
            f"{bin_dir}/pg_ctl",
            "-D",
            f"{root}/data",
            "-l",
            f"{root}/log",
            "-w",
            "-o",
            f"-c listen_addresses=127.0.0.1 -p {port} -k {root}",
            "start",
        ],
        check=True,
        capture_output=True,
        cwd="/",
    )
    try:
        for sql in (
            "CREATE ROLE be LOGIN PASSWORD 'pw-s3cret'",
            "CREATE DATABASE optuna OWNER be",
            "CREATE DATABASE mlflow OWNER be",
        ):
            subprocess.run(
                [
                    *as_pg,
                    f"{bin_dir}/psql",
                    "-h",
                    str(root),
                    "-p",
                    str(port),
                    "-U",
                    "postgres",
                    "-c",
                    sql,
                ],
                check=True,
                capture_output=True,
                cwd="/",
            )
        yield f"postgresql://be:pw-s3cret@127.0.0.1:{port}"
    finally:
        subprocess.run(
            [*as_pg, f"{bin_dir}/pg_ctl", "-D", f"{root}/data", "-m", "immediate", "stop"],
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)


def test_postgresql_urls_work_for_optuna_and_the_mlflow_backend(postgres, tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_stores(storage=f"{postgres}/optuna", tracking_uri=f"{postgres}/mlflow")
    study = optuna.create_study(storage=open_storage(f"{postgres}/optuna"), study_name="pg")
    study.tell(study.ask(), 1.5)
    assert (
        optuna.load_study(storage=open_storage(f"{postgres}/optuna"), study_name="pg").best_value
        == 1.5
    )
    tracking = Tracking.open(f"{postgres}/mlflow", "pg-experiment")
    run = tracking.start_run("r", tags={"stage": "live"})
    tracking.finish(run, "FINISHED")
    assert (
        Tracking.open(f"{postgres}/mlflow", "pg-experiment").get_run(run).info.status == "FINISHED"
    )
    with pytest.raises(StoreUnreachable) as e:
        check_stores(
            storage=postgres.replace("pw-s3cret", "wrong-pw") + "/optuna", tracking_uri=None
        )
    assert "wrong-pw" not in str(e.value) and "password authentication failed" in str(e.value)


HOLD = """
import sys, time
from bisect_eagle.tracking.stores import store_lock
with store_lock(sys.argv[1], command="bisect-eagle run spec.yaml"):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_store_held_by_one_command_refuses_a_second_naming_it_until_the_holder_dies(tmp_path):
    """The second command's error names the holder (pid, command, start time); a SIGKILLed
    holder's lock is gone with it, so the next command gets the store."""
    import signal

    from bisect_eagle.tracking.stores import StoreBusy, store_lock

    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, uri], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreBusy) as e, store_lock(uri):
            pass
        message = str(e.value)
        head = f"tracking store {tmp_path / 'mlruns'}: pid {holder.pid} "
        assert "\n" not in message and message.startswith(head)
        assert "(bisect-eagle run spec.yaml, started 20" in message
        assert "bisect-eagle worker" in message
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    with store_lock(uri):  # the dead holder's lock went with it
        assert (tmp_path / "mlruns" / "mlflow.db.run-lock").exists()


def test_a_remote_store_is_never_held():
    """A database or an MLflow server is shared by the nodes of a study on purpose: no lock."""
    from bisect_eagle.tracking.stores import lock_path, store_lock

    for uri in ("postgresql://be:pw@db/mlflow", "http://tracking:5000", "https://u:pw@tracking"):
        assert lock_path(uri) is None
        with store_lock(uri), store_lock(uri):  # held twice at once: nothing is held
            pass
    assert lock_path("sqlite:////x/mlruns/mlflow.db") == Path("/x/mlruns/mlflow.db.run-lock")
    assert lock_path("file:///x/mlruns") == Path("/x/mlruns/bisect-eagle.run-lock")


def test_a_read_only_url_opens_the_store_read_only_and_reads_its_write_ahead_log_when_one_is_left(
    tmp_path,
):
    import sqlalchemy as sa

    folder = tmp_path / "a folder?#%"  # characters a file: URI must escape
    folder.mkdir()
    db = folder / "mlflow.db"
    writer = sqlite3.connect(db)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("CREATE TABLE t (x)")
    writer.execute("INSERT INTO t VALUES (1)")
    writer.commit()  # still open: the row lives in the write-ahead log
    assert Path(f"{db}-wal").stat().st_size > 0
    url = read_only_url(f"sqlite:///{db}")
    assert url.endswith("?mode=ro&uri=true")  # the log is read, so not immutable
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT x FROM t")).scalar() == 1
        with pytest.raises(sa.exc.OperationalError, match="attempt to write a readonly database"):
            conn.execute(sa.text("INSERT INTO t VALUES (2)"))
    engine.dispose()
    writer.close()  # the last connection: the log is folded into the file and removed
    assert read_only_url(f"sqlite:///{db}").endswith("?mode=ro&immutable=1&uri=true")


def test_a_store_that_cannot_be_written_is_refused_naming_its_folder(tmp_path, monkeypatch):
    db = tmp_path / "mlruns" / "mlflow.db"
    # absent: created in a folder that can be written
    assert store_unwritable(f"sqlite:///{db}") is None
    # what a user without the permission is told
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(
        StoreReadOnly,
        match=rf"^the tracking store {tmp_path}/mlruns is read-only \({tmp_path}: "
        r"permission denied\): make it writable, or give --tracking-uri",
    ):
        check_writable(f"sqlite:///{db}", what="the tracking store", flag="--tracking-uri")
    assert not (tmp_path / "mlruns").exists()
    # not a file: not judged
    check_writable("postgresql://u@host/db", what="the study store", flag="--storage")
