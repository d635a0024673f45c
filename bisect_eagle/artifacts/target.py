"""The target model: its head tensors read straight from safetensors, and hidden-state capture by
index.

Capture uses forward hooks on the embedding and on each decoder layer, so canonical index ``i`` is
the output of layer ``i - 1`` and index ``N`` is the last layer's output before the final norm (see
:mod:`bisect_eagle.artifacts.layers`), whatever a transformers version returns as
``hidden_states[N]``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, PositiveFloat, PositiveInt, StrictBool
from safetensors import safe_open

from bisect_eagle.artifacts.configs import read_config_json, validate_keys
from bisect_eagle.errors import BadInput


class TargetError(BadInput):
    """A target directory that cannot be used: the message names the file and what is missing."""


class TargetConfig(BaseModel):
    """The target config.json keys bisect-eagle relies on, type-checked."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    num_hidden_layers: PositiveInt
    hidden_size: PositiveInt
    vocab_size: PositiveInt
    rms_norm_eps: PositiveFloat = 1e-6
    tie_word_embeddings: StrictBool = False


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
HEAD_TENSORS = ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")


def _weight_files(target_dir: Path) -> dict[str, Path]:
    """Tensor name → safetensors file, following ``model.safetensors.index.json`` when sharded."""
    index = target_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            files = {str(name): target_dir / str(fname) for name, fname in weight_map.items()}
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
            raise TargetError(
                f"{index}: key 'weight_map' is missing or not a name -> file map ({e!r:.60})"
            ) from None
        for f in sorted(set(files.values())):
            if not f.is_file():
                raise TargetError(
                    f"{index}: key 'weight_map' names {f.name}, which is not in {target_dir}"
                )
        return files
    single = target_dir / "model.safetensors"
    if not single.is_file():
        pickles = sorted(p.name for p in target_dir.glob("*") if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise TargetError(
                f"{target_dir / pickles[0]}: pickle weights, which bisect-eagle never loads; "
                "convert the target to safetensors (save_pretrained(..., safe_serialization=True))"
            )
        raise TargetError(f"{target_dir}: no model.safetensors or model.safetensors.index.json")
    with _open(single) as f:
        return {name: single for name in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)


def _open(file: Path):
    """``safe_open`` of one file; a damaged header is a :class:`TargetError` naming it."""
    try:
        return safe_open(str(file), "pt")
    except Exception as e:  # safetensors raises several types for a damaged header
        raise TargetError(
            f"{file}: cannot read the safetensors header ({str(e).splitlines()[0]})"
        ) from None


def read_target_tensors(target_dir: str | Path, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Read only the named tensors (float32) from a target's safetensors; pickle-free; NaN/inf
    refused."""
    target_dir = Path(target_dir)
    files = _weight_files(target_dir)
    out = {}
    for name in names:
        if name not in files:
            raise TargetError(
                f"{target_dir}: tensor {name!r} not found in the target's safetensors"
            )
        with _open(files[name]) as f:
            try:
                t = f.get_tensor(name)
            except Exception as e:  # a header that promises more bytes than the file holds
                raise TargetError(
                    f"{files[name]}: tensor {name!r} cannot be read ({str(e).splitlines()[0]})"
                ) from None
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise TargetError(f"{files[name]}: tensor {name!r} holds NaN or inf values")
        out[name] = t.float() if t.is_floating_point() else t
    return out


def read_target_config(target_dir: str | Path) -> dict:
    """The target's config.json (a Hugging Face model directory), with the keys of
    :class:`TargetConfig` checked.

    Args:
        target_dir: the target's Hugging Face model directory.

    Returns:
        The whole config.json as a dict (every key, not only the checked ones).

    Raises:
        BadInput: a missing or unreadable config.json, or a checked key missing or of the wrong type
            (one line naming the file and key).
    """
    cfg = read_config_json(target_dir, "the target (a Hugging Face model directory)")
    validate_keys(TargetConfig, cfg, path=Path(target_dir) / "config.json")
    return cfg


def read_target_info(target_dir: str | Path) -> TargetConfig:
    """The target's config.json keys bisect-eagle relies on, type-checked."""
    return TargetConfig.model_validate(read_target_config(target_dir))


def check_target_weights(target_dir: str | Path) -> TargetConfig:
    """Headers only: safetensors weights (no pickle), and the head tensors' shapes against
    config.json.

    Args:
        target_dir: the target's Hugging Face model directory.

    Returns:
        The checked config keys bisect-eagle relies on.

    Raises:
        BadInput: a bad config.json (:func:`read_target_config`).
        TargetError: no safetensors weights (or a broken shard index), a head tensor
            (``embed_tokens``, ``norm``, ``lm_head`` unless tied) missing or of another shape than
            config.json gives.
    """
    target_dir = Path(target_dir)
    info = read_target_info(target_dir)
    files = _weight_files(target_dir)
    want = {
        "model.embed_tokens.weight": [info.vocab_size, info.hidden_size],
        "model.norm.weight": [info.hidden_size],
    }
    if not info.tie_word_embeddings:
        want["lm_head.weight"] = [info.vocab_size, info.hidden_size]
    for name, shape in want.items():
        if name not in files:
            raise TargetError(
                f"{target_dir}: tensor {name!r} not found in the target's safetensors"
            )
        with _open(files[name]) as f:
            found = list(f.get_slice(name).get_shape())
        if found != shape:
            raise TargetError(
                f"{files[name]}: tensor {name!r} has shape {found}; {target_dir / 'config.json'} "
                f"gives {shape} (vocab_size, hidden_size)"
            )
    return info


@dataclass
class TargetHead:
    """The target's embedding table, final norm and LM head: enough to embed tokens and to score."""

    embed: torch.Tensor  # [V, H]
    norm_weight: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H]
    eps: float
    num_layers: int

    @classmethod
    def load(cls, target_dir: str | Path) -> TargetHead:
        """The head tensors of a target directory, shapes checked against its config.json.

        Args:
            target_dir: the target's Hugging Face model directory.

        Returns:
            The head in float32 (``lm_head`` is the embedding when the config ties them).

        Raises:
            BadInput: what :func:`check_target_weights` refuses.
            TargetError: a head tensor that cannot be read or holds NaN or inf values.
        """
        info = check_target_weights(target_dir)
        names = list(HEAD_TENSORS[:2]) + ([] if info.tie_word_embeddings else [HEAD_TENSORS[2]])
        t = read_target_tensors(target_dir, names)
        return cls(
            embed=t["model.embed_tokens.weight"],
            norm_weight=t["model.norm.weight"],
            lm_head=t["model.embed_tokens.weight"]
            if info.tie_word_embeddings
            else t["lm_head.weight"],
            eps=info.rms_norm_eps,
            num_layers=info.num_hidden_layers,
        )

    @property
    def vocab_size(self) -> int:
        return self.lm_head.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.norm_weight.shape[0]

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        """The target's final RMS norm, in float32.

        Args:
            x: pre-norm states [..., H] (the final state of a dump, or a draft's).

        Returns:
            The normed states [..., H], float32, ready for :attr:`lm_head`.
        """
        x = x.float()
        return self.norm_weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def load_target(target_dir: str | Path, *, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """(model, tokenizer) of a Hugging Face causal LM directory, in eval mode, loaded without
    network.

    Args:
        target_dir: the target's Hugging Face model directory (safetensors weights only).
        device: the torch device the model is moved to.
        dtype: the dtype the weights are loaded in.

    Returns:
        ``(model, tokenizer)``: transformers' ``AutoModelForCausalLM`` and ``AutoTokenizer``.

    Raises:
        BadInput: a bad config.json, or no safetensors weights (a ``pytorch_model.bin`` is a
            pickle).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    read_target_config(target_dir)
    _weight_files(Path(target_dir))  # safetensors only: a pytorch_model.bin is a pickle
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(
        str(target_dir), dtype=dtype, local_files_only=True, use_safetensors=True
    )
    model.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir), local_files_only=True)
    return model, tokenizer


def decoder_layers(model) -> Sequence[torch.nn.Module]:
    """The decoder layers of a Llama-style causal LM (``model.model.layers``).

    Args:
        model: a loaded causal LM (:func:`load_target`).

    Returns:
        ``model.model.layers``, layer 0 first.

    Raises:
        TargetError: the model has no ``model.model.layers``.
    """
    try:
        return model.model.layers
    except AttributeError:
        raise TargetError(
            f"{type(model).__name__}: expected a Llama-style model with model.model.layers"
        ) from None


@contextmanager
def capture_hidden(model, indices: Sequence[int]) -> Iterator[dict[int, torch.Tensor]]:
    """While active, each forward fills the yielded dict with canonical index → state [B, T, H].

    Args:
        model: a Llama-style causal LM (:func:`decoder_layers`).
        indices: canonical ``hidden_states`` indices in ``[0, N]`` (0: the embedding output, ``i``:
            decoder layer ``i-1``'s output, pre-norm).

    Returns:
        A context manager yielding the dict; the hooks are removed on exit.

    Raises:
        TargetError: on entry, an index outside ``[0, N]`` or a model without decoder layers.
    """
    layer_list = decoder_layers(model)
    n = len(layer_list)
    captured: dict[int, torch.Tensor] = {}
    handles = []

    def keep(index: int):
        def hook(_module, _inputs, output):
            captured[index] = output[0] if isinstance(output, tuple) else output

        return hook

    for index in sorted(set(indices)):
        if not 0 <= index <= n:
            raise TargetError(
                f"hidden_states index {index} is outside [0, {n}] for this {n}-layer target"
            )
        module = model.model.embed_tokens if index == 0 else layer_list[index - 1]
        handles.append(module.register_forward_hook(keep(index)))
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()
