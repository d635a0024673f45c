"""vLLM's own parser and engine-args resolution, asked from vLLM's own interpreter: the oracle of every vllm plan.

:class:`Oracle` starts :mod:`.oracle_script` once in the interpreter that has vLLM (``engine.vllm.python``, else
the launch command's own ``python``), in its own process group, and asks it, per trial, what vLLM's api_server
parser says (its exact ``api_server.py: error: …`` text) and what ``AsyncEngineArgs.create_engine_config`` makes of
the arguments under the trial's environment: dtype, max model length, the speculative method, token count and the
EAGLE-3 aux layer ids vLLM's model runner will capture (from vLLM's own functions), or vLLM's exception with the
``file:line`` that raised it. Importing vLLM takes seconds (half a minute on a cold 2-core machine); each later
answer takes well under a second, so one process serves every plan of a study. Answers are cached per request.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_eagle.errors import BadInput

SCRIPT = Path(__file__).resolve().parent / "oracle_script.py"
START_TIMEOUT_S = 300.0  # importing vLLM on a cold, loaded 2-core machine
ANSWER_TIMEOUT_S = 180.0  # the first resolution of a model can inspect its class in a subprocess


@dataclass(frozen=True)
class Option:
    """One option of vLLM's api_server parser."""

    flags: tuple[str, ...]
    dest: str
    default: Any
    choices: tuple[Any, ...] | None
    takes_value: bool
    boolean_optional: bool  # --x / --no-x


@dataclass
class Description:
    """The api_server parser as vLLM builds it."""

    prog: str
    version: str | None
    options: list[Option]
    by_flag: dict[str, Option] = field(init=False)

    def __post_init__(self) -> None:
        self.by_flag = {f: o for o in self.options for f in o.flags}

    def dest_of(self) -> dict[str, str]:
        return {f: o.dest for f, o in self.by_flag.items()}


@dataclass(frozen=True)
class VllmVerdict:
    """vLLM's answer for one launch: accepted (with what it resolved) or refused (stage, message, file:line)."""

    ok: bool
    stage: str  # "parse" | "validate" | "config" | "" when accepted
    error: str | None
    where: str
    resolved: dict[str, Any] | None
    version: str | None
    log: tuple[str, ...] = ()  # warnings vLLM logged while resolving (informative: vLLM logs some only once)


class Oracle:
    """A long-lived oracle process; thread-safe; :meth:`close` (or process exit) ends it.

    Args:
        python: the interpreter that has vLLM.
    """

    def __init__(self, *, python: str):
        self.python = python
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._description: Description | None = None
        self._cache: dict[str, VllmVerdict] = {}
        self.version: str | None = None
        self.failure: str | None = None  # why the oracle could not start (then plans say "not checked")

    def _start(self) -> subprocess.Popen | None:
        if self._proc is not None or self.failure is not None:
            return self._proc
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1"}
        try:
            proc = subprocess.Popen([self.python, str(SCRIPT), "--ready"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                    start_new_session=True)
        except OSError as e:
            self.failure = f"cannot run {self.python}: {e}"
            return None
        first = self._read(proc, START_TIMEOUT_S)
        if first is None or not first.get("ok"):
            why = (first or {}).get("error", f"no answer within {START_TIMEOUT_S:.0f} s")
            self.failure = f"{self.python} cannot import vLLM: {why}"
            _kill(proc)
            return None
        self.version = first.get("vllm_version")
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
            answer = self._read(proc, ANSWER_TIMEOUT_S)
            if answer is None:
                self.failure = f"the oracle gave no answer within {ANSWER_TIMEOUT_S:.0f} s"
                _kill(proc)
                self._proc = None
            return answer

    @property
    def available(self) -> bool:
        """Whether vLLM's own parser answers (starts the oracle on first use)."""
        return self.describe() is not None

    def describe(self) -> Description | None:
        """The parser's options, defaults and choices (None when the oracle cannot run)."""
        if self._description is None and self.failure is None:
            answer = self._ask({"op": "describe"})
            if answer is not None and answer.get("ok"):
                self._description = Description(answer["prog"], answer.get("vllm_version"), [
                    Option(tuple(o["flags"]), o["dest"], o["default"],
                           None if o["choices"] is None else tuple(o["choices"]), o["takes_value"],
                           o["boolean_optional"]) for o in answer["options"]])
        return self._description

    def judge(self, argv: list[str], *, env: dict[str, str], draft: dict | None = None,
              resolve: bool = True) -> VllmVerdict | None:
        """vLLM's verdict on ``argv`` (the arguments after the launch command) under ``env``; None without an oracle.

        Args:
            argv: the api_server arguments.
            env: the trial's variables, set on top of the oracle's environment for this request only.
            draft: ``{"source", "top_level_ids", "placeholder"}``: judge with a throwaway copy of the draft whose
                config.json carries the trial's ids, standing where ``placeholder`` is in ``argv``.
            resolve: False: the parser and the entry point's argument checks only (no config is read).
        """
        request = {"op": "judge", "argv": list(argv), "env": dict(env), "draft": draft, "resolve": resolve}
        key = json.dumps(request, sort_keys=True)
        if key not in self._cache:
            answer = self._ask(request)
            if answer is None:
                return None
            if answer.get("stage") == "oracle":
                raise BadInput(f"the vLLM oracle failed on this launch: {answer.get('error')}")
            self._cache[key] = VllmVerdict(bool(answer.get("ok")), answer.get("stage", ""), answer.get("error"),
                                           answer.get("where", ""), answer.get("resolved"),
                                           answer.get("vllm_version"), tuple(answer.get("log") or ()))
        return self._cache[key]

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


def resolve_executable(name: str, *, where: str) -> str:
    """``name`` as an absolute executable path (a bare name looked up on PATH); :class:`BadInput` when missing."""
    path = Path(name).expanduser()
    if path.parent != Path(".") or name.startswith("."):
        if path.is_file() and os.access(path, os.X_OK):
            return str(path.absolute())
        raise BadInput(f"{where}: {name} is not an executable file")
    found = shutil.which(name)
    if found is None:
        raise BadInput(f"{where}: {name} is not on PATH")
    return found


def interpreter(*, launch_command: list[str], python: str | None) -> str:
    """The interpreter vLLM runs in: ``engine.vllm.python``, the launch command's own python, or the python beside
    a console script (``vllm``)."""
    if python:
        return resolve_executable(python, where="engine.vllm.python")
    head = launch_command[0]
    exe = resolve_executable(head, where="engine.vllm.launch_command")
    if Path(head).name.startswith("python"):
        return exe
    beside = Path(exe).parent / "python"
    if beside.exists():
        return str(beside)
    raise BadInput(f"engine.vllm.launch_command: no python beside {exe}; set engine.vllm.python")
