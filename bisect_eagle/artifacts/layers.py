"""The one canonical meaning of a layer, and every framework's ids converted to and from it.

Canonical index = the Hugging Face ``hidden_states`` index: 0 is the embedding output, ``i`` is the
output of decoder layer ``i - 1`` (the pre-norm residual stream). Index ``N`` (N = number of decoder
layers) is the output of the last layer *before* the final norm -- what SGLang, vLLM and speculators
capture as the "final" state. (transformers 5 returns the post-norm state as ``hidden_states[N]``; we
never use that meaning.)

Frameworks differ only by an offset, a valid range and their defaults, so each convention is one row of
``CONVENTIONS``. SGLang's DeepSeek-family and GPT-OSS models decide the offset per *list* of ids; those
rules live in :func:`ids_to_canonical` / :func:`canonical_to_ids`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bisect_eagle.errors import BadInput


class LayerIdError(BadInput):
    """A layer id outside what the convention and target depth allow."""


@dataclass(frozen=True)
class Convention:
    """How one framework numbers aux hidden-state layers."""

    name: str
    meaning: str
    offset: int  # canonical = id + offset
    min_id: int
    max_id: Callable[[int], int]  # of the target depth N
    defaults: Callable[[int], list[int]]  # default ids, in this convention, for depth N


def _spread(n: int) -> list[int]:
    return [2, n // 2, n - 3]


CONVENTIONS: dict[str, Convention] = {
    c.name: c
    for c in [
        Convention(
            "sglang",
            "output of layer L (SGLang llama/qwen and most models); -1 = embedding output",
            1, -1, lambda n: n - 1,
            # SGLang's default captures hs[2], hs[N//2], hs[N-3] without its +1, i.e. these ids:
            lambda n: [i - 1 for i in _spread(n)],
        ),
        Convention(
            "specforge",
            "output of layer L (SpecForge); -1 = embedding output",
            1, -1, lambda n: n - 1,
            lambda n: [1, n // 2 - 1, n - 4],
        ),
        Convention(
            "vllm",
            "input to layer L (vLLM, current speculators); 0 = embedding, N = final pre-norm state",
            0, 0, lambda n: n,
            _spread,
        ),
        Convention(
            "speculators",
            "input to layer L (current speculators data); 0 = embedding, N = final pre-norm state",
            0, 0, lambda n: n,
            lambda n: [*_spread(n), n],
        ),
        Convention(
            "eagle",
            "state entering layer L (SafeAILab EAGLE-3)",
            0, 0, lambda n: n,
            _spread,
        ),
        Convention(
            "speculators-legacy",
            "output of layer L (legacy speculators .pt capture); N-1 = final pre-norm state",
            1, 0, lambda n: n - 1,
            lambda n: [2, n // 2, n - 3, n - 1],
        ),
    ]
}

# SGLang model families whose offset depends on the whole id list (docs/sglang-facts.md#layer-ids).
LIST_RULES = ("sglang-deepseek", "sglang-gptoss")

# How SGLang's ``set_eagle3_layers_to_capture`` reads ids, by the target's ``model_type`` (checked in CI
# against SGLang 0.5.23's model classes themselves: tests/test_layers_sglang.py). Anything else: +1 per id.
SGLANG_FAMILIES: dict[str, str] = {
    "deepseek_v2": "sglang-deepseek",  # +1 only when the first id is 1, else the ids as given (layer inputs)
    "deepseek_v3": "sglang-deepseek",
    "deepseek_v32": "sglang-deepseek",
    "kimi_k2": "sglang-deepseek",
    "glm_moe_dsa": "sglang-deepseek",  # GLM-5: GlmMoeDsaForCausalLM(DeepseekV2ForCausalLM)
    "glm4_moe_lite": "sglang-deepseek",
    "gpt_oss": "sglang-gptoss",  # unshifted when the max id is N, else +1
}


def sglang_convention(model_type: str | None) -> str:
    """The convention SGLang applies to ``eagle_aux_hidden_state_layer_ids`` on a target of ``model_type``."""
    return SGLANG_FAMILIES.get(model_type or "", "sglang")


def convention(name: str) -> Convention:
    """Look up a convention by name, with an error listing the known ones."""
    try:
        return CONVENTIONS[name]
    except KeyError:
        known = ", ".join([*CONVENTIONS, *LIST_RULES])
        raise LayerIdError(f"unknown layer-id convention {name!r}; expected one of: {known}") from None


def to_canonical(layer_id: int, conv: str, *, num_layers: int) -> int:
    """Convert one id of convention ``conv`` to the canonical hidden_states index."""
    c = convention(conv)
    hi = c.max_id(num_layers)
    if not c.min_id <= layer_id <= hi:
        raise LayerIdError(
            f"{conv} layer id {layer_id} is outside [{c.min_id}, {hi}] for a {num_layers}-layer target"
        )
    return layer_id + c.offset


def from_canonical(index: int, conv: str, *, num_layers: int) -> int:
    """Convert a canonical hidden_states index to an id of convention ``conv``."""
    c = convention(conv)
    if not 0 <= index <= num_layers:
        raise LayerIdError(f"hidden_states index {index} is outside [0, {num_layers}]")
    layer_id = index - c.offset
    if not c.min_id <= layer_id <= c.max_id(num_layers):
        raise LayerIdError(f"hidden_states index {index} has no {conv} layer id ({c.meaning})")
    return layer_id


def _list_offset(ids: Sequence[int], conv: str, num_layers: int) -> tuple[str, int]:
    """For SGLang's list-level rules: the per-id convention that applies to this list."""
    if conv == "sglang-deepseek":  # output-of only if the first id is 1 (sglang PR #25454), else input-to
        return ("sglang", 1) if ids and ids[0] == 1 else ("vllm", 0)
    if conv == "sglang-gptoss":  # unshifted if the max id is N, else +1
        return ("vllm", 0) if ids and max(ids) == num_layers else ("sglang", 1)
    return conv, convention(conv).offset


