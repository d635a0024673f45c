"""The one canonical meaning of a layer, and every framework's ids converted to and from it.

Canonical index = the Hugging Face ``hidden_states`` index: 0 is the embedding output, ``i`` is the
output of decoder layer ``i - 1`` (the pre-norm residual stream). Index ``N`` (N = number of decoder
layers) is the output of the last layer *before* the final norm -- what SGLang, vLLM and speculators
capture as the "final" state. (transformers 5 returns the post-norm state as ``hidden_states[N]``;
we never use that meaning.)

Frameworks differ only by an offset, a valid range and their defaults, so each convention is one row
of ``CONVENTIONS``. SGLang's DeepSeek-family and GPT-OSS models decide the offset per *list* of ids;
those rules live in :func:`ids_to_canonical` / :func:`canonical_to_ids`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY


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
            1,
            -1,
            lambda n: n - 1,
            # SGLang's default captures hs[2], hs[N//2], hs[N-3] without its +1, i.e. these ids:
            lambda n: [i - 1 for i in _spread(n)],
        ),
        Convention(
            "specforge",
            "output of layer L (SpecForge); -1 = embedding output",
            1,
            -1,
            lambda n: n - 1,
            lambda n: [1, n // 2 - 1, n - 4],
        ),
        Convention(
            "vllm",
            "input to layer L (vLLM, current speculators); 0 = embedding, N = final pre-norm state",
            0,
            0,
            lambda n: n,
            _spread,
        ),
        Convention(
            "speculators",
            "input to layer L (current speculators data); 0 = embedding, N = final pre-norm state",
            0,
            0,
            lambda n: n,
            lambda n: [*_spread(n), n],
        ),
        Convention(
            "eagle",
            "state entering layer L (SafeAILab EAGLE-3)",
            0,
            0,
            lambda n: n,
            _spread,
        ),
        Convention(
            "speculators-legacy",
            "output of layer L (legacy speculators .pt capture); N-1 = final pre-norm state",
            1,
            0,
            lambda n: n - 1,
            lambda n: [2, n // 2, n - 3, n - 1],
        ),
    ]
}

# SGLang model families whose offset depends on the whole id list (docs/sglang-facts.md#layer-ids).
LIST_RULES = ("sglang-deepseek", "sglang-gptoss")


@dataclass(frozen=True)
class IdReader:
    """Whose loader reads a draft's layer ids, and how: what an engine declares about the drafts it
    serves (``bisect_eagle.engines.EngineKind.id_reader``), read by the draft config
    (:meth:`~bisect_eagle.artifacts.draft.config.DraftConfigFile.declared_ids`) and the doctor.

    ``name`` is the loader for messages: a framework's config reader, or bisect-eagle's own decoder.
    ``top_level`` is when it reads the top-level ids, in vLLM's convention: ``always`` (vLLM: else
    the nested ids, verbatim as vLLM ids), ``speculators`` (only on a speculators-layout draft; the
    nested ids in SGLang's convention otherwise), ``never`` (only the nested ids, in SGLang's
    convention). ``sglang_capture``: SGLang's own capture applies (its per-family id rules, -1 by
    its version, a final-layer id an error).
    """

    name: str
    top_level: Literal["always", "speculators", "never"]
    sglang_capture: bool

    @property
    def vllm_ids(self) -> bool:
        """Every id it reads is a vLLM id (0 is the embedding; -1 is no layer)."""
        return self.top_level == "always"

    def reads_top_level(self, layout: str) -> bool:
        """Whether it reads the top-level ids of a draft of ``layout``.

        Args:
            layout: the draft's checkpoint layout (``specforge``, ``speculators`` or ``unknown``).

        Returns:
            True where the top-level ids are the ones it takes.
        """
        return self.vllm_ids or (self.top_level == "speculators" and layout == "speculators")


SGLANG_READER = IdReader("sglang", "never", sglang_capture=True)
VLLM_READER = IdReader("vllm", "always", sglang_capture=False)
LOCAL_READER = IdReader("local", "speculators", sglang_capture=False)  # bisect-eagle's own decoder


def target_depth(cfg: dict) -> int | None:
    """``num_hidden_layers`` of a target's config.json, or of its ``text_config`` (multimodal
    wrappers).

    Args:
        cfg: the target's config.json as a dict.

    Returns:
        The decoder layer count; None when neither place holds an integer.
    """
    n = cfg.get("num_hidden_layers")
    text = cfg.get("text_config")
    if n is None and isinstance(text, dict):
        n = text.get("num_hidden_layers")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def target_architecture(cfg: dict) -> str | None:
    """The model class a target's config.json names first (what SGLang picks its class by).

    Args:
        cfg: the target's config.json as a dict.

    Returns:
        ``architectures[0]``; None when ``architectures`` is not a non-empty list starting with a
        string.
    """
    archs = cfg.get("architectures")
    return archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None


def convention(name: str) -> Convention:
    """Look up a convention by name, with an error listing the known ones.

    Args:
        name: a key of :data:`CONVENTIONS` (``"sglang"``, ``"vllm"``, ``"specforge"``, ...).

    Returns:
        The convention's row: offset, id range and defaults.

    Raises:
        LayerIdError: an unknown name (the list-level rules ``sglang-deepseek`` and
            ``sglang-gptoss`` are not rows either).
    """
    try:
        return CONVENTIONS[name]
    except KeyError:
        known = ", ".join([*CONVENTIONS, *LIST_RULES])
        raise LayerIdError(
            f"unknown layer-id convention {name!r}; expected one of: {known}"
        ) from None


def to_canonical(layer_id: int, conv: str, *, num_layers: int) -> int:
    """Convert one id of convention ``conv`` to the canonical hidden_states index."""
    c = convention(conv)
    hi = c.max_id(num_layers)
    if not c.min_id <= layer_id <= hi:
        raise LayerIdError(
            f"{conv} layer id {layer_id} is outside [{c.min_id}, {hi}] for a {num_layers}-layer "
            "target"
        )
    return layer_id + c.offset


def from_canonical(index: int, conv: str, *, num_layers: int) -> int:
    """Convert a canonical hidden_states index to an id of convention ``conv``.

    Args:
        index: the ``hidden_states`` index, in ``[0, num_layers]``.
        conv: a per-id convention name (:func:`convention`).
        num_layers: the target's decoder layers N.

    Returns:
        The id that means ``index`` in ``conv``.

    Raises:
        LayerIdError: ``index`` outside ``[0, num_layers]``, no id of ``conv`` means it (the
            embedding in ``speculators-legacy``), or an unknown convention.
    """
    c = convention(conv)
    if not 0 <= index <= num_layers:
        raise LayerIdError(f"hidden_states index {index} is outside [0, {num_layers}]")
    layer_id = index - c.offset
    if not c.min_id <= layer_id <= c.max_id(num_layers):
        raise LayerIdError(f"hidden_states index {index} has no {conv} layer id ({c.meaning})")
    return layer_id


def _list_offset(ids: Sequence[int], conv: str, num_layers: int) -> tuple[str, int]:
    """For SGLang's list-level rules: the per-id convention that applies to this list."""
    # output-of only if the first id is 1 (sglang PR #25454), else input-to
    if conv == "sglang-deepseek":
        return ("sglang", 1) if ids and ids[0] == 1 else ("vllm", 0)
    if conv == "sglang-gptoss":  # unshifted if the max id is N, else +1
        return ("vllm", 0) if ids and max(ids) == num_layers else ("sglang", 1)
    return conv, convention(conv).offset


