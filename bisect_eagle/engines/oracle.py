"""The long-lived oracle subprocess protocol shared by the sglang and vllm engines.

Both engines ask the server's own code (its parser, its settings resolution) from the server's own
interpreter: a script runs once there, in its own process group, answers one JSON line on start and
then one JSON line per JSON request on stdin. :class:`OracleProcess` holds that protocol (start,
read with a timeout, ask, describe, close) and the parser's shape (:class:`Option`,
:class:`Description`); each engine's ``oracle`` module subclasses it with its script, timeouts,
environment and its own ``judge``. Shared so that the two engines start, time out and kill their
oracles in one way. A process keeps one oracle per interpreter (:meth:`OracleProcess.shared`):
starting one imports the server's code (6-10 s for SGLang), and the planners, the doctor and the
export of one command, or the tests of one worker, would each pay it again. An interpreter that
exits before its first answer (a broken environment) is :class:`InterpreterDied`: one line with its
exit code and the last line it wrote on stderr, told at once.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from bisect_eagle.errors import BadInput

STDERR_LINES = 20  # the tail of an oracle's stderr kept for the line that says why it died
OracleT = TypeVar("OracleT", bound="OracleProcess")
_SHARED: dict[tuple, OracleProcess] = {}  # this process's oracles (OracleProcess.shared)
_SHARED_LOCK = threading.Lock()


class InterpreterDied(BadInput):
    """An engine's interpreter that exits before it answers: the message names it, its exit code and
    what it last wrote on stderr, then the fix."""


def died_line(python: str, code: int | None, stderr: str | list[str], *, fix: str) -> str:
    """``PYTHON exited before answering (exit code N): LAST STDERR LINE; FIX``: the one line of a
    dying interpreter.

    Args:
        python: the interpreter.
        code: its exit code.
        stderr: what it wrote on stderr (text, or its lines); the last non-empty line is quoted, cut
            to 300 characters.
        fix: what to do about it.
    """
    lines = stderr.splitlines() if isinstance(stderr, str) else stderr
    last = next((line.strip() for line in reversed(lines) if line.strip()), None)
    said = f": {last[:300]}" if last else ", writing nothing on stderr"
    return f"{python} exited before answering (exit code {code}){said}; {fix}"


@dataclass(frozen=True)
class Option:
    """One option of the server's parser."""

    flags: tuple[str, ...]
    dest: str
    default: Any
    choices: tuple[Any, ...] | None
    takes_value: bool
    boolean_optional: bool  # --x / --no-x


@dataclass
class Description:
    """The server's parser as its own code builds it."""

    prog: str
    version: str | None
    options: list[Option]
    by_flag: dict[str, Option] = field(init=False)

    def __post_init__(self) -> None:
        self.by_flag = {f: o for o in self.options for f in o.flags}

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(self.by_flag)

    def dest_of(self) -> dict[str, str]:
        """Each flag's argparse dest.

        Returns:
            Flag -> dest, for every flag of every option.
        """
        return {f: o.dest for f, o in self.by_flag.items()}


