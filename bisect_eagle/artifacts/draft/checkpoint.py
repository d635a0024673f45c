"""EAGLE-3 draft checkpoints: checked from the safetensors headers, loaded pickle-free, and written.

Two layouts load into the same :class:`~bisect_eagle.artifacts.draft.model.Eagle3Draft`:
SpecForge/SGLang (``LlamaForCausalLMEagle3``, ``midlayer.*``, ids nested in ``eagle_config``,
output-of-layer ids, no ``embed_tokens``: it comes from the target) and speculators
(``Eagle3Speculator``, ``layers.0.*``, top-level input-to-layer ids, ``embed_tokens`` saved).
:func:`inspect_draft` checks the config and every tensor's name, shape and dtype from the headers
alone (no weights read); :func:`load_draft` then reads the weights and checks their values (finite,
a vocabulary map inside the target vocabulary). Every problem is one :class:`DraftLoadError` line
naming the file and the key or tensor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from bisect_eagle.artifacts import layers
from bisect_eagle.artifacts.draft.config import (
    SPECFORGE_ARCH,
    SPECULATORS_ARCH,
    DraftConfig,
    DraftConfigFile,
    read_draft_config,
)
from bisect_eagle.artifacts.draft.model import Eagle3Draft
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY

# the embedding may come from the target; maps when vocabs match
OPTIONAL = ("embed_tokens.weight", "d2t", "t2d")
INTEGER_TENSORS = ("d2t", "t2d")


class DraftLoadError(BadInput):
    """A draft checkpoint that cannot be loaded as it is: the message names the file and the key or
    tensor."""


@dataclass
class LoadedDraft:
    """A draft ready to run, with where its aux layers come from."""

    model: Eagle3Draft
    config: DraftConfig
    layout: str  # "specforge" | "speculators"
    layer_ids: list[int]  # as written in the checkpoint
    id_convention: str  # convention of ``layer_ids``
    path: Path

    def aux_indices(self, num_layers: int) -> list[int]:
        """Canonical hidden_states indices of the draft's aux inputs for a target of ``num_layers``.

        Args:
            num_layers: the target's decoder layers (``num_hidden_layers``).

        Returns:
            One ``hidden_states`` index per aux input, in the checkpoint's order.

        Raises:
            LayerIdError: an id outside what its convention allows for ``num_layers``.
        """
        return layers.ids_to_canonical(self.layer_ids, self.id_convention, num_layers=num_layers)


@dataclass(frozen=True)
class TensorHeader:
    """One tensor as its safetensors header declares it."""

    stored_name: str  # the name in the file (speculators: ``layers.0.*``)
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype: F32, BF16, I64, BOOL, ...
    file: Path


@dataclass(frozen=True)
class DraftCheck:
    """What :func:`inspect_draft` found: a draft whose config and tensor headers agree."""

    config_file: DraftConfigFile
    config: DraftConfig
    layer_ids: list[int]
    id_convention: str
    tensors: dict[str, TensorHeader]  # canonical (``midlayer.*``) name -> header


def canonical_name(key: str) -> str | None:
    """speculators ``layers.0.*`` → ``midlayer.*``; None for tensors inference does not use."""
    if key.startswith(("verifier_lm_head", "verifier_norm")):
        return None
    return "midlayer." + key[len("layers.0.") :] if key.startswith("layers.0.") else key


def expected_shapes(c: DraftConfig) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape of every tensor :class:`Eagle3Draft` holds for ``c`` (built on the meta
    device)."""
    with torch.device("meta"):
        model = Eagle3Draft(c)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def read_headers(path: Path) -> dict[str, TensorHeader]:
    """Canonical name → header of every tensor in ``path/*.safetensors``; nothing but the headers is
    read.

    Args:
        path: the draft directory.

    Returns:
        Canonical (``midlayer.*``) name → header; the verifier's own tensors (speculators'
        ``verifier_lm_head``, ``verifier_norm``) left out.

    Raises:
        DraftLoadError: no safetensors file (only pickle weights, or none), a tensor in two files,
            or a header that cannot be read.
    """
    files = sorted(path.glob("*.safetensors"))
    if not files:
        if any(path.glob("*.bin")) or any(path.glob("*.pt")):
            raise DraftLoadError(
                f"{path}: only pickle weights (*.bin/*.pt), which bisect-eagle never loads; save "
                "the draft as safetensors"
            )
        raise DraftLoadError(f"{path}: no *.safetensors weights found")
    out: dict[str, TensorHeader] = {}
    for f in files:
        try:
            with safe_open(str(f), "pt") as st:
                for key in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    name = canonical_name(key)
                    if name is None:
                        continue
                    if name in out:
                        raise DraftLoadError(f"{f}: tensor {key!r} is also in {out[name].file}")
                    sl = st.get_slice(key)
                    out[name] = TensorHeader(key, tuple(sl.get_shape()), sl.get_dtype(), f)
        except DraftLoadError:
            raise
        except Exception as e:  # safetensors raises several types for a damaged header
            raise DraftLoadError(
                f"{f}: cannot read the safetensors header ({str(e).splitlines()[0]})"
            ) from None
    return out