def ids_to_canonical(ids: Sequence[int], conv: str, *, num_layers: int) -> list[int]:
    """Convert a list of ids (order kept) to canonical indices.

    Args:
        ids: layer ids as a framework reads them.
        conv: their convention: a per-id one, or the list-level ``sglang-deepseek`` /
            ``sglang-gptoss`` (whose offset depends on the whole list).
        num_layers: the target's decoder layers N.

    Returns:
        One ``hidden_states`` index in ``[0, num_layers]`` per id.

    Raises:
        LayerIdError: an id outside the convention's range for ``num_layers``, or an unknown
            convention.
    """
    per_id, _ = _list_offset(list(ids), conv, num_layers)
    return [to_canonical(i, per_id, num_layers=num_layers) for i in ids]


def canonical_to_ids(indices: Sequence[int], conv: str, *, num_layers: int) -> list[int]:
    """Convert canonical indices to a list of ids of ``conv`` that converts back to the same
    indices.

    Args:
        indices: ``hidden_states`` indices, in ``[0, num_layers]``.
        conv: the convention to write (per-id or list-level, as in :func:`ids_to_canonical`).
        num_layers: the target's decoder layers N.

    Returns:
        The ids, one per index, order kept.

    Raises:
        LayerIdError: an index with no id in ``conv``, or a list SGLang's DeepSeek rule cannot
            express (the input-of ids would start with 1, which switches the list to output-of
            meaning).
    """
    if conv == "sglang-gptoss":  # output-of ids never reach N, so the +1 reading always applies
        conv = "sglang"
    if conv == "sglang-deepseek":
        as_output = [from_canonical(i, "sglang", num_layers=num_layers) for i in indices]
        if as_output and as_output[0] == 1:
            return as_output
        as_input = [from_canonical(i, "vllm", num_layers=num_layers) for i in indices]
        if as_input and as_input[0] == 1:
            raise LayerIdError(
                f"hidden_states indices {list(indices)} cannot be written for SGLang "
                "DeepSeek-family models: a first id of 1 switches the whole list to "
                "output-of-layer meaning"
            )
        return as_input
    return [from_canonical(i, conv, num_layers=num_layers) for i in indices]


