"""The command line's one logging policy and what a store's failure is.

Every log record (a library's or this tool's) reaches stderr as one scrubbed line, never a traceback
(:class:`OneLineLog`); a store's failure (a full disk, a read-only store, a store that went away:
:func:`store_failure`) is said once, by the entry point, with its fix (:func:`store_failure_line`).
"""

from __future__ import annotations

import errno
import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bisect_eagle.tracking.redact import Scrubber


# the loggers MLflow gives a handler of its own
LIBRARY_LOGGERS = ("mlflow", "sqlalchemy.engine", "alembic", "huey")
# store-failure lines kept for the end of a command that does not end on the store's failure
HELD_MAX = 20


class OneLineLog(logging.Handler):
    """The command line's one logging policy: every record (a library's or this tool's) reaches
    stderr as one line, scrubbed of secrets, never with a traceback (``warning: message (logger)``).

    A record whose exception is a store's failure (:func:`store_failure`: a library logging the
    error it then raises, a heartbeat that could not write) is held back instead: such a command
    ends on that failure, said in one line by the entry point, and :meth:`take_held` hands the held
    lines back for a command that ends otherwise.
    """

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.held: list[str] = []
        self.scrub: Scrubber | None = None

    def emit(self, record: logging.LogRecord) -> None:
        """Write ``record`` to stderr as one scrubbed line, or hold it back (a store's failure).

        Args:
            record: the log record.
        """
        try:
            exc = record.exc_info[1] if record.exc_info else None
            text = next(
                (line.strip() for line in record.getMessage().splitlines() if line.strip()), ""
            )
            if not text and exc is not None:
                text = f"{type(exc).__name__}: {first_line(exc)}"
            where = "" if record.name.startswith("bisect_eagle") else f" ({record.name})"
            line = f"{record.levelname.lower()}: {text[:300]}{where}"
            if self.scrub is None:
                from bisect_eagle.tracking.redact import Scrubber

                self.scrub = Scrubber()
            line = self.scrub(line)
            if exc is not None and store_failure(exc) is not None:
                if len(self.held) < HELD_MAX:
                    self.held.append(line)
                return
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 (logging never raises into the code that logs)
            self.handleError(record)

    def take_held(self) -> list[str]:
        """The held lines, emptied (the command ended: the next one scrubs with its own
        environment)."""
        held, self.held, self.scrub = self.held, [], None
        return held


LOG = OneLineLog()


def quiet_libraries() -> None:
    """Keep Optuna's per-trial lines, MLflow's store messages and artifact progress bars off the
    terminal, and put every logger under :data:`LOG` (one line a record, no library traceback) until
    the command ends."""
    import optuna

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # read when mlflow is imported: its store messages
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    # MLflow's own switch: no stderr handler of its own
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.logging.disable_default_handler()
    optuna.logging.enable_propagation()
    # MLflow imported already: its handlers go, its records come to LOG
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    for name in ("mlflow", "alembic", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)
    root = logging.getLogger()
    if LOG not in root.handlers:
        root.addHandler(LOG)


def end_logging() -> list[str]:
    """Take :data:`LOG` off the root logger (the command ended); the lines it held back.

    Returns:
        The held-back lines (:meth:`OneLineLog.take_held`).
    """
    logging.getLogger().removeHandler(LOG)
    return LOG.take_held()


def first_line(e: BaseException) -> str:
    """The first non-empty line of an exception's message, at most 300 characters (its type when it
    has none)."""
    return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)[
        :300
    ]


FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
READ_ONLY_ERRNOS = (errno.EROFS,)
STORE_ERROR_MODULES = ("mlflow.", "sqlalchemy.", "sqlite3", "optuna.storages", "psycopg")
FULL_TEXTS = ("database or disk is full", "no space left on device", "disk quota exceeded")
READ_ONLY_TEXTS = (
    "attempt to write a readonly database",
    "read-only file system",
    "read-only transaction",
)


def store_failure(e: BaseException | None) -> str | None:
    """What a store's failure is, from an exception and its chain of causes: ``full`` (a full disk
    or quota, a file that may not grow), ``read_only`` (a store this process may not write),
    ``failed`` (any other error of a store's client: MLflow, SQLAlchemy, SQLite, Optuna's storage,
    psycopg), or None (not a store's failure).

    Args:
        e: the exception; None for none.

    Returns:
        ``full``, ``read_only``, ``failed`` or None.
    """
    found = _store_cause(e)
    return None if found is None else found[0]


def _store_cause(e: BaseException | None) -> tuple[str, BaseException] | None:
    """(:func:`store_failure`'s kind, the exception of the chain that says it: the deepest that says
    so)."""
    chain = []
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for cause in reversed(chain):
        text = str(cause).lower()
        if (isinstance(cause, OSError) and cause.errno in FULL_ERRNOS) or any(
            t in text for t in FULL_TEXTS
        ):
            return "full", cause
        if (isinstance(cause, OSError) and cause.errno in READ_ONLY_ERRNOS) or any(
            t in text for t in READ_ONLY_TEXTS
        ):
            return "read_only", cause
    return next(
        (
            ("failed", c)
            for c in chain
            if (type(c).__module__ or "").startswith(STORE_ERROR_MODULES)
            or type(c).__name__ == "StorageInternalError"
        ),
        None,
    )


def store_failure_line(e: BaseException) -> tuple[str, int]:
    """The one line (and the exit code) of a store's failure: a full disk or a read-only store is 2
    with the fix, any other failure 1.

    Args:
        e: a store's failure (any exception reads as ``failed``).

    Returns:
        The line, starting ``error:``, and the exit code.
    """
    kind, cause = _store_cause(e) or ("failed", e)
    said = f"{type(cause).__name__}: {first_line(cause)}"
    if kind == "full":
        return (
            f"error: the disk of the tracking or study store is full ({said}): free space, then "
            "run the command again (`run` continues with --resume)"
        ), 2
    if kind == "read_only":
        return (
            f"error: the tracking or study store is read-only ({said}): make it writable, or give "
            "--tracking-uri (and --storage) of a store you can write"
        ), 2
    return (
        f"error: the tracking or study store failed: {said} (restore the store, then continue with "
        "--resume)"
    ), 1
