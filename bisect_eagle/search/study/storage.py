"""Where a study lives: the Optuna storage URL, the SQLAlchemy engine options for it, and loading a study.

The default is ``sqlite:///<cwd>/mlruns/optuna.db`` (one machine); PostgreSQL serves several nodes. The same
database holds the claims table (:mod:`bisect_eagle.search.study.claims`), so both use :func:`engine_kwargs`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import optuna

from bisect_eagle.errors import BadInput
from bisect_eagle.spec import Spec
from bisect_eagle.tracking import redact

SQLITE_PREFIX = "sqlite:///"
SQLITE_LOCK_WAIT_S = 60


def default_storage(cwd: Path | None = None) -> str:
    """``sqlite:///<cwd>/mlruns/optuna.db``, absolute (other processes find the same database)."""
    return f"{SQLITE_PREFIX}{((cwd or Path.cwd()) / 'mlruns' / 'optuna.db').resolve()}"


def resolve_storage(flag: str | None, spec: Spec) -> str:
    """--storage, else the spec's storage.optuna, else ``sqlite:///<cwd>/mlruns/optuna.db``."""
    return flag or spec.storage.optuna or default_storage()


def engine_kwargs(url: str) -> dict[str, Any]:
    """SQLAlchemy engine options: a SQLite file gets its folder, WAL journaling and a 60 s lock wait."""
    if not url.startswith(SQLITE_PREFIX):
        return {}
    path = Path(url[len(SQLITE_PREFIX):])
    path.parent.mkdir(parents=True, exist_ok=True)

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(str(path), timeout=SQLITE_LOCK_WAIT_S, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer; one fsync per commit
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    return {"creator": connect}


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage at ``url``; a bad URL or an unreachable server is :class:`BadInput`."""
    kwargs = engine_kwargs(url)
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except Exception as e:  # SQLAlchemy raises many types for a bad URL or an unreachable server
        raise BadInput(f"--storage {redact(url)}: cannot open the Optuna storage ({str(e).splitlines()[0]})") from None


def load_study(storage: optuna.storages.RDBStorage, name: str) -> optuna.Study:
    """The study ``name``; :class:`BadInput` when the storage has none of that name."""
    try:
        return optuna.load_study(storage=storage, study_name=name)
    except KeyError:
        raise BadInput(f"study {name!r} not found in the Optuna storage") from None


def latest_study(storage: optuna.storages.RDBStorage, spec: Spec) -> str | None:
    """The newest study created for this spec's name, or None."""
    mine = [s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
            if s.user_attrs.get("spec_name") == spec.name]
    return max(mine, key=lambda s: s._study_id).study_name if mine else None