def default_canonical(conv: str, num_layers: int) -> list[int]:
    """The canonical indices a framework captures by default for a target of ``num_layers``
    layers."""
    if conv in LIST_RULES:
        conv = "sglang"
    c = convention(conv)
    return [i + c.offset for i in c.defaults(num_layers)]


def describe(index: int, num_layers: int) -> str:
    """Human name of a canonical index: 'embedding', 'layer 4 output', or 'final (pre-norm)'.

    Args:
        index: the ``hidden_states`` index.
        num_layers: the target's decoder layers N.

    Returns:
        ``"embedding"`` for 0, ``"layer {index-1} output (final, pre-norm)"`` for N, else
        ``"layer {index-1} output"``.
    """
    if index == 0:
        return "embedding"
    if index == num_layers:
        return f"layer {index - 1} output (final, pre-norm)"
    return f"layer {index - 1} output"


def fc_width_refusal(
    ids: Sequence[int], *, width: int, where: str, said_by: str, named: str = IDS_KEY
) -> str | None:
    """Why ``ids`` cannot feed the draft's ``fc``, or None: ``fc`` concatenates one target hidden
    state per id, so it takes exactly the ``width`` aux layers it was trained on. Every engine's
    plan, the input checks, the doctor, the draft loader and the local decoder refuse with this one
    rule and this one line.

    Args:
        ids: the layer ids the draft would be fed (only their count matters here).
        width: how many aux layers ``fc`` takes.
        where: the file (and key) the refusal starts with: the draft's ``config.json``, or the
            spec key the ids come from.
        said_by: what says ``width``: a config key, an engine's default, ``fc.weight``'s shape.
        named: what the ids are, as the line names them (the ids key unless they come from
            elsewhere).

    Returns:
        None when ``len(ids) == width``, else one line: ``"{where}: the draft's fc takes {width}
        aux layers ({said_by}); {named} {ids} has {len(ids)}"``.
    """
    if len(ids) == width:
        return None
    return (
        f"{where}: the draft's fc takes {width} aux layers ({said_by}); {named} {list(ids)} has "
        f"{len(ids)}"
    )
