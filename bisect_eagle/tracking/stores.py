"""Fail fast on an unreachable store: one look at the Optuna database and the MLflow tracking store
before use.

Without it, an unreachable ``postgresql://`` store or ``mlflow server`` ends in a traceback after
minutes of retries (SQLAlchemy's and MLflow's own). :func:`check_stores` tries each once, bounded by
:data:`CONNECT_TIMEOUT_S`, and raises :class:`StoreUnreachable` (a :class:`BadInput`: one line, exit
2) whose message names the store with its password hidden. SQLite files and ``file:`` stores are
local: not checked.

:func:`first_open_lock` serialises the first open of a SQLite store by processes of one machine:
a ``run`` and a ``worker`` started together in a fresh directory would otherwise both create its
tables, and one would fail.

:func:`store_lock` keeps one measuring command (``run``, ``bisect``, ``reproduce``) per local
tracking store at a time: a second one is :class:`StoreBusy` (one line, exit 2) naming the holder's
pid, command and start time. ``worker`` joins the holder's study and takes no lock; a remote store
(a database or an ``mlflow server``, shared by several nodes) takes none either.

A SQLite store this process cannot write (a read-only folder or file system, another user's files)
is refused by the commands that write (:func:`check_writable`, one line naming its folder) and
opened read-only by those that only read (:func:`read_only_url`).

``postgresql://`` URLs use SQLAlchemy's default PostgreSQL driver, which is psycopg 3 under
SQLAlchemy 2.1 (``pip install 'bisect-eagle[postgres]'``); ``postgresql+psycopg://`` names it
explicitly and is equivalent.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from bisect_eagle.errors import BadInput
from bisect_eagle.tracking.redact import Scrubber, redact_url

CONNECT_TIMEOUT_S = 4  # per store: both together, and the start-up, stay within 10 s
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql")


class StoreUnreachable(BadInput):
    """A store that cannot be reached or logged into (the message holds no password)."""


def _one_line(e: BaseException, secret: str | None) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    text = lines[0] if lines else type(e).__name__
    return text.replace(secret, "***") if secret else text


def is_database_url(url: str) -> bool:
    """Whether ``url`` names a database server (PostgreSQL, MySQL, SQL Server), not a file or HTTP
    store.

    Args:
        url: the store URL.

    Returns:
        True when its scheme (before any ``+driver``) is a database server's.
    """
    return urlsplit(url).scheme.split("+")[0] in DATABASE_SCHEMES


def connect_args(url: str, timeout_s: float = CONNECT_TIMEOUT_S) -> dict[str, int]:
    """DBAPI connect arguments that bound a connection attempt to ``timeout_s`` (PostgreSQL), else
    {}.

    Args:
        url: the database URL.
        timeout_s: the connect timeout in seconds (PostgreSQL takes whole seconds, at least 1).

    Returns:
        ``{"connect_timeout": seconds}`` for PostgreSQL, else an empty dict.
    """
    if urlsplit(url).scheme.split("+")[0] == "postgresql":
        return {"connect_timeout": max(1, int(timeout_s))}
    return {}


def check_database(url: str, *, what: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Connect once to the database at ``url`` and run ``SELECT 1``; :class:`StoreUnreachable` if
    that fails.

    ``what`` names the store in the message (e.g. ``--storage``).

    Args:
        url: the database URL.
        what: how the message names the store.
        timeout_s: the connect timeout in seconds.

    Raises:
        StoreUnreachable: the URL or its driver is unusable, or the connection or query fails.
    """
    import sqlalchemy as sa

    password = urlsplit(url).password
    try:
        engine = sa.create_engine(
            url, connect_args=connect_args(url, timeout_s), poolclass=sa.pool.NullPool
        )
    except Exception as e:  # a bad URL or a missing driver
        raise StoreUnreachable(f"{what} {redact_url(url)}: {_one_line(e, password)}") from None
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    # refused, timed out, unknown host, authentication failed, no such database
    except Exception as e:
        raise StoreUnreachable(
            f"{what} {redact_url(url)}: cannot connect within {timeout_s:g} s "
            f"({_one_line(e, password)})"
        ) from None
    finally:
        engine.dispose()


