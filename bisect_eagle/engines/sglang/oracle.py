"""SGLang's own parser and settings resolution, asked from its own interpreter: the oracle of every sglang plan.

:class:`Oracle` starts :mod:`.oracle_script` once in the interpreter that runs SGLang (``engine.sglang.python``,
else the launch command's own ``python``), in its own process group, and asks it, per trial argv, what
SGLang's parser says (its exact ``sglang serve: error: …`` line) and what ``ServerArgs.resolve_once`` makes of
the arguments (resolved steps, topk, draft tokens, attention backend, page size, max running requests …, or
SGLang's own exception). Answers are cached per argv. Resolution reads the target's ``config.json``, so it
runs only when ``--model-path`` is a directory readable here; otherwise the argv is parsed only, and the plan
says so.

Which parser: ``sglang`` for ``python -m sglang.launch_server`` / ``sglang serve`` launch commands, the
stand-in's own (``bisect_eagle.engines.serve:build_parser``) for ``bisect-eagle serve``. Any other server has no
oracle; its flags are checked against its ``--help`` only (:mod:`.flags`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_eagle.errors import BadInput

SCRIPT = Path(__file__).resolve().parent / "oracle_script.py"
STAND_IN_PARSER = "bisect_eagle.engines.serve:build_parser"
START_TIMEOUT_S = 180.0  # importing SGLang's server_args takes seconds, more on a cold disk
ANSWER_TIMEOUT_S = 120.0


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


@dataclass(frozen=True)
class SglangVerdict:
    """SGLang's answer for one argv: accepted (with resolved values when resolution ran) or refused."""

    ok: bool
    stage: str  # "parse" | "resolve" | "" when accepted
    error: str | None
    resolved: dict[str, Any] | None  # None: not resolved (parse only)
    where: str = ""  # SGLang file:line of a resolution error


def parser_spec(launch_command: list[str]) -> str | None:
    """Which parser judges this launch command: ``sglang``, the stand-in's, or None (no oracle)."""
    words = [Path(w).name for w in launch_command]
    if any(w.startswith("sglang") for w in words) or (len(words) >= 3 and words[1] == "-m"
                                                       and words[2].startswith("sglang")):
        return "sglang"
    if words and words[0].startswith("bisect-eagle") and "serve" in words[1:]:
        return STAND_IN_PARSER
    if len(words) >= 3 and words[1] == "-m" and words[2] == "bisect_eagle.engines.serve":
        return STAND_IN_PARSER
    return None


class Oracle:
    """A long-lived oracle process; thread-safe; :meth:`close` (or process exit) ends it."""

    def __init__(self, *, python: str, parser: str):
        self.python, self.parser = python, parser
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._description: Description | None = None
        self._cache: dict[tuple[tuple[str, ...], bool], SglangVerdict] = {}
        self.failure: str | None = None  # why the oracle could not start (then plans say "not checked")

    def _start(self) -> subprocess.Popen | None:
        if self._proc is not None or self.failure is not None:
            return self._proc
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SGLANG_LOG_LEVEL": "error"}
        try:
            proc = subprocess.Popen([self.python, str(SCRIPT), self.parser], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                    start_new_session=True)
        except OSError as e:
            self.failure = f"cannot run {self.python}: {e}"
            return None
        first = self._read(proc, START_TIMEOUT_S)
        if first is None or not first.get("ok"):
            why = (first or {}).get("error", "no answer")
            self.failure = f"{self.python} cannot import the server's parser ({self.parser}): {why}"
            _kill(proc)
            return None
        self._proc = proc
        return proc

    @staticmethod
    def _read(proc: subprocess.Popen, timeout_s: float) -> dict | None:
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not box or not box[0]:
            return None
        try:
            return json.loads(box[0])
        except json.JSONDecodeError:
            return None

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
            answer = self._read(proc, ANSWER_TIMEOUT_S)
            if answer is None:
                self.failure = f"the oracle gave no answer within {ANSWER_TIMEOUT_S:.0f} s"
                _kill(proc)
                self._proc = None
            return answer

    @property
    def available(self) -> bool:
        """Whether the server's own parser answers (starts the oracle on first use)."""
        return self.describe() is not None

    def describe(self) -> Description | None:
        """The parser's options, defaults and choices (None when the oracle cannot run)."""
        if self._description is None and self.failure is None:
            answer = self._ask({"op": "describe"})
            if answer is not None and answer.get("ok"):
                self._description = Description(answer["prog"], answer.get("version"), [
                    Option(tuple(o["flags"]), o["dest"], o["default"],
                           None if o["choices"] is None else tuple(o["choices"]), o["takes_value"],
                           o["boolean_optional"]) for o in answer["options"]])
        return self._description

    def judge(self, argv: list[str], *, resolve: bool) -> SglangVerdict | None:
        """SGLang's verdict on ``argv`` (the arguments after the launch command); None without an oracle."""
        key = (tuple(argv), resolve)
        if key not in self._cache:
            answer = self._ask({"op": "resolve", "argv": list(argv), "resolve": resolve})
            if answer is None:
                return None
            if answer.get("stage") == "oracle":
                raise BadInput(f"the SGLang oracle failed on this argv: {answer.get('error')}")
            self._cache[key] = SglangVerdict(bool(answer["ok"]), answer.get("stage", ""), answer.get("error"),
                                       answer.get("resolved"), answer.get("where", ""))
        return self._cache[key]

    def capture(self, architecture: str, config: dict, ids: list[int] | None) -> dict | None:
        """SGLang's own capture hook of ``architecture`` on ``ids`` (oracle_script ``capture``); None without an
        oracle or when SGLang has no such class / cannot import it here."""
        key = (("capture", architecture, json.dumps(config, sort_keys=True), json.dumps(ids)), True)
        if key not in self._cache:
            answer = self._ask({"op": "capture", "architecture": architecture, "config": config, "ids": [ids]})
            if answer is None or not answer.get("ok"):
                return None
            self._cache[key] = answer  # type: ignore[assignment]
        return self._cache[key]  # type: ignore[return-value]

    def close(self) -> None:
        with self._lock:
            if self._proc is not None:
                _kill(self._proc)
                self._proc = None

    def __del__(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None:
            _kill(proc)


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def interpreter(*, launch_command: list[str], python: str | None, parser: str) -> str:
    """The interpreter the oracle runs in: ``engine.sglang.python``, the launch command's own python, or this one
    for the stand-in."""
    from bisect_eagle.engines.sglang.flags import resolve_executable

    if parser == STAND_IN_PARSER:
        return sys.executable
    if python:
        return resolve_executable(python, where="engine.sglang.python")
    head = launch_command[0]
    if Path(head).name.startswith("python"):
        return resolve_executable(head, where="engine.sglang.launch_command")
    exe = Path(resolve_executable(head, where="engine.sglang.launch_command"))
    beside = exe.parent / "python"  # a console script (``sglang``) lives beside its environment's python
    return str(beside) if beside.exists() else sys.executable