def ids_to_canonical(ids: Sequence[int], conv: str, *, num_layers: int) -> list[int]:
    """Convert a list of ids (order kept) to canonical indices."""
    per_id, _ = _list_offset(list(ids), conv, num_layers)
    return [to_canonical(i, per_id, num_layers=num_layers) for i in ids]


def canonical_to_ids(indices: Sequence[int], conv: str, *, num_layers: int) -> list[int]:
    """Convert canonical indices to a list of ids of ``conv`` that converts back to the same indices."""
    if conv == "sglang-gptoss":  # output-of ids never reach N, so the +1 reading always applies
        conv = "sglang"
    if conv == "sglang-deepseek":
        as_output = [from_canonical(i, "sglang", num_layers=num_layers) for i in indices]
        if as_output and as_output[0] == 1:
            return as_output
        as_input = [from_canonical(i, "vllm", num_layers=num_layers) for i in indices]
        if as_input and as_input[0] == 1:
            raise LayerIdError(
                f"hidden_states indices {list(indices)} cannot be written for SGLang DeepSeek-family models: "
                "a first id of 1 switches the whole list to output-of-layer meaning"
            )
        return as_input
    return [from_canonical(i, conv, num_layers=num_layers) for i in indices]


def default_canonical(conv: str, num_layers: int) -> list[int]:
    """The canonical indices a framework captures by default for a target of ``num_layers`` layers."""
    if conv in LIST_RULES:
        conv = "sglang"
    c = convention(conv)
    return [i + c.offset for i in c.defaults(num_layers)]


def describe(index: int, num_layers: int) -> str:
    """Human name of a canonical index: 'embedding', 'layer 4 output', or 'final (pre-norm)'."""
    if index == 0:
        return "embedding"
    if index == num_layers:
        return f"layer {index - 1} output (final, pre-norm)"
    return f"layer {index - 1} output"
