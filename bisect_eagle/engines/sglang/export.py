"""How to serve a logged trial with SGLang (``bisect-eagle export``): its launch as the installed SGLang accepts it.

The trial's settings are planned by the sglang planner (:mod:`.planner`), with ``num_draft_tokens`` as the
trial's own plan states it (what was measured: the engine applied SGLang's rules) and the draft directory
itself in the argv; secret values are never printed (``$NAME`` in the environment, ``<redacted>`` in the argv).
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
from bisect_eagle.tracking.redact import REDACTED


def export(spec: Spec, settings: LiveSettings, *, effective: Mapping[str, Any], port: int,
           python: str | None = None) -> dict[str, Any]:
    """The SGLang launch of a logged trial (:meth:`~bisect_eagle.engines.base.Engine.export`: its arguments and
    what it returns)."""
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
    argv = list(plan.argv or [])
    warnings = list(plan.warnings)
    if parser_spec(list(server.launch_command)) == STAND_IN_PARSER:
        warnings.insert(0, "this spec's engine launches the stand-in `bisect-eagle serve` (SGLang's flags and HTTP "
                           "API on the CPU), not SGLang: the command serves the tiny pair here, not a deployment")
    return {"argv": argv, "command": shlex.join(argv),
            "env": {k: (f"${k}" if v == REDACTED else v) for k, v in (plan.env or {}).items()},
            "draft_config": None if settings.is_baseline else str(draft / "config.json"),
            "draft_config_patch": plan.config_patch, "checked": plan.checked, "refusal": plan.refusal,
            "fingerprint": plan.fingerprint, "warnings": warnings}