def _declared_ids(cf: DraftConfigFile) -> tuple[list[int], str]:
    """The layout's layer ids and their convention, or the reason this config cannot be loaded."""
    if cf.layout == "unknown":
        raise DraftLoadError(
            f"{cf.path}: key 'architectures' is {cf.architectures}; expected one of "
            f"{sorted([SPECFORGE_ARCH, SPECULATORS_ARCH])}"
        )
    for key in cf.unsupported:
        raise DraftLoadError(
            f"{cf.path}: key {key!r} is true; this draft variant is not supported yet"
        )
    if cf.layout == "specforge":
        ids, key, conv = cf.nested_ids, f"eagle_config.{IDS_KEY}", "sglang"
        if ids is None:
            raise DraftLoadError(
                f"{cf.path}: key '{key}' is missing; SGLang reads the ids only from there and "
                "silently falls back to its default layers without it"
            )
    else:
        ids, key, conv = cf.top_level_ids, IDS_KEY, "vllm"
        if ids is None:
            raise DraftLoadError(
                f"{cf.path}: key '{key}' is missing (speculators layout: top-level ids)"
            )
    if not ids:
        raise DraftLoadError(f"{cf.path}: key '{key}': expected at least one layer id, found []")
    return list(ids), conv


def _check_header(name: str, h: TensorHeader, want: tuple[int, ...], cf: DraftConfigFile) -> None:
    if h.shape != want:
        raise DraftLoadError(
            f"{h.file}: tensor {h.stored_name!r} has shape {list(h.shape)}; {cf.path} gives "
            f"{list(want)}"
        )
    floating = h.dtype.startswith(("F", "BF"))
    if (name in INTEGER_TENSORS) == floating:
        kind = "an integer" if name in INTEGER_TENSORS else "a floating-point"
        raise DraftLoadError(
            f"{h.file}: tensor {h.stored_name!r}: expected {kind} dtype, found {h.dtype}"
        )


