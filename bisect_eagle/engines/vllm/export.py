"""How to serve a logged trial with vLLM (``bisect-eagle export``): its launch as the installed vLLM accepts it.

The trial's settings are planned by the vllm planner (:mod:`.planner`), with ``num_steps`` (vLLM's
``num_speculative_tokens``) and ``num_draft_tokens`` as the trial's own plan states them (what was measured), and
judged by vLLM's own parser and engine-args resolution when its interpreter is here (``checked`` says by what).

The trial ran on a per-trial copy of the draft whose ``config.json`` carries its aux layer ids, in vLLM's numbering,
at the top level (where vLLM reads first; :mod:`.ids`). The export does the same: when the trial set its ids, the
argv names a copy of the draft beside it (``<draft>-vllm-ids-2-6-10``), ``draft_source`` is the draft to copy and
``draft_config_patch`` (``{"eagle_aux_hidden_state_layer_ids": [...]}``) is what to merge into the copy's
``config.json`` (``draft_config``); the shipped draft is never changed. A trial that served the draft's own ids
names the draft itself, without a patch. Nothing is written here; secret values are never printed (``$NAME`` in
the environment, a hash (``<redacted sha256:…>``) in the argv).

The command runs as printed on the node: its interpreter is vLLM's (``engine.vllm.python`` or ``--vllm-python``),
or the launch command's own when it names one. Where neither is known and this machine's ``python`` cannot import
vLLM, it is ``python3 -m vllm.entrypoints.openai.api_server ...`` and ``interpreter_note`` says what to point it at.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bisect_eagle.engines.vllm.ids import IDS_KEY
from bisect_eagle.engines.vllm.planner import Planner
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import Spec
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.redact import is_hidden


def draft_copy_dir(draft: Path, vllm_ids: list[int]) -> Path:
    """Where the exported launch expects the draft copy carrying ``vllm_ids`` at the top level: beside the draft."""
    return draft.parent / f"{draft.name}-vllm-ids-{'-'.join(str(i) for i in vllm_ids)}"


def measured_settings(settings: LiveSettings, effective: Mapping[str, Any]) -> LiveSettings:
    """``settings`` with the speculative depth the trial's plan states it measured (``num_steps``, which vLLM ran as
    ``num_speculative_tokens``, and ``num_draft_tokens`` = steps + 1)."""
    if settings.is_baseline:
        return settings
    update = {}
    steps = effective.get("num_steps")
    if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1:
        update["num_steps"] = steps
    tokens = effective.get("num_draft_tokens")
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 1:
        update["num_draft_tokens"] = tokens
    if not update:
        return settings
    return settings.model_validate({**settings.model_dump(exclude_unset=True), **update})


def export(spec: Spec, settings: LiveSettings, *, effective: Mapping[str, Any], port: int,
           python: str | None = None) -> dict[str, Any]:
    """The vLLM launch of a logged trial (:meth:`~bisect_eagle.engines.base.Engine.export`: its arguments and what
    it returns), plus ``server`` (``"vLLM"``), ``draft_source`` (the draft to copy; None for the baseline),
    ``draft_note`` (how to make the copy, for a person; None without one), ``server_version`` (the vLLM that
    judged it, None when unchecked) and ``interpreter_note`` (what to point ``python3`` at; None when known)."""
    server = spec.engine.vllm
    if python:
        server = server.model_copy(update={"python": python})
    if spec.draft is None and not settings.is_baseline:
        raise BadInput(f"{spec.source}: key 'draft' is missing: a speculative trial cannot be exported")
    target = spec.target if spec.target is not None else Path(server.model_path or "")
    draft = Path(spec.draft) if spec.draft is not None else Path(".")
    settings = measured_settings(settings, effective)
    planner = Planner(server, Path(target), draft)
    try:
        plan = planner.plan(settings, port=port, trial_dir=draft.parent, draft_dir=draft)
        ids = (plan.config_patch or {}).get(IDS_KEY)
        copy = None
        if ids is not None:  # served from a copy with the trial's ids at the top level, as the trial was
            copy = draft_copy_dir(draft, ids)
            plan = planner.plan(settings, port=port, trial_dir=draft.parent, draft_dir=copy)
        version = planner.version()
    finally:
        planner.close()
    warnings = list(plan.warnings)
    measured = effective.get("vllm_aux_layer_ids")
    served = plan.effective.get("vllm_aux_layer_ids")
    if not settings.is_baseline and measured is not None and served is not None and measured != served:
        warnings.append(f"the trial measured vLLM aux layer ids {measured}, this launch captures {served} (has the "
                        f"draft's config.json changed since?)")
    argv = list(plan.argv or [])
    note = None
    head = server.launch_command[0] if server.launch_command else ""
    if (not server.python and argv and "/" not in head and head.startswith("python")
            and plan.checked.startswith("not checked")):
        argv, note = ["python3", *argv[1:]], ("python3: the interpreter that has vLLM on the node (its environment's "
                                              "bin/python); set engine.vllm.python in the spec or give --vllm-python "
                                              "to print its path here")
    draft_config = None if settings.is_baseline else str((copy or draft) / "config.json")
    note = None if copy is None else (
        f"copy {draft} to {copy} (its files, or symlinks to them; the draft itself stays as it is) and merge into "
        f"{copy}/config.json (vLLM reads these top-level ids before eagle_config's):")
    return {"argv": argv, "command": shlex.join(argv),
            "env": {k: (f"${k}" if is_hidden(v) else v) for k, v in (plan.env or {}).items()},
            "draft_config": draft_config, "draft_config_patch": plan.config_patch,
            "draft_source": None if settings.is_baseline else str(draft), "draft_note": note, "server": "vLLM",
            "checked": plan.checked, "refusal": plan.refusal, "fingerprint": plan.fingerprint,
            "warnings": warnings, "server_version": version, "interpreter_note": note}