def check_tracking_server(uri: str, *, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """GET ``<uri>/health`` of an ``mlflow server``; :class:`StoreUnreachable` unless it answers."""
    import httpx

    password = urlsplit(uri).password
    try:
        answer = httpx.get(uri.rstrip("/") + "/health", timeout=timeout_s)
    except (httpx.HTTPError, OSError, socket.gaierror) as e:
        raise StoreUnreachable(
            f"tracking URI {redact_url(uri)}: no MLflow server answers within {timeout_s:g} s "
            f"({_one_line(e, password)})"
        ) from None
    if answer.status_code >= 500:
        raise StoreUnreachable(
            f"tracking URI {redact_url(uri)}: the MLflow server answers /health with HTTP "
            f"{answer.status_code}"
        )


TRACKING_SCHEMES = ("", "file", "sqlite", "http", "https", *DATABASE_SCHEMES)
TRACKING_WHERE = "tracking URI (--tracking-uri or $MLFLOW_TRACKING_URI)"


def check_url(url: str, *, what: str, schemes: tuple[str, ...], expected: str) -> None:
    """One :class:`BadInput` line (password hidden) for a malformed URL or one of a scheme no store
    has."""
    try:
        scheme = urlsplit(url).scheme.split("+")[0]
        urlsplit(url).port  # noqa: B018 (raises on a malformed host or port)
    except ValueError as e:
        raise BadInput(
            f"{what} {redact_url(url)}: not a valid URL ({e}); expected {expected}"
        ) from None
    if scheme not in schemes:
        raise BadInput(
            f"{what} {redact_url(url)}: scheme {scheme!r} is not a store; expected {expected}"
        )


def check_stores(
    *, storage: str | None, tracking_uri: str | None, timeout_s: float = CONNECT_TIMEOUT_S
) -> None:
    """Check the Optuna storage and the MLflow tracking store: well-formed URLs of a store's scheme,
    and the remote ones (database or HTTP) reachable, each once.

    Args:
        storage: the ``--storage`` URL, or None (or empty) when not given.
        tracking_uri: the MLflow tracking URI, or None (or empty) when not given.
        timeout_s: the connect timeout of each remote check, in seconds.

    Raises:
        BadInput: a URL is malformed or its scheme is not a store's.
        StoreUnreachable: a remote store cannot be reached.
    """
    if storage:
        check_url(
            storage,
            what="--storage",
            schemes=("sqlite", *DATABASE_SCHEMES),
            expected="sqlite:///FILE or a database URL (postgresql://user@host/db)",
        )
    if tracking_uri:
        check_url(
            tracking_uri,
            what=TRACKING_WHERE,
            schemes=TRACKING_SCHEMES,
            expected="a folder, sqlite:///FILE, a database URL or http(s)://host:port of an MLflow "
            "server",
        )
    if storage and is_database_url(storage):
        check_database(storage, what="--storage", timeout_s=timeout_s)
    if not tracking_uri:
        return
    if is_database_url(tracking_uri):
        check_database(tracking_uri, what="tracking URI", timeout_s=timeout_s)
    elif urlsplit(tracking_uri).scheme in ("http", "https"):
        check_tracking_server(tracking_uri, timeout_s=timeout_s)


class StoreReadOnly(BadInput):
    """A store this process may not write: the message names its path and the fix."""


def _unwritable(path: Path) -> str | None:
    """Why this process may not write ``path`` or, where it does not exist, create it: None when it
    may."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if os.access(probe, os.W_OK):
        return None
    read_only_fs = os.statvfs(probe).f_flag & os.ST_RDONLY
    return f"{probe}: {'a read-only file system' if read_only_fs else 'permission denied'}"


def store_unwritable(url: str) -> str | None:
    """Why a ``sqlite:///`` store cannot be written here (its file, or its folder, where SQLite
    keeps the journal), e.g. ``/x/mlruns/mlflow.db: permission denied``; None when it can or the
    store is not a file."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        return None
    db = Path(url[len(prefix) :])
    return _unwritable(db) or _unwritable(db.parent)


def check_writable(url: str | None, *, what: str, flag: str) -> None:
    """:class:`StoreReadOnly` for a ``sqlite:///`` store this process cannot write, before anything
    is created.

    Args:
        url: the store's URL (None: nothing to check).
        what: the store in the message (``the tracking store``).
        flag: the option that names another store (``--tracking-uri``).
    """
    why = store_unwritable(url) if url else None
    if why:
        folder = Path(url[len("sqlite:///") :]).parent
        raise StoreReadOnly(
            f"{what} {folder} is read-only ({why}): make it writable, or give {flag} of a store "
            "you can write"
        )