def check_tensors(
    cf: DraftConfigFile,
    *,
    config: DraftConfig,
    ids: list[int],
    tensors: dict[str, TensorHeader],
    where: Path,
) -> None:
    """Every tensor of ``tensors`` against the shapes ``config`` implies; ``ids`` are the config's
    layer ids (as many as ``config.num_aux``); ``where`` is the draft directory."""
    c = config
    fc = tensors.get("fc.weight")
    if fc is None:
        raise DraftLoadError(f"{where}: tensor 'fc.weight' is missing")
    if len(fc.shape) == 2:
        width, rest = divmod(fc.shape[1], c.target_hidden_size)
        tensor = f"{fc.file}: tensor {fc.stored_name!r}"
        said_by = f"{fc.shape[1]} inputs = {width} × target_hidden_size {c.target_hidden_size}"
        refusal = (
            f"{tensor} takes {fc.shape[1]} inputs, not a multiple of target_hidden_size "
            f"{c.target_hidden_size} ({cf.path})"
            if rest
            else layers.fc_width_refusal(
                ids, width=width, where=tensor, said_by=said_by, named=f"{cf.path}'s layer ids"
            )
        )
        if refusal is not None:
            raise DraftLoadError(refusal)
    expected = expected_shapes(c)
    unexpected = sorted(tensors[n].stored_name for n in tensors if n not in expected)
    if unexpected:
        raise DraftLoadError(
            f"{where}: tensors {unexpected} are not part of an EAGLE-3 draft with this config"
        )
    for name, want in expected.items():
        if name in tensors:
            _check_header(name, tensors[name], want, cf)
        elif name not in OPTIONAL:
            raise DraftLoadError(
                f"{where}: tensor {name!r} is missing ({cf.path} implies shape {list(want)})"
            )
    if c.draft_vocab_size != c.vocab_size:
        for name in INTEGER_TENSORS:
            if name not in tensors:
                raise DraftLoadError(
                    f"{where}: tensor {name!r} is missing but draft_vocab_size "
                    f"{c.draft_vocab_size} != vocab_size {c.vocab_size}; a draft vocabulary map is "
                    "required"
                )


def inspect_draft(path: str | Path) -> DraftCheck:
    """The draft's config and its tensors' names, shapes and dtypes checked against each other
    (headers only).

    Args:
        path: the draft directory (``config.json`` and ``*.safetensors``).

    Returns:
        The check: the config file, the network shapes, the declared layer ids in the layout's own
        convention, and every tensor's header.

    Raises:
        BadInput: a bad config key (:func:`read_draft_config`).
        DraftLoadError: an unknown layout, an unsupported variant, missing or empty layer ids, or a
            tensor missing, unexpected, or of the wrong shape or dtype.
    """
    path = Path(path)
    cf = read_draft_config(path)
    ids, conv = _declared_ids(cf)
    c = cf.draft_config(len(ids))
    tensors = read_headers(path)
    check_tensors(cf, config=c, ids=ids, tensors=tensors, where=path)
    return DraftCheck(cf, c, ids, conv, tensors)


def target_embedding(target_dir: Path) -> torch.Tensor:
    """``model.embed_tokens.weight`` of a Hugging Face target directory (safetensors,
    pickle-free)."""
    from bisect_eagle.artifacts.target import read_target_tensors

    return read_target_tensors(target_dir, ["model.embed_tokens.weight"])[
        "model.embed_tokens.weight"
    ]


def _read_weights(check: DraftCheck) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for f in sorted({h.file for h in check.tensors.values()}):
        try:
            raw = load_file(str(f))
        except Exception as e:  # safetensors raises several types for a damaged file
            raise DraftLoadError(
                f"{f}: cannot read safetensors ({str(e).splitlines()[0]})"
            ) from None
        for key, value in raw.items():
            name = canonical_name(key)
            if name is not None:
                state[name] = value
    return state


def _check_values(check: DraftCheck, state: dict[str, torch.Tensor]) -> None:
    """Finite weights and a draft → target map that lands inside the target vocabulary."""
    for name, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            h = check.tensors[name]
            raise DraftLoadError(f"{h.file}: tensor {h.stored_name!r} holds NaN or inf values")
    if "d2t" in state:
        c = check.config
        target_ids = torch.arange(c.draft_vocab_size) + state["d2t"].long()
        if bool(((target_ids < 0) | (target_ids >= c.vocab_size)).any()):
            bad = int(target_ids[(target_ids < 0) | (target_ids >= c.vocab_size)][0])
            raise DraftLoadError(
                f"{check.tensors['d2t'].file}: tensor 'd2t' maps a draft token to target id {bad}, "
                f"outside the vocabulary [0, {c.vocab_size})"
            )


