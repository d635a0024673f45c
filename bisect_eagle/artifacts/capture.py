"""SGLang 0.5.23's capture of ``eagle_aux_hidden_state_layer_ids``, by target model class: the rule
each class's ``set_eagle3_layers_to_capture`` applies, which hidden states it then captures, and
what SGLang does with an id it never captures.

The table is the fallback when no SGLang is at hand ("not checked against SGLang");
``tests/artifacts/test_capture_sglang.py`` keeps it equal to SGLang's own hook for every class of
``sglang.srt.models`` that implements it. Ids are converted to and from the canonical layer index by
:mod:`bisect_eagle.artifacts.layers`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class CaptureRule:
    """How one SGLang model class turns ``eagle_aux_hidden_state_layer_ids`` into captured hidden
    states.

    ``rule`` maps ids to ``layers_to_capture`` entries (``sglang``: +1 each; ``sglang-deepseek``: +1
    only when the first id is 1; ``sglang-gptoss``: as given when the max id is N, else +1). Entry
    ``e`` captures ``hidden_states[e]`` (the input of layer ``e``) for ``0 <= e < N``; ``e == N``
    only where ``final`` (the final norm captures it); anything else is never captured, and
    ``failure`` says what SGLang then does.
    """

    rule: str = "sglang"
    final: bool = False
    default_shift: int = 0  # added to SGLang's default [2, N//2, N-3] (minimax_m3_vl: +1)
    # width: fc shape error at load | counted: 'captured k of n' | index: IndexError at start
    failure: str = "width"
    source: str = ""  # the SGLang 0.5.23 file the rule was read from


_DEEPSEEK = CaptureRule("sglang-deepseek", failure="counted", source="srt/models/deepseek_v2.py")
_INDEX = "index"

# SGLang 0.5.23's capture rule by model class (``architectures[0]`` of the target's config.json:
# SGLang picks its class by it). Every class not listed takes the default (+1, final never captured,
# width failure). This table is the fallback when no SGLang is at hand ("not checked against
# SGLang"); tests/artifacts/test_layers_sglang.py keeps it equal to SGLang 0.5.23's own hook for
# every class of sglang.srt.models that implements it.
SGLANG_ARCHITECTURES: dict[str, CaptureRule] = {
    "DeepseekV2ForCausalLM": _DEEPSEEK,
    "DeepseekV3ForCausalLM": _DEEPSEEK,
    "DeepseekV32ForCausalLM": _DEEPSEEK,
    "GlmMoeDsaForCausalLM": _DEEPSEEK,  # GLM-5: GlmMoeDsaForCausalLM(DeepseekV2ForCausalLM)
    # -> DeepseekV3
    "KimiK25ForConditionalGeneration": replace(_DEEPSEEK, source="srt/models/kimi_k25.py"),
    # (DeepseekV3...)
    "MistralLarge3ForCausalLM": replace(_DEEPSEEK, source="srt/models/mistral_large_3.py"),
    # no count
    "Glm4MoeLiteForCausalLM": CaptureRule("sglang-deepseek", source="srt/models/glm4_moe_lite.py"),
    "GptOssForCausalLM": CaptureRule("sglang-gptoss", final=True, source="srt/models/gpt_oss.py"),
    "MiniMaxM3SparseForCausalLM": CaptureRule(final=True, source="srt/models/minimax_m3.py"),
    "MiniMaxM3SparseForConditionalGeneration": CaptureRule(
        final=True, default_shift=1, source="srt/models/minimax_m3_vl.py"
    ),
    "Qwen2MoeForCausalLM": CaptureRule(failure=_INDEX, source="srt/models/qwen2_moe.py"),
    "Qwen3MoeForCausalLM": CaptureRule(failure=_INDEX, source="srt/models/qwen3_moe.py"),
    "Qwen3NextForCausalLM": CaptureRule(failure=_INDEX, source="srt/models/qwen3_next.py"),
    "MellumForCausalLM": CaptureRule(failure=_INDEX, source="srt/models/mellum.py"),
}

# The same rules by the target's ``model_type``, for a config.json without ``architectures``.
SGLANG_MODEL_TYPES: dict[str, str] = {
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "deepseek_v32": "DeepseekV32ForCausalLM",
    "kimi_k2": "DeepseekV3ForCausalLM",
    "kimi_k25": "KimiK25ForConditionalGeneration",
    # model_type as its checkpoints spell it: not verified
    "mistral_large_3": "MistralLarge3ForCausalLM",
    "glm_moe_dsa": "GlmMoeDsaForCausalLM",
    "glm4_moe_lite": "Glm4MoeLiteForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "minimax_m3": "MiniMaxM3SparseForCausalLM",
    "minimax_m3_vl": "MiniMaxM3SparseForConditionalGeneration",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
}

# How SGLang's ``set_eagle3_layers_to_capture`` reads ids, by the target's ``model_type`` (derived
# from the table above). Anything else: +1 per id.
SGLANG_FAMILIES: dict[str, str] = {
    t: SGLANG_ARCHITECTURES[a].rule
    for t, a in SGLANG_MODEL_TYPES.items()
    if SGLANG_ARCHITECTURES[a].rule != "sglang"
}


def capture_rule(model_type: str | None = None, architecture: str | None = None) -> CaptureRule:
    """SGLang's capture rule for a target (by its model class, else its ``model_type``); the default
    otherwise.

    Args:
        model_type: the target config's ``model_type`` (None: unknown).
        architecture: the target config's ``architectures[0]``, SGLang's model class (None:
            unknown).

    Returns:
        The rule from :data:`SGLANG_ARCHITECTURES`; the default rule (+1, final never captured) for
        a class and model type the table does not list.
    """
    if architecture and architecture in SGLANG_ARCHITECTURES:
        return SGLANG_ARCHITECTURES[architecture]
    arch = SGLANG_MODEL_TYPES.get(model_type or "")
    return SGLANG_ARCHITECTURES[arch] if arch else CaptureRule()


def sglang_convention(model_type: str | None, architecture: str | None = None) -> str:
    """The convention SGLang applies to ``eagle_aux_hidden_state_layer_ids`` on a target of
    ``model_type``.

    Args:
        model_type: the target config's ``model_type`` (None: unknown).
        architecture: the target config's ``architectures[0]``; it wins over ``model_type``.

    Returns:
        ``"sglang"``, ``"sglang-deepseek"`` or ``"sglang-gptoss"``: a name :func:`ids_to_canonical`
        takes.
    """
    return capture_rule(model_type, architecture).rule


@dataclass(frozen=True)
class SglangCapture:
    """Which hidden states SGLang captures for one id list on one target, and who said so."""

    ids: list[int] | None
    entries: list[int] | None  # SGLang's layers_to_capture (None when the hook raised)
    captures: list[int | None]  # hidden_states index per entry; None: never captured
    error: str | None  # an exception of SGLang's hook itself
    rule: str  # the rule, in words, for a refusal to quote
    checked: str  # "SGLang 0.5.23 <module.Class>" or "not checked against SGLang (...)"
    failure: str = "width"

    @property
    def missed(self) -> list[int]:
        """The ids (as given) whose state SGLang never captures."""
        if self.ids is None or self.entries is None:
            return []
        return [i for i, c in zip(self.ids, self.captures, strict=False) if c is None]


def _entries(ids: Sequence[int], rule: str, num_layers: int) -> list[int]:
    ids = list(ids)
    if rule == "sglang-deepseek":
        return [i + 1 for i in ids] if ids and ids[0] == 1 else ids
    if rule == "sglang-gptoss":
        return ids if ids and max(ids) == num_layers else [i + 1 for i in ids]
    return [i + 1 for i in ids]


RULE_WORDS = {
    "sglang": "each id L captures hidden_states[L + 1]",
    "sglang-deepseek": (
        "ids are captured as given (hidden_states[L], layer inputs) unless the first id is 1, "
        "then +1"
    ),
    "sglang-gptoss": "ids are captured as given when the max id is N, else +1",
}


def rule_text(rule: CaptureRule, num_layers: int) -> str:
    final = (
        f"hidden_states[{num_layers}] (the final state) is captured"
        if rule.final
        else f"only hidden_states[0..{num_layers - 1}] (layer inputs) are captured"
    )
    return f"{RULE_WORDS[rule.rule]}; {final}"


def predicted_capture(
    ids: Sequence[int] | None, rule: CaptureRule, *, num_layers: int
) -> SglangCapture:
    """What SGLang 0.5.23 captures for ``ids`` by this project's table (no SGLang asked).

    Args:
        ids: the draft's ``eagle_aux_hidden_state_layer_ids`` as SGLang reads them; None: SGLang's
            defaults ``[2, N//2, N-3]`` (shifted by the rule's ``default_shift``).
        rule: the target's capture rule (:func:`capture_rule`).
        num_layers: the target's decoder layers N.

    Returns:
        The capture: per entry the ``hidden_states`` index captured or None, the error SGLang's hook
        would raise (``entries`` None then), the rule in words, and ``checked`` saying no SGLang was
        asked.
    """
    n = num_layers
    entries = (
        [i + rule.default_shift for i in (2, n // 2, n - 3)]
        if ids is None
        else _entries(ids, rule.rule, n)
    )
    error = None
    if rule.failure == _INDEX and any(e >= n for e in entries):
        error = (
            f"IndexError: list index out of range (self.layers[{max(entries)}] of {n} layers; "
            f"{rule.source})"
        )
    captures = [e if 0 <= e < n else (n if e == n and rule.final else None) for e in entries]
    return SglangCapture(
        None if ids is None else list(ids),
        None if error else entries,
        captures,
        error,
        rule_text(rule, n),
        "not checked against SGLang (the project's table of SGLang 0.5.23)",
        rule.failure,
    )
