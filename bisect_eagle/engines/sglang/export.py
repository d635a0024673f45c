"""How to serve a logged trial with SGLang (``bisect-eagle export``): its launch as the installed SGLang accepts it.

The trial's settings are planned by the sglang planner (:mod:`.planner`), with ``num_draft_tokens`` as the
trial's own plan states it (what was measured: the engine applied SGLang's rules) and the draft directory
itself in the argv; secret values are never printed (``$NAME`` in the environment, a hash
(``<redacted sha256:…>``) in the argv).

The command runs as printed on the node: its interpreter is SGLang's (``engine.sglang.python`` or
``--sglang-python``), or the launch command's own when it names one. Where neither is known and this machine's
``python`` cannot import SGLang, it is ``python3 -m sglang.launch_server ...`` and ``interpreter_note`` says what
to point it at (never this tool's interpreter, which cannot run SGLang).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bisect_eagle.engines.sglang.oracle import STAND_IN_PARSER, parser_spec
from bisect_eagle.engines.sglang.planner import Planner
from bisect_eagle.spec.schema import Spec
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.redact import is_hidden


def export(spec: Spec, settings: LiveSettings, *, effective: Mapping[str, Any], port: int,
           python: str | None = None) -> dict[str, Any]:
    """The SGLang launch of a logged trial (:meth:`~bisect_eagle.engines.base.Engine.export`: its arguments and
    what it returns), plus ``interpreter_note`` (what to point ``python3`` at; None when the interpreter is known)."""
    server = spec.engine.sglang
    if python:
        server = server.model_copy(update={"python": python})
    if not settings.is_baseline and effective.get("num_draft_tokens") is not None:
        settings = settings.model_validate({**settings.model_dump(exclude_unset=True),
                                            "num_draft_tokens": effective["num_draft_tokens"]})
    draft = Path(spec.draft)
    planner = Planner(server, Path(spec.target), draft, draft.parent)
    try:
        plan = planner.plan(settings, port=port, draft_dir=draft)
    finally:
        planner.close()
    argv, note = node_argv(list(plan.argv or []), launch_command=list(server.launch_command), python=server.python,
                           checked=plan.checked)
    warnings = list(plan.warnings)
    if parser_spec(list(server.launch_command)) == STAND_IN_PARSER:
        warnings.insert(0, "this spec's engine launches the stand-in `bisect-eagle serve` (SGLang's flags and HTTP "
                           "API on the CPU), not SGLang: the command serves the tiny pair here, not a deployment")
    return {"argv": argv, "command": shlex.join(argv),
            "env": {k: (f"${k}" if is_hidden(v) else v) for k, v in (plan.env or {}).items()},
            "draft_config": None if settings.is_baseline else str(draft / "config.json"),
            "draft_config_patch": plan.config_patch, "checked": plan.checked, "refusal": plan.refusal,
            "fingerprint": plan.fingerprint, "warnings": warnings, "interpreter_note": note}


def node_argv(argv: list[str], *, launch_command: list[str], python: str | None,
              checked: str) -> tuple[list[str], str | None]:
    """The launch argv as it runs on the node, and a note on its interpreter (None when it is known).

    Args:
        argv: the plan's argv, its program resolved on this machine.
        launch_command: the spec's ``engine.sglang.launch_command`` (``[python, -m, sglang.launch_server]``).
        python: the interpreter that has SGLang (spec or ``--sglang-python``), None when not given.
        checked: what checked the plan; ``not checked ...`` when this machine's interpreter cannot import SGLang.
    """
    head = launch_command[0] if launch_command else ""
    if (python or not argv or "/" in head or not head.startswith("python") or parser_spec(launch_command) != "sglang"
            or not checked.startswith("not checked")):
        return argv, None
    return ["python3", *argv[1:]], ("python3: the interpreter that has SGLang on the node (its environment's "
                                    "bin/python); set engine.sglang.python in the spec or give --sglang-python "
                                    "to print its path here")
