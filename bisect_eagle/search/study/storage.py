"""Where a study lives: the Optuna storage URL, the SQLAlchemy engine options for it, and loading a
study.

The default is ``sqlite:///<cwd>/mlruns/optuna.db`` (one machine); PostgreSQL serves several nodes
(``postgresql://user:password@host/db``, driver psycopg 3: ``pip install
'bisect-eagle[postgres]'``). The same database holds the claims table
(:mod:`bisect_eagle.search.study.claims`), so both use :func:`engine_kwargs`.

Every storage is opened with Optuna's trial heartbeats (:func:`liveness`): a process beats for the
trials it runs, and a RUNNING trial whose beats stop for the grace period is failed by whichever
process looks next (:mod:`bisect_eagle.search.study.resume`), on any node, SQLite included.
"""

from __future__ import annotations

import os
import sqlite3
import time
import warnings
from pathlib import Path
from typing import Any

import optuna

from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import Spec
from bisect_eagle.tracking.redact import redact_url
from bisect_eagle.tracking.stores import (
    check_database,
    connect_args,
    first_open_lock,
    is_database_url,
)

SQLITE_PREFIX = "sqlite:///"
SQLITE_LOCK_WAIT_S = 60
HEARTBEAT_S = 10  # a running trial's heartbeat interval ($BISECT_EAGLE_HEARTBEAT_S)
# silence after which a running trial is failed and its config measured again
# ($BISECT_EAGLE_GRACE_S)
GRACE_S = 60
# concurrent first opens of one server database race to create Optuna's tables; losers retry
CREATE_TRIES = 5


def default_storage(cwd: Path | None = None) -> str:
    """``sqlite:///<cwd>/mlruns/optuna.db``, absolute (other processes find the same database)."""
    return f"{SQLITE_PREFIX}{((cwd or Path.cwd()) / 'mlruns' / 'optuna.db').resolve()}"


def resolve_storage(flag: str | None, spec: Spec) -> str:
    """The study's Optuna storage URL.

    Args:
        flag: the command's ``--storage`` (None: not given).
        spec: read at ``storage.optuna``.

    Returns:
        ``flag``, else the spec's ``storage.optuna``, else ``sqlite:///<cwd>/mlruns/optuna.db``.
    """
    return flag or spec.storage.optuna or default_storage()


def liveness() -> tuple[int, int]:
    """(heartbeat interval, grace period) in whole seconds: 10 and 60, or $BISECT_EAGLE_HEARTBEAT_S
    and $BISECT_EAGLE_GRACE_S (every process of a study should use the same); BadInput when not
    positive integers."""
    out = []
    for name, default in (
        ("BISECT_EAGLE_HEARTBEAT_S", HEARTBEAT_S),
        ("BISECT_EAGLE_GRACE_S", GRACE_S),
    ):
        text = os.environ.get(name, str(default))
        if not text.isdigit() or int(text) < 1:
            raise BadInput(f"${name}: expected a whole number of seconds >= 1, got {text!r}")
        out.append(int(text))
    return out[0], out[1]


def engine_kwargs(url: str) -> dict[str, Any]:
    """SQLAlchemy engine options: a SQLite file gets its folder, WAL journaling and a 60 s lock
    wait; a database server a bounded connect timeout and connections checked before use."""
    if is_database_url(url):
        return {"connect_args": connect_args(url), "pool_pre_ping": True}
    if not url.startswith(SQLITE_PREFIX):
        return {}
    path = Path(url[len(SQLITE_PREFIX) :])
    path.parent.mkdir(parents=True, exist_ok=True)

    def connect() -> sqlite3.Connection:
        """A connection to the SQLite file: WAL journal, a 60 s lock wait.

        Returns:
            The connection, usable from any thread.
        """
        conn = sqlite3.connect(str(path), timeout=SQLITE_LOCK_WAIT_S, check_same_thread=False)
        # readers do not block the writer; one fsync per commit
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    return {"creator": connect}


def _creation_race(e: Exception) -> bool:
    """Whether ``e`` is another process creating the same tables at the same moment (then try
    again)."""
    text = str(e).lower()
    return "already exists" in text or "duplicate key" in text or "database is locked" in text


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage at ``url``, with heartbeats (:func:`liveness`).

    A database server is checked first (:func:`bisect_eagle.tracking.stores.check_database`: one
    line within seconds when unreachable). Concurrent first opens of one database (two ``run``
    started together) both succeed. A bad URL or an unreachable server is :class:`BadInput`
    (password hidden).
    """
    if is_database_url(url):
        check_database(url, what="--storage")
    interval, grace = liveness()
    # ask() warns on every trial that heartbeats are meant for optimize(); resume.Liveness beats for
    # ask-and-tell
    warnings.filterwarnings(
        "ignore", message="Heartbeat of storage is supposed to be used with Study.optimize"
    )
    for attempt in range(CREATE_TRIES):
        try:
            with warnings.catch_warnings(), first_open_lock(url):
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url,
                    engine_kwargs=engine_kwargs(url),
                    heartbeat_interval=interval,
                    grace_period=grace,
                )
        # SQLAlchemy raises many types for a bad URL or an unreachable server
        except Exception as e:
            if attempt + 1 < CREATE_TRIES and _creation_race(e):
                time.sleep(0.2 * (attempt + 1))
                continue
            raise BadInput(
                f"--storage {redact_url(url)}: cannot open the Optuna storage "
                f"({str(e).splitlines()[0]})"
            ) from None
    raise AssertionError("unreachable: the last attempt returns or raises")


def load_study(storage: optuna.storages.RDBStorage, name: str) -> optuna.Study:
    """The study ``name``; :class:`BadInput` when the storage has none of that name."""
    try:
        return optuna.load_study(storage=storage, study_name=name)
    except KeyError:
        raise BadInput(f"study {name!r} not found in the Optuna storage") from None


def latest_study(storage: optuna.storages.RDBStorage, spec: Spec) -> str | None:
    """The newest study created for this spec's name, or None."""
    mine = [
        s
        for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
        if s.user_attrs.get("spec_name") == spec.name
    ]
    return max(mine, key=lambda s: s._study_id).study_name if mine else None
