"""vLLM's own parser and engine-args resolution, asked from vLLM's own interpreter: the oracle of
every vllm plan.

:class:`Oracle` starts :mod:`.oracle_script` once in the interpreter that has vLLM
(``engine.vllm.python``, else the launch command's own ``python``), in its own process group, and
asks it, per trial, what vLLM's api_server parser says (its exact ``api_server.py: error: …`` text)
and what ``AsyncEngineArgs.create_engine_config`` makes of the arguments under the trial's
environment: dtype, max model length, the speculative method, token count and the EAGLE-3 aux layer
ids vLLM's model runner will capture (from vLLM's own functions), or vLLM's exception with the
``file:line`` that raised it. Importing vLLM takes seconds (half a minute on a cold 2-core machine);
each later answer takes well under a second, so one process serves every plan of a study. Answers
are cached per request.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_eagle.engines.oracle import Description, Option, OracleProcess
from bisect_eagle.errors import BadInput

__all__ = ["Description", "Option", "Oracle", "VllmVerdict", "interpreter", "resolve_executable"]

SCRIPT = Path(__file__).resolve().parent / "oracle_script.py"
START_TIMEOUT_S = 300.0  # importing vLLM on a cold, loaded 2-core machine
ANSWER_TIMEOUT_S = 180.0  # the first resolution of a model can inspect its class in a subprocess


@dataclass(frozen=True)
class VllmVerdict:
    """vLLM's answer for one launch: accepted (with what it resolved) or refused (stage, message,
    file:line)."""

    ok: bool
    stage: str  # "parse" | "validate" | "config" | "" when accepted
    error: str | None
    where: str
    resolved: dict[str, Any] | None
    version: str | None
    # warnings vLLM logged while resolving (informative: vLLM logs some only once)
    log: tuple[str, ...] = ()


class Oracle(OracleProcess):
    """vLLM's oracle process (:class:`~bisect_eagle.engines.oracle.OracleProcess`).

    Args:
        python: the interpreter that has vLLM.
    """

    script = SCRIPT
    env_prefixes = ("VLLM_", "CUDA_", "HF_")
    start_timeout_s = START_TIMEOUT_S
    answer_timeout_s = ANSWER_TIMEOUT_S
    version_key = "vllm_version"
    fix = (
        "point engine.vllm.python (or --vllm-python) at an environment with vLLM "
        "(scripts/setup_vllm_env.sh)"
    )

    def __init__(self, *, python: str):
        super().__init__(python=python)
        self._cache: dict[str, VllmVerdict] = {}
        self.version: str | None = None

    def _argv(self) -> list[str]:
        return ["--ready"]

    def _env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1"}

    def _start_failure(self, first: dict | None) -> str:
        why = (first or {}).get("error", f"no answer within {START_TIMEOUT_S:.0f} s")
        return f"{self.python} cannot import vLLM: {why}"

    def _ready(self, first: dict) -> None:
        self.version = first.get("vllm_version")

    def judge(
        self,
        argv: list[str],
        *,
        env: dict[str, str],
        draft: dict | None = None,
        resolve: bool = True,
    ) -> VllmVerdict | None:
        """vLLM's verdict on ``argv`` (the arguments after the launch command) under ``env``; None
        without an oracle.

        Args:
            argv: the api_server arguments.
            env: the trial's variables, set on top of the oracle's environment for this request
                only.
            draft: ``{"source", "top_level_ids", "placeholder"}``: judge with a throwaway copy of
                the draft whose config.json carries the trial's ids, standing where ``placeholder``
                is in ``argv``.
            resolve: False: the parser and the entry point's argument checks only (no config is
                read).

        Returns:
            The verdict (kept per request), or None when the oracle does not answer.

        Raises:
            BadInput: the oracle itself failed on this launch.
        """
        request = {
            "op": "judge",
            "argv": list(argv),
            "env": dict(env),
            "draft": draft,
            "resolve": resolve,
        }
        key = json.dumps(request, sort_keys=True)
        if key not in self._cache:
            answer = self._ask(request)
            if answer is None:
                return None
            if answer.get("stage") == "oracle":
                raise BadInput(f"the vLLM oracle failed on this launch: {answer.get('error')}")
            self._cache[key] = VllmVerdict(
                bool(answer.get("ok")),
                answer.get("stage", ""),
                answer.get("error"),
                answer.get("where", ""),
                answer.get("resolved"),
                answer.get("vllm_version"),
                tuple(answer.get("log") or ()),
            )
        return self._cache[key]


def resolve_executable(name: str, *, where: str) -> str:
    """``name`` as an absolute executable path (a bare name looked up on PATH); :class:`BadInput`
    when missing.

    Args:
        name: a path (it has a directory part or starts with ``.``) or a bare name.
        where: the setting, for errors.

    Returns:
        The absolute path.

    Raises:
        BadInput: a path that is not an executable file, or a name not on PATH.
    """
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
    """The interpreter vLLM runs in: ``engine.vllm.python``, the launch command's own python, or the
    python beside a console script (``vllm``).

    Args:
        launch_command: ``engine.vllm.launch_command``.
        python: ``engine.vllm.python``; None or empty when not set.

    Returns:
        The interpreter's path.

    Raises:
        BadInput: the python or the command cannot be found, or no python is beside the command.
    """
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
