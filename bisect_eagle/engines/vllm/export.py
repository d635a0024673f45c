"""How to serve a logged trial with vLLM (``bisect-eagle export``): its launch as the installed vLLM
accepts it.

:meth:`~bisect_eagle.engines.served.ServedEngine.export` frames the export; this module adds vLLM's
part. The trial's settings are planned by the vllm planner (:mod:`.planner`), with ``num_steps``
(vLLM's ``num_speculative_tokens``) and ``num_draft_tokens`` as the trial's own plan states them
(what was measured), and judged by vLLM's own parser and engine-args resolution when its interpreter
is here (``checked`` says by what).

The trial ran on a per-trial copy of the draft whose ``config.json`` carries its aux layer ids, in
vLLM's numbering, at the top level (where vLLM reads first; :mod:`.ids`). The export does the same:
when the trial set its ids, the argv names a copy of the draft beside it
(``<draft>-vllm-ids-2-6-10``), ``draft_source`` is the draft to copy and ``draft_config_patch``
(``{"eagle_aux_hidden_state_layer_ids": [...]}``) is what to merge into the copy's ``config.json``
(``draft_config``); the shipped draft is never changed. A trial that served the draft's own ids
names the draft itself, without a patch. Nothing is written here; secret values are never printed
(``$NAME`` in the environment, a hash (``<redacted sha256:…>``) in the argv).

The command runs as printed on the node: its interpreter is vLLM's (``engine.vllm.python`` or
``--vllm-python``), or the launch command's own when it names one. Where neither is known and this
machine's ``python`` cannot import vLLM, it is ``python3 -m vllm.entrypoints.openai.api_server ...``
and ``interpreter_note`` says what to point it at.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.engines.vllm.planner import Planner
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.spec.settings import LiveSettings


def draft_copy_dir(draft: Path, vllm_ids: list[int]) -> Path:
    """Where the exported launch expects the draft copy carrying ``vllm_ids`` at the top level:
    beside the draft."""
    return draft.parent / f"{draft.name}-vllm-ids-{'-'.join(str(i) for i in vllm_ids)}"


def measured_settings(settings: LiveSettings, effective: Mapping[str, Any]) -> LiveSettings:
    """``settings`` with the speculative depth the trial's plan states it measured (``num_steps``,
    which vLLM ran as ``num_speculative_tokens``, and ``num_draft_tokens`` = steps + 1)."""
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


def export_plan(
    planner: Planner, settings: LiveSettings, *, effective: Mapping[str, Any], port: int
) -> tuple[TrialPlan, dict[str, Any]]:
    """The vLLM plan of a logged trial (:func:`measured_settings`), naming the draft copy the
    trial's ids need.

    Args:
        planner: a planner of the spec's ``engine.vllm`` and draft.
        settings: the settings the trial requested (as logged).
        effective: the effective settings of the trial's plan (as logged).
        port: the exported server's port.

    Returns:
        (the plan, with the copy :func:`draft_copy_dir` in its argv when the trial set its ids, else
        the draft; ``server`` (``"vLLM"``), ``draft_config``, ``draft_source`` (the draft to copy;
        None for the baseline), ``draft_note`` (how to make the copy, for a person; None without
        one), ``server_version`` (the vLLM that judged it, None when unchecked) and ``warnings``).
    """
    draft = planner.draft
    settings = measured_settings(settings, effective)
    plan = planner.plan(settings, port=port, draft_dir=draft)
    ids = (plan.config_patch or {}).get(IDS_KEY)
    copy = None
    # served from a copy with the trial's ids at the top level, as the trial was
    if ids is not None:
        copy = draft_copy_dir(draft, ids)
        plan = planner.plan(settings, port=port, draft_dir=copy)
    warnings = list(plan.warnings)
    measured = effective.get("vllm_aux_layer_ids")
    served = plan.effective.get("vllm_aux_layer_ids")
    if (
        not settings.is_baseline
        and measured is not None
        and served is not None
        and measured != served
    ):
        warnings.append(
            f"the trial measured vLLM aux layer ids {measured}, this launch captures {served} (has "
            "the draft's config.json changed since?)"
        )
    note = (
        None
        if copy is None
        else (
            f"copy {draft} to {copy} (its files, or symlinks to them; the draft itself stays as it "
            f"is) and merge into {copy}/config.json (vLLM reads these top-level ids before "
            "eagle_config's):"
        )
    )
    return plan, {
        "draft_config": None if settings.is_baseline else str((copy or draft) / "config.json"),
        "draft_source": None if settings.is_baseline else str(draft),
        "draft_note": note,
        "server": "vLLM",
        "warnings": warnings,
        "server_version": planner.version(),
    }
