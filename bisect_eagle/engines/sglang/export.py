"""How to serve a logged trial with SGLang (``bisect-eagle export``): its launch as the installed
SGLang accepts it.

:meth:`~bisect_eagle.engines.served.ServedEngine.export` frames the export; this module adds
SGLang's part. The trial's settings are planned by the sglang planner (:mod:`.planner`), with
``num_draft_tokens`` as the trial's own plan states it (what was measured: the engine applied
SGLang's rules) and the draft directory itself in the argv; secret values are never printed
(``$NAME`` in the environment, a hash (``<redacted sha256:…>``) in the argv).

The command runs as printed on the node: its interpreter is SGLang's (``engine.sglang.python`` or
``--sglang-python``), or the launch command's own when it names one. Where neither is known and this
machine's ``python`` cannot import SGLang, it is ``python3 -m sglang.launch_server ...`` and
``interpreter_note`` says what to point it at (never this tool's interpreter, which cannot run
SGLang).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bisect_eagle.engines import served
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.engines.sglang.oracle import STAND_IN_PARSER, parser_spec
from bisect_eagle.engines.sglang.planner import Planner
from bisect_eagle.spec.settings import LiveSettings

STAND_IN_NOTE = (
    "this spec's engine launches the stand-in `bisect-eagle serve` (SGLang's flags and HTTP API on "
    "the CPU), not SGLang: the command serves the tiny pair here, not a deployment"
)


def export_plan(
    planner: Planner, settings: LiveSettings, *, effective: Mapping[str, Any], port: int
) -> tuple[TrialPlan, dict[str, Any]]:
    """The SGLang plan of a logged trial, with ``num_draft_tokens`` as the trial's own plan states
    it, and its warnings (the stand-in named first).

    Args:
        planner: a planner of the spec's ``engine.sglang``.
        settings: the settings the trial requested (as logged).
        effective: the effective settings of the trial's plan (as logged).
        port: the exported server's port.

    Returns:
        (the plan with the draft itself in its argv, ``{"warnings": [...]}``).
    """
    if not settings.is_baseline and effective.get("num_draft_tokens") is not None:
        settings = settings.model_validate(
            {
                **settings.model_dump(exclude_unset=True),
                "num_draft_tokens": effective["num_draft_tokens"],
            }
        )
    plan = planner.plan(settings, port=port, draft_dir=planner.draft)
    warnings = list(plan.warnings)
    if parser_spec(list(planner.server.launch_command)) == STAND_IN_PARSER:
        warnings.insert(0, STAND_IN_NOTE)
    return plan, {"warnings": warnings}


def node_argv(
    argv: list[str], *, launch_command: list[str], python: str | None, checked: str
) -> tuple[list[str], str | None]:
    """The launch argv as it runs on the node, and a note on its interpreter (None when it is
    known): :func:`~bisect_eagle.engines.served.node_argv` for a launch of SGLang itself (another
    server's, e.g. the stand-in's, runs as it is).

    Args:
        argv: the plan's argv, its program resolved on this machine.
        launch_command: the spec's ``engine.sglang.launch_command`` (``[python, -m,
            sglang.launch_server]``).
        python: the interpreter that has SGLang (spec or ``--sglang-python``), None when not given.
        checked: what checked the plan; ``not checked ...`` when this machine's interpreter cannot
            import SGLang.

    Returns:
        (the argv, the note).
    """
    if parser_spec(launch_command) != "sglang":
        return argv, None
    return served.node_argv(
        argv,
        launch_command=launch_command,
        python=python,
        checked=checked,
        label="SGLang",
        key="sglang",
    )
