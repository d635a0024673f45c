"""SGLang's own parser and settings resolution, asked from its own interpreter: the oracle of every
sglang plan.

:class:`Oracle` starts :mod:`.oracle_script` once in the interpreter that runs SGLang
(``engine.sglang.python``, else the launch command's own ``python``), in its own process group, and
asks it, per trial argv, what SGLang's parser says (its exact ``sglang serve: error: …`` line) and
what ``ServerArgs.resolve_once`` makes of the arguments (resolved steps, topk, draft tokens,
attention backend, page size, max running requests …, or SGLang's own exception). Answers are cached
per argv. Resolution reads the target's ``config.json``, so it runs only when ``--model-path`` is a
directory readable here and this host has the launch's accelerators; otherwise the argv is parsed
only, and the plan says so (``resolution needs the node's GPUs: not resolved here`` where the
devices are missing: never a refusal).

Which parser: ``sglang`` for ``python -m sglang.launch_server`` / ``sglang serve`` launch commands,
the stand-in's own (``bisect_eagle.engines.serve:build_parser``) for ``bisect-eagle serve``. Any
other server has no oracle; its flags are checked against its ``--help`` only (:mod:`.flags`).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_eagle.engines.oracle import Description, Option, OracleProcess
from bisect_eagle.errors import BadInput

__all__ = ["Description", "Option", "Oracle", "SglangVerdict", "interpreter", "parser_spec"]

SCRIPT = Path(__file__).resolve().parent / "oracle_script.py"
STAND_IN_PARSER = "bisect_eagle.engines.serve:build_parser"
START_TIMEOUT_S = 180.0  # importing SGLang's server_args takes seconds, more on a cold disk
ANSWER_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class SglangVerdict:
    """SGLang's answer for one argv: accepted (with resolved values when resolution ran) or
    refused."""

    ok: bool
    stage: str  # "parse" | "resolve" | "" when accepted
    error: str | None
    resolved: dict[str, Any] | None  # None: not resolved (parse only)
    where: str = ""  # SGLang file:line of a resolution error
    # why resolution did not run on this host (its accelerators); not a refusal
    unresolved: str | None = None


def parser_spec(launch_command: list[str]) -> str | None:
    """Which parser judges this launch command: ``sglang``, the stand-in's, or None (no oracle)."""
    words = [Path(w).name for w in launch_command]
    if any(w.startswith("sglang") for w in words) or (
        len(words) >= 3 and words[1] == "-m" and words[2].startswith("sglang")
    ):
        return "sglang"
    if words and words[0].startswith("bisect-eagle") and "serve" in words[1:]:
        return STAND_IN_PARSER
    if len(words) >= 3 and words[1] == "-m" and words[2] == "bisect_eagle.engines.serve":
        return STAND_IN_PARSER
    return None


class Oracle(OracleProcess):
    """SGLang's oracle process (:class:`~bisect_eagle.engines.oracle.OracleProcess`) for one
    parser."""

    script = SCRIPT
    env_prefixes = ("SGLANG_", "CUDA_", "HF_")
    start_timeout_s = START_TIMEOUT_S
    answer_timeout_s = ANSWER_TIMEOUT_S
    fix = (
        "point engine.sglang.python (or --sglang-python) at an environment with SGLang "
        "(scripts/setup_sglang_env.sh)"
    )

    def __init__(self, *, python: str, parser: str):
        super().__init__(python=python)
        self.parser = parser
        self._cache: dict[tuple[tuple[str, ...], bool], SglangVerdict] = {}

    def _argv(self) -> list[str]:
        return [self.parser]

    def _env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONUNBUFFERED": "1", "SGLANG_LOG_LEVEL": "error"}

    def _start_failure(self, first: dict | None) -> str:
        why = (first or {}).get("error", "no answer")
        return f"{self.python} cannot import the server's parser ({self.parser}): {why}"

    def judge(self, argv: list[str], *, resolve: bool) -> SglangVerdict | None:
        """SGLang's verdict on ``argv`` (the arguments after the launch command); None without an
        oracle.

        Args:
            argv: the arguments after the launch command.
            resolve: whether to run SGLang's own resolution after parsing.

        Returns:
            The verdict (kept per argv), or None when the oracle does not answer.

        Raises:
            BadInput: the oracle itself failed on this argv.
        """
        key = (tuple(argv), resolve)
        if key not in self._cache:
            answer = self._ask({"op": "resolve", "argv": list(argv), "resolve": resolve})
            if answer is None:
                return None
            if answer.get("stage") == "oracle":
                raise BadInput(f"the SGLang oracle failed on this argv: {answer.get('error')}")
            self._cache[key] = SglangVerdict(
                bool(answer["ok"]),
                answer.get("stage", ""),
                answer.get("error"),
                answer.get("resolved"),
                answer.get("where", ""),
                answer.get("unresolved"),
            )
        return self._cache[key]

    def capture(self, architecture: str, config: dict, ids: list[int] | None) -> dict | None:
        """SGLang's own capture hook of ``architecture`` on ``ids`` (oracle_script ``capture``);
        None without an oracle or when SGLang has no such class / cannot import it here.

        Args:
            architecture: the target's model class name.
            config: the target's config.json.
            ids: the layer ids; None for the hook's default.

        Returns:
            The oracle's answer (kept per request), or None.
        """
        key = (("capture", architecture, json.dumps(config, sort_keys=True), json.dumps(ids)), True)
        if key not in self._cache:
            answer = self._ask(
                {"op": "capture", "architecture": architecture, "config": config, "ids": [ids]}
            )
            if answer is None or not answer.get("ok"):
                return None
            self._cache[key] = answer  # type: ignore[assignment]
        return self._cache[key]  # type: ignore[return-value]


def interpreter(*, launch_command: list[str], python: str | None, parser: str) -> str:
    """The interpreter the oracle runs in: ``engine.sglang.python``, the launch command's own
    python, or this one for the stand-in.

    Args:
        launch_command: ``engine.sglang.launch_command``.
        python: ``engine.sglang.python``; None or empty when not set.
        parser: the oracle's parser (the stand-in runs in this interpreter).

    Returns:
        The interpreter's path.

    Raises:
        BadInput: the python or the launch command's head cannot be found.
    """
    from bisect_eagle.engines.sglang.flags import resolve_executable

    if parser == STAND_IN_PARSER:
        return sys.executable
    if python:
        return resolve_executable(python, where="engine.sglang.python")
    head = launch_command[0]
    if Path(head).name.startswith("python"):
        return resolve_executable(head, where="engine.sglang.launch_command")
    exe = Path(resolve_executable(head, where="engine.sglang.launch_command"))
    # a console script (``sglang``) lives beside its environment's python
    beside = exe.parent / "python"
    return str(beside) if beside.exists() else sys.executable
