"""EAGLE-3 aux layer ids as vLLM 0.32 reads them, and the trial's ids converted into vLLM's
convention.

vLLM's convention (``vllm/model_executor/models/llama.py:425-441`` ``LlamaModel.forward``): id ``L``
is the input to decoder layer ``L``, i.e. the Hugging Face ``hidden_states[L]``, the project's
canonical index (:mod:`bisect_eagle.artifacts.layers` row ``vllm``: offset 0, ids 0..N). A trial's
requested ids are in SGLang's convention for the target's family (``LiveSettings``); they are
converted through the canonical index.

Where vLLM reads the ids of a draft (``vllm/v1/worker/gpu_model_runner.py:5251-5285``
``_get_eagle3_aux_layers_from_config``): the top-level ``eagle_aux_hidden_state_layer_ids`` when
non-empty, else ``eagle_config.eagle_aux_hidden_state_layer_ids`` **verbatim** (a SpecForge/SGLang
draft's nested ids, written in SGLang's convention, are read one layer shallower), else the target
model's default ``(2, N//2, N-3)`` (``vllm/model_executor/models/interfaces.py:1712-1733``). The
draft's ``fc`` takes ``num_aux_hidden_states`` states, else as many as the nested ids, else 3
(``vllm/model_executor/models/llama_eagle3.py:209-216``); the top-level ids do not size it. So the
engine writes the trial's ids at the top level of a per-trial copy and leaves the nested ones alone.

vLLM does not check the ids at start: ``-1`` passes startup and kills the engine at the first
request (``RuntimeError: shape '[-1, 576]' is invalid for input of size 24576`` in the draft's
``fc``, measured on the tiny pair; ``tests/engines/vllm/fixtures/engine-dead-first-request.log``),
so ids outside ``[0, N]`` are refused here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bisect_eagle.artifacts import capture, layers
from bisect_eagle.keys import IDS_KEY

DEFAULT_AUX = 3  # llama_eagle3.py: fc width without num_aux_hidden_states or nested ids
READS = "vllm/v1/worker/gpu_model_runner.py:5251 _get_eagle3_aux_layers_from_config"
FC_WIDTH = "vllm/model_executor/models/llama_eagle3.py:209-216"


@dataclass(frozen=True)
class DraftIds:
    """What vLLM reads from a draft's ``config.json``."""

    top_level: list[int] | None  # eagle_aux_hidden_state_layer_ids
    nested: list[int] | None  # eagle_config.eagle_aux_hidden_state_layer_ids
    fc_width: int  # aux states the draft's fc takes
    fc_source: str  # the key fc_width comes from

    @property
    def read(self) -> tuple[list[int] | None, str]:
        """(ids vLLM captures, where from: ``top-level``, ``eagle_config`` or ``default``); None =
        the default."""
        if self.top_level:
            return list(self.top_level), "top-level"
        if self.nested:
            return list(self.nested), "eagle_config"
        return None, "default"


def _int_list(value: Any) -> list[int] | None:
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
    ):
        return [int(i) for i in value]
    return None


def draft_ids(config: dict) -> DraftIds:
    """vLLM's reading of a draft ``config.json`` (already parsed): top-level and nested ids, fc
    width.

    Args:
        config: the draft's parsed config.json.

    Returns:
        The ids at both places (None where absent or not a list of ints) and the fc width with the
        key it comes from (``num_aux_hidden_states``, the nested ids, else vLLM's default).
    """
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    top, nested = _int_list(config.get(IDS_KEY)), _int_list(eagle.get(IDS_KEY))
    n_aux = config.get("num_aux_hidden_states")
    if isinstance(n_aux, int) and not isinstance(n_aux, bool) and n_aux > 0:
        width, source = n_aux, "num_aux_hidden_states"
    elif nested:
        width, source = len(nested), f"eagle_config.{IDS_KEY}"
    else:
        width, source = DEFAULT_AUX, f"vLLM's default of {DEFAULT_AUX}"
    return DraftIds(top, nested, width, source)


def default_ids(num_layers: int) -> list[int]:
    """vLLM's default aux layers for a target of ``num_layers`` decoder layers
    (``interfaces.py:1733``)."""
    return [2, num_layers // 2, num_layers - 3]


def to_vllm(ids: list[int], *, model_type: str | None, num_layers: int | None) -> list[int]:
    """A request's ids (SGLang's convention for ``model_type``) as vLLM ids (= canonical indices).

    Without the target's depth the family rule of plain ``sglang`` (+1 per id) is applied without a
    range check. Raises :class:`~bisect_eagle.artifacts.layers.LayerIdError` for ids the convention
    does not allow.
    """
    conv = capture.sglang_convention(model_type)
    if num_layers is None:
        return [i + layers.convention("sglang").offset for i in ids]
    return layers.ids_to_canonical(ids, conv, num_layers=num_layers)


def from_vllm(
    ids: list[int], *, model_type: str | None, num_layers: int | None
) -> list[int] | None:
    """vLLM ids back in SGLang's convention for ``model_type`` (None where they have no such
    ids)."""
    if num_layers is None:
        return None
    try:
        return layers.canonical_to_ids(
            ids, capture.sglang_convention(model_type), num_layers=num_layers
        )
    except layers.LayerIdError:
        return None


def refusal(ids: list[int], *, num_layers: int | None, source: str) -> str | None:
    """Why vLLM must not be launched with these aux layer ids (None when they are fine).

    ``source`` says where the ids come from, for the message. Without the target's depth only
    negative ids are refused.

    Args:
        ids: vLLM aux layer ids (L = hidden_states[L]).
        num_layers: the target's depth; None when unknown.
        source: where the ids come from.

    Returns:
        The reason, or None.
    """
    hi = num_layers if num_layers is not None else None
    bad = [i for i in ids if i < 0 or (hi is not None and i > hi)]
    if not bad:
        return None
    where = f"[0, {hi}] for a {hi}-layer target" if hi is not None else "[0, N]"
    text = (
        f"vLLM aux layer ids {ids} ({source}): {bad} outside {where} (vLLM id L = "
        "hidden_states[L], 0 = the embedding)"
    )
    if any(i < 0 for i in bad):
        text += (
            "; vLLM 0.32 accepts -1 at start and its engine dies at the first request "
            "(RuntimeError: shape '[-1, …]' is invalid for input of size … in the draft's fc: a "
            "state is never captured)"
        )
    return text
