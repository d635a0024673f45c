"""Where a study's MLflow store is: the default beside the working directory, the order of the ways
to name another, and where a SQLite store keeps its database and artifacts."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path


def default_tracking_uri(cwd: Path | None = None) -> str:
    """``sqlite:///<cwd>/mlruns/mlflow.db`` (absolute, so other processes and the UI find the same
    store).

    Args:
        cwd: the directory the store lives under; None: the current directory.

    Returns:
        The SQLite tracking URI, its path resolved.
    """
    return f"sqlite:///{((cwd or Path.cwd()) / 'mlruns' / 'mlflow.db').resolve()}"


def resolve_tracking_uri(flag: str | None, spec_uri: str | None = None) -> str:
    """--tracking-uri, else $MLFLOW_TRACKING_URI, else the spec's storage.tracking_uri, else the
    default.

    Args:
        flag: the ``--tracking-uri`` value (None or empty: not given).
        spec_uri: the spec's ``storage.tracking_uri`` (None or empty: not given).

    Returns:
        The first of them that is given; :func:`default_tracking_uri` when none is.
    """
    return flag or os.environ.get("MLFLOW_TRACKING_URI") or spec_uri or default_tracking_uri()


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else None.

    Args:
        uri: a tracking URI.

    Returns:
        The path after ``sqlite:///`` (as written, not resolved); None for any other scheme.
    """
    prefix = "sqlite:///"
    return Path(uri[len(prefix) :]) if uri.startswith(prefix) else None


def artifact_root(uri: str) -> str | None:
    """Where new experiments keep artifacts: beside a SQLite store (``artifacts/``), else MLflow's
    default."""
    db = sqlite_path(uri)
    return str(db.resolve().parent / "artifacts") if db else None


def use_wal(db: Path) -> None:
    """WAL journaling for a SQLite store (persistent): one fsync per commit, readers never block the
    writer."""
    with contextlib.closing(sqlite3.connect(str(db), timeout=60)) as conn:
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            conn.execute("PRAGMA journal_mode=WAL")