def load_draft(
    path: str | Path, *, target: str | Path | None = None, device: str = "cpu"
) -> LoadedDraft:
    """Load an EAGLE-3 draft of either layout; ``embed_tokens`` comes from ``target`` when the draft
    lacks it.

    Args:
        path: the draft directory.
        target: the target's Hugging Face directory; needed only when the draft has no
            ``embed_tokens.weight`` (SpecForge exports).
        device: the torch device the model is moved to (float32, eval mode).

    Returns:
        The model with its config, layout, layer ids as written and their convention, and ``path``.

    Raises:
        DraftLoadError: everything :func:`inspect_draft` refuses, unreadable weights, NaN or inf
            values, a ``d2t`` map outside the target vocabulary, no embedding and no ``target``,
            or a target embedding of the wrong shape.
    """
    path = Path(path)
    check = inspect_draft(path)
    c = check.config
    state = _read_weights(check)
    _check_values(check, state)
    if "embed_tokens.weight" not in state:
        if target is None:
            raise DraftLoadError(
                f"{path}: the draft has no embed_tokens.weight (SpecForge exports drop it); give "
                "the target directory so it can be taken from model.embed_tokens.weight"
            )
        embed = target_embedding(Path(target))
        if tuple(embed.shape) != (c.vocab_size, c.hidden_size):
            raise DraftLoadError(
                f"{target}: tensor 'model.embed_tokens.weight' has shape {list(embed.shape)}; the "
                f"draft's {check.config_file.path} needs [{c.vocab_size}, {c.hidden_size}] "
                "(vocab_size, hidden_size)"
            )
        state["embed_tokens.weight"] = embed
    model = Eagle3Draft(c)
    for key in INTEGER_TENSORS:
        state.setdefault(key, getattr(model, key))
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    state["d2t"], state["t2d"] = state["d2t"].long(), state["t2d"].bool()
    model.load_state_dict(state, strict=True)
    model.to(device).eval()
    return LoadedDraft(
        model, c, check.config_file.layout, check.layer_ids, check.id_convention, path
    )


def save_draft(
    model: Eagle3Draft,
    path: str | Path,
    *,
    layout: str,
    layer_ids: list[int],
    extra_config: dict | None = None,
    dtype: torch.dtype = torch.float32,
) -> None:
    """Write ``model`` as a checkpoint of ``layout``; ``layer_ids`` are in that layout's own
    convention."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    c = model.config
    if len(layer_ids) != c.num_aux:
        raise ValueError(f"{len(layer_ids)} layer ids for a draft with {c.num_aux} aux inputs")
    layer_cfg = {
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "vocab_size": c.vocab_size,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    }
    state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    if layout == "specforge":
        cfg = {
            "architectures": [SPECFORGE_ARCH],
            **layer_cfg,
            "draft_vocab_size": c.draft_vocab_size,
            "target_hidden_size": c.target_hidden_size,
            "eagle_config": {IDS_KEY: list(layer_ids), "use_aux_hidden_state": True},
        }
        state.pop("embed_tokens.weight")
    elif layout == "speculators":
        cfg = {
            "architectures": [SPECULATORS_ARCH],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": layer_cfg,
            "draft_vocab_size": c.draft_vocab_size,
            "target_hidden_size": c.target_hidden_size,
            IDS_KEY: list(layer_ids),
            "norm_before_residual": c.norm_before_residual,
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            },
        }
        state = {
            ("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v
            for k, v in state.items()
        }
    else:
        raise ValueError(f"unknown draft layout {layout!r}; expected 'specforge' or 'speculators'")
    cfg.update(extra_config or {})
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def init_weights(model: Eagle3Draft, *, seed: int, std: float = 0.02) -> None:
    """Deterministic normal init of all linear layers (embedding left as given)."""
    g = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            with torch.no_grad():
                module.weight.copy_(torch.randn(module.weight.shape, generator=g) * std)
