"""The one reader of an EAGLE-3 draft's ``config.json``, for both checkpoint layouts.

* SpecForge / SGLang (``LlamaForCausalLMEagle3``): the Llama keys at the top level; layer ids nested
  in ``eagle_config.eagle_aux_hidden_state_layer_ids`` in SGLang's convention (output of layer L).
* speculators (``Eagle3Speculator``, or ``speculators_model_type: eagle3``): the Llama keys under
  ``transformer_layer_config``; layer ids at the top level in vLLM's convention (input to layer L).

What each engine reads (upstream: ``sglang/srt/models/llama_eagle3.py`` and SGLang's model runner;
``vllm/model_executor/models/llama_eagle3.py``): SGLang captures only the *nested* ids (none: its
own defaults, silently) and sizes ``fc`` from ``num_aux_hidden_states``, else the nested ids' count,
else 3 -- top-level ids size nothing in SGLang. vLLM reads the top-level ids, and without them the
nested ids **verbatim as vLLM ids** (``vllm/v1/worker/gpu_model_runner.py``,
``_get_eagle3_aux_layers_from_config``, 0.32): a SpecForge / SGLang draft served by vLLM is fed
states one layer shallower than it was trained on.

Every key is type-checked; a bad one ends with one :class:`BadInput` line naming the config.json and
the key. The reader does not judge which layout suits which engine: that is
:mod:`bisect_eagle.doctor`'s job, so a config with an unknown architecture or without ids still
reads (``layout="unknown"``, ``ids_found="none"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    PositiveFloat,
    PositiveInt,
    StrictBool,
    StrictInt,
    StrictStr,
)

from bisect_eagle.artifacts.configs import read_config_json, validate_keys
from bisect_eagle.artifacts.layers import IdReader
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY

SGLANG_DEFAULT_AUX = 3
SPECFORGE_ARCH = "LlamaForCausalLMEagle3"
SPECULATORS_ARCH = "Eagle3Speculator"

Layout = Literal["specforge", "speculators", "unknown"]
IdsFound = Literal["nested", "top-level", "none"]
Convention = Literal["sglang", "vllm"]


@dataclass(frozen=True)
class DraftConfig:
    """Shapes and options of an EAGLE-3 draft network (what
    :class:`~bisect_eagle.artifacts.draft.Eagle3Draft` builds)."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # target vocabulary (embedding)
    draft_vocab_size: int
    target_hidden_size: int
    num_aux: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    norm_before_residual: bool = False


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class _LayerKeys(_Strict):
    """The Llama decoder-layer keys (top level for SpecForge, ``transformer_layer_config`` for
    speculators)."""

    hidden_size: PositiveInt
    intermediate_size: PositiveInt
    num_attention_heads: PositiveInt
    num_key_value_heads: PositiveInt | None = None
    head_dim: PositiveInt | None = None
    vocab_size: PositiveInt
    rms_norm_eps: PositiveFloat = 1e-6
    rope_theta: PositiveFloat = 10000.0


class _EagleKeys(_Strict):
    eagle_aux_hidden_state_layer_ids: list[StrictInt] | None = None
    use_aux_hidden_state: StrictBool | None = None
    fc_norm: StrictBool | None = None
    norm_before_fc: StrictBool | None = None


class _TopKeys(_Strict):
    architectures: list[StrictStr] = []
    speculators_model_type: StrictStr | None = None
    draft_vocab_size: PositiveInt | None = None
    target_hidden_size: PositiveInt | None = None
    num_aux_hidden_states: PositiveInt | None = None
    eagle_aux_hidden_state_layer_ids: list[StrictInt] | None = None
    eagle_config: _EagleKeys | None = None
    transformer_layer_config: dict | None = None
    norm_before_residual: StrictBool = False
    fc_norm: StrictBool | None = None
    norm_before_fc: StrictBool | None = None


class DraftConfigFile(_Strict):
    """A draft's config.json, type-checked, with what SGLang and vLLM make of it."""

    path: Path  # the config.json file
    raw: dict
    layout: Layout
    architectures: list[str]
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int  # vocab_size when the config has none
    target_hidden_size: int  # hidden_size when the config has none
    rms_norm_eps: float
    rope_theta: float
    norm_before_residual: bool
    nested_ids: list[int] | None  # eagle_config.eagle_aux_hidden_state_layer_ids
    top_level_ids: list[int] | None  # eagle_aux_hidden_state_layer_ids
    num_aux_hidden_states: int | None
    use_aux_hidden_state: bool | None  # eagle_config.use_aux_hidden_state
    # keys of draft variants the model cannot build (fc_norm, norm_before_fc), dotted
    unsupported: list[str]

    @property
    def is_eagle3(self) -> bool:
        """An EAGLE-3 draft by its architectures (or speculators' model type)."""
        return self.layout == "speculators" or any("Eagle3" in a for a in self.architectures)

    @property
    def ids_found(self) -> IdsFound:
        """Where the layout's own ids were found: speculators look at the top level first, others
        nested."""
        order: tuple[IdsFound, IdsFound] = (
            ("top-level", "nested") if self.layout == "speculators" else ("nested", "top-level")
        )
        for where in order:
            if (self.top_level_ids if where == "top-level" else self.nested_ids) is not None:
                return where
        return "none"

    @property
    def layer_ids(self) -> list[int] | None:
        """The declared ids at :attr:`ids_found` (None when the config declares none)."""
        return {"nested": self.nested_ids, "top-level": self.top_level_ids, "none": None}[
            self.ids_found
        ]

    def declared_ids(self, reader: IdReader) -> tuple[list[int] | None, Convention]:
        """The ids ``reader``'s loader takes from this draft and their convention.

        vLLM reads the top level, else the nested ids, both as vLLM ids (see the module docstring);
        the local engine on a speculators draft reads the top level in vLLM's convention; SGLang
        (and the local engine otherwise) reads only the nested ids, in SGLang's convention.

        Args:
            reader: the engine's loader (:class:`IdReader`).

        Returns:
            (the ids, None when the draft declares none where it reads; their convention).
        """
        if reader.vllm_ids:
            return (
                self.top_level_ids if self.top_level_ids is not None else self.nested_ids
            ), "vllm"
        if reader.reads_top_level(self.layout):
            return self.top_level_ids, "vllm"
        return self.nested_ids, "sglang"

    def sglang_fc_aux(self) -> tuple[int, str]:
        """How many aux states SGLang's ``fc`` takes, and the key it came from (SGLang's
        precedence).

        Returns:
            ``(count, source)``: ``num_aux_hidden_states`` when set, else the length of the nested
            ids, else SGLang's default; ``source`` names the key (or the default) in words.
        """
        if self.num_aux_hidden_states is not None:
            return self.num_aux_hidden_states, "num_aux_hidden_states"
        if self.nested_ids is not None:
            return len(self.nested_ids), f"eagle_config.{IDS_KEY}"
        return SGLANG_DEFAULT_AUX, f"SGLang's default of {SGLANG_DEFAULT_AUX}"

    def draft_config(self, num_aux: int) -> DraftConfig:
        """The network shapes for a draft fed ``num_aux`` aux states.

        Args:
            num_aux: how many target hidden states ``fc`` concatenates (the number of layer ids).

        Returns:
            The shapes :class:`~bisect_eagle.artifacts.draft.model.Eagle3Draft` is built from.
        """
        return DraftConfig(
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab_size,
            draft_vocab_size=self.draft_vocab_size,
            target_hidden_size=self.target_hidden_size,
            num_aux=num_aux,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            norm_before_residual=self.norm_before_residual,
        )