class OracleProcess:
    """A long-lived oracle process; thread-safe; :meth:`close` (or process exit) ends it.

    Subclasses set :attr:`script`, the timeouts and :attr:`version_key`, and may override
    :meth:`_argv`, :meth:`_env`, :meth:`_start_failure` and :meth:`_ready`.
    """

    script: ClassVar[Path]
    # the environment variables an answer may depend on: an oracle is shared only under the same
    # values of those (the rest of the environment is the first start's)
    env_prefixes: ClassVar[tuple[str, ...]] = ()
    start_timeout_s: ClassVar[float]
    answer_timeout_s: ClassVar[float]
    version_key: ClassVar[str] = "version"  # the describe answer's key for the server's version
    # said when the interpreter dies
    fix: ClassVar[str] = "point it at a working environment of the server"

    def __init__(self, *, python: str):
        self.python = python
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._description: Description | None = None
        self._cache: dict = {}
        # why the oracle could not start (then plans say "not checked")
        self.failure: str | None = None
        self.stderr: deque[str] = deque(maxlen=STDERR_LINES)  # the tail of the oracle's stderr
        self.is_shared = False  # kept by shared(): its users do not close it

    @classmethod
    def shared(cls: type[OracleT], **kwargs: str) -> OracleT:
        """This process's one oracle of this class for ``kwargs``, started on its first question and
        kept for every later caller; one that failed (it could not start, it died, it did not answer
        in time) is replaced by a fresh one. Shared oracles end when the process exits
        (:func:`close_shared`, registered with :mod:`atexit`); one whose controller is killed
        outright reads the end of its stdin and exits.

        Args:
            **kwargs: the constructor's arguments (``python``, and a subclass's own).

        Returns:
            The oracle (started lazily, as a new one is).
        """
        env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(cls.env_prefixes)))
        key = (cls, tuple(sorted(kwargs.items())), env if cls.env_prefixes else ())
        with _SHARED_LOCK:
            oracle = _SHARED.get(key)
            if oracle is None or oracle.failure is not None:
                if oracle is not None:
                    oracle.close()
                oracle = _SHARED[key] = cls(**kwargs)
                oracle.is_shared = True
            return oracle

    def _argv(self) -> list[str]:
        """The script's arguments after its path."""
        return []

    def _env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONUNBUFFERED": "1"}

    def _start_failure(self, first: dict | None) -> str:
        """Why the oracle did not start, from its first answer (None: no answer in time)."""
        why = (first or {}).get("error", "no answer")
        return f"{self.python} cannot start its oracle: {why}"

    def _ready(self, first: dict) -> None:
        """The oracle's first answer, when it is ok."""

    def _start(self) -> subprocess.Popen | None:
        if self._proc is not None or self.failure is not None:
            return self._proc
        try:
            proc = subprocess.Popen(
                [self.python, str(self.script), *self._argv()],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=self._env(),
                start_new_session=True,
            )
        except OSError as e:
            self.failure = f"cannot run {self.python}: {e}"
            return None
        drain = threading.Thread(
            target=self._drain, args=(proc,), name="oracle-stderr", daemon=True
        )
        drain.start()
        first = self._read(proc, self.start_timeout_s)
        if first is None:  # no answer: an end of its output is its exit
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
        if first is None and proc.returncode is not None:  # it died: say so now, with what it said
            drain.join(timeout=5)
            self.failure = died_line(self.python, proc.returncode, list(self.stderr), fix=self.fix)
            kill(proc)
            raise InterpreterDied(self.failure)
        if first is None or not first.get("ok"):
            self.failure = self._start_failure(first)
            kill(proc)
            return None
        self._ready(first)
        self._proc = proc
        return proc

    def _drain(self, proc: subprocess.Popen) -> None:
        """Keep the tail of the oracle's stderr (read to its end, so that the oracle never blocks on
        a full pipe)."""
        with contextlib.suppress(OSError, ValueError):
            for line in proc.stderr:
                self.stderr.append(line.rstrip("\n"))

    @staticmethod
    def _read(proc: subprocess.Popen, timeout_s: float) -> dict | None:
        """One JSON answer within ``timeout_s``; None at once when the process exits without one."""
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout_s
        while reader.is_alive() and time.monotonic() < deadline:
            reader.join(min(0.2, max(0.0, deadline - time.monotonic())))
            # exited: its last line, if any, is read at once
            if reader.is_alive() and proc.poll() is not None:
                reader.join(1.0)
                break
        if not box or not box[0]:
            return None
        try:
            answer = json.loads(box[0])
        except json.JSONDecodeError:
            return None
        return answer if isinstance(answer, dict) else None

    def _ask(self, request: dict) -> dict | None:
        with self._lock:
            proc = self._start()
            if proc is None:
                return None
            try:
                proc.stdin.write(json.dumps(request) + "\n")
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                self.failure = "the oracle process exited"
                self._proc = None
                return None
            answer = self._read(proc, self.answer_timeout_s)
            if answer is None:
                self.failure = f"the oracle gave no answer within {self.answer_timeout_s:.0f} s"
                kill(proc)
                self._proc = None
            return answer

    @property
    def available(self) -> bool:
        """Whether the server's own parser answers (starts the oracle on first use)."""
        return self.describe() is not None

    def describe(self) -> Description | None:
        """The parser's options, defaults and choices (None when the oracle cannot run).

        Returns:
            The description (asked once, then kept), or None.
        """
        if self._description is None and self.failure is None:
            answer = self._ask({"op": "describe"})
            if answer is not None and answer.get("ok"):
                self._description = Description(
                    answer["prog"],
                    answer.get(self.version_key),
                    [
                        Option(
                            tuple(o["flags"]),
                            o["dest"],
                            o["default"],
                            None if o["choices"] is None else tuple(o["choices"]),
                            o["takes_value"],
                            o["boolean_optional"],
                        )
                        for o in answer["options"]
                    ],
                )
        return self._description

    def close(self) -> None:
        """End the process, if it runs (a later question starts a new one)."""
        with self._lock:
            if self._proc is not None:
                kill(self._proc)
                self._proc = None

    def __del__(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None:
            kill(proc)


def close_shared() -> None:
    """End every oracle :meth:`OracleProcess.shared` kept (at exit, and for a caller that needs none
    left running)."""
    with _SHARED_LOCK:
        oracles = list(_SHARED.values())
        _SHARED.clear()
    for oracle in oracles:
        oracle.close()


atexit.register(close_shared)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``'s whole process group and reap it.

    Args:
        proc: a process started as the leader of its own group.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