def read_only_url(url: str) -> str:
    """A ``sqlite:///`` URL that SQLite opens read-only (``mode=ro``), for a store this process
    cannot write.

    SQLite cannot open a WAL database read-only without its shared-memory file, which a read-only
    folder cannot hold: with no write-ahead log left beside it (``-wal`` absent or empty) the file
    is all there is and it is opened ``immutable`` (no locks, no journal); with one, ``mode=ro``
    reads it (where ``-shm`` exists). The driver is named (``sqlite+pysqlite``, SQLAlchemy's
    default): MLflow then takes the ``file:`` URI for no folder to make.
    """
    from urllib.parse import quote

    db = Path(url[len("sqlite:///") :])
    wal = Path(f"{db}-wal")
    immutable = "" if wal.is_file() and wal.stat().st_size > 0 else "&immutable=1"
    # SQLAlchemy unquotes the database part once, SQLite's URI once more
    path = quote(quote(str(db)))
    return f"sqlite+pysqlite:///file:{path}?mode=ro{immutable}&uri=true"


@contextlib.contextmanager
def first_open_lock(url: str) -> Iterator[None]:
    """For a ``sqlite:///`` URL, hold an exclusive lock on the database's folder (created if absent)
    while the block opens the store, so concurrent first opens do not race to create its tables;
    otherwise do nothing.

    Args:
        url: the store URL.

    Yields:
        None, while the lock is held.
    """
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        yield
        return
    folder = Path(url[len(prefix) :]).parent
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


class StoreBusy(BadInput):
    """A local tracking store another process is writing runs to (the message names it)."""


LOCK_NAME = "bisect-eagle.run-lock"  # in a folder store; beside a SQLite database: <db>.run-lock


def lock_path(uri: str) -> Path | None:
    """The lock file of a local tracking store.

    Args:
        uri: the MLflow tracking URI.

    Returns:
        ``<db>.run-lock`` beside a ``sqlite:///`` database, :data:`LOCK_NAME` inside a folder
        (``file:`` or a plain path); None for a remote store (a database server or an MLflow
        server), which several nodes share on purpose.
    """
    parts = urlsplit(uri)
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///") :])
        return db.with_name(db.name + ".run-lock")
    if parts.scheme == "file":
        return Path(parts.path) / LOCK_NAME
    if parts.scheme == "" and uri:
        return Path(uri) / LOCK_NAME
    return None


def command_line() -> str:
    """This process's command line as a person typed it (``bisect-eagle run spec.yaml``), URL
    passwords and secret values hidden."""
    argv = list(sys.argv)
    if Path(argv[0]).name in ("bisect-eagle", "__main__.py"):  # the script, or python -m
        argv[0] = "bisect-eagle"
    return Scrubber()(shlex.join(redact_url(a) for a in argv))


def _holder(path: Path) -> tuple[str, str]:
    """Who holds the lock at ``path``, and its command, from what it wrote there."""
    try:
        held = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        held = {}
    if not held.get("pid"):
        return "another process (starting: it has not written its name yet)", ""
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(held.get("started", 0)))
    command = str(held.get("command", "?"))
    return f"pid {held['pid']} on {held.get('host', '?')} ({command}, started {started})", command


@contextlib.contextmanager
def store_lock(uri: str, *, command: str | None = None) -> Iterator[None]:
    """Hold the tracking store at ``uri`` for one measuring command while the block runs; a remote
    store is not held (:func:`lock_path`).

    The lock is an ``flock`` on :func:`lock_path`, which the kernel releases when the process ends
    however it ends (SIGKILL included): a dead holder never blocks the next command. The holder
    writes its pid, host, ``command`` and start time into the file.

    Args:
        uri: the MLflow tracking URI.
        command: how the holder is named to a second command (default :func:`command_line`).

    Raises:
        StoreBusy: another process holds the store; the message names it and says what to do.

    Yields:
        None, while the store is held.
    """
    path = lock_path(uri)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who, what = _holder(path)
            join = (
                "; to measure its study from here too, use `bisect-eagle worker`"
                if " run" in what
                else ""
            )
            raise StoreBusy(
                f"tracking store {path.parent}: {who} is writing runs to it; one run per store at "
                "a time: wait for it to end, or give another --tracking-uri (or work in another "
                f"folder){join}"
            ) from None
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": command or command_line(),
            "started": int(time.time()),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # released: nobody to name
    finally:
        os.close(fd)  # releases the lock