def _layout(top: _TopKeys) -> Layout:
    if SPECULATORS_ARCH in top.architectures or top.speculators_model_type == "eagle3":
        return "speculators"
    return "specforge" if SPECFORGE_ARCH in top.architectures else "unknown"


def _heads(layer: _LayerKeys, path: Path, prefix: str) -> tuple[int, int, int]:
    """(heads, kv heads, head_dim), checked the way the attention reshapes them."""
    heads = layer.num_attention_heads
    kv = layer.num_key_value_heads or heads
    if layer.head_dim is None and layer.hidden_size % heads:
        raise BadInput(
            f"{path}: key '{prefix}num_attention_heads': hidden_size {layer.hidden_size} is not "
            f"divisible by {heads} heads (and there is no head_dim)"
        )
    if heads % kv:
        raise BadInput(
            f"{path}: key '{prefix}num_key_value_heads': {heads} attention heads are not a "
            f"multiple of {kv} key/value heads"
        )
    return heads, kv, layer.head_dim or layer.hidden_size // heads


def parse_draft_config(cfg: dict, path: Path) -> DraftConfigFile:
    """Type-check a draft config already read from ``path`` (a config.json); see the module doc.

    Args:
        cfg: the config.json's content.
        path: the file it was read from, for error lines and :attr:`DraftConfigFile.path`.

    Returns:
        The typed config with its layout (``specforge``, ``speculators`` or ``unknown``), both
        places of layer ids, and the keys of variants the model cannot build.

    Raises:
        BadInput: a key of the wrong type or a missing required key (one line naming ``path`` and
            the key), a speculators config without ``transformer_layer_config``, or head counts that
            do not divide.
    """
    top = validate_keys(_TopKeys, cfg, path=path)
    layout = _layout(top)
    if layout == "speculators":
        if top.transformer_layer_config is None:
            raise BadInput(
                f"{path}: key 'transformer_layer_config' is missing (speculators layout)"
            )
        body, prefix = top.transformer_layer_config, "transformer_layer_config."
    else:
        body, prefix = cfg, ""
    layer = validate_keys(_LayerKeys, body, path=path, prefix=prefix.rstrip("."))
    heads, kv, head_dim = _heads(layer, path, prefix)
    eagle = top.eagle_config or _EagleKeys()
    unsupported = [key for key in ("fc_norm", "norm_before_fc") if getattr(top, key)]
    unsupported += [
        f"eagle_config.{key}" for key in ("fc_norm", "norm_before_fc") if getattr(eagle, key)
    ]
    return DraftConfigFile(
        path=path,
        raw=cfg,
        layout=layout,
        architectures=list(top.architectures),
        hidden_size=layer.hidden_size,
        intermediate_size=layer.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        vocab_size=layer.vocab_size,
        draft_vocab_size=top.draft_vocab_size or layer.vocab_size,
        target_hidden_size=top.target_hidden_size or layer.hidden_size,
        rms_norm_eps=layer.rms_norm_eps,
        rope_theta=layer.rope_theta,
        norm_before_residual=top.norm_before_residual,
        nested_ids=eagle.eagle_aux_hidden_state_layer_ids,
        top_level_ids=top.eagle_aux_hidden_state_layer_ids,
        num_aux_hidden_states=top.num_aux_hidden_states,
        use_aux_hidden_state=eagle.use_aux_hidden_state,
        unsupported=unsupported,
    )


def read_draft_config(directory: str | Path) -> DraftConfigFile:
    """``directory/config.json`` of an EAGLE-3 draft, type-checked.

    Args:
        directory: the draft directory.

    Returns:
        The typed config (:func:`parse_draft_config`).

    Raises:
        BadInput: a missing or unreadable config.json, or any bad key (one line naming the file and
            key).
    """
    directory = Path(directory)
    return parse_draft_config(
        read_config_json(directory, "an EAGLE-3 draft"), directory / "config.json"
    )
