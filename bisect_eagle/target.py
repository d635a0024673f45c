"""The target model: its head tensors read straight from safetensors, and hidden-state capture by index.

Capture uses forward hooks on the embedding and on each decoder layer, so canonical index ``i`` is the
output of layer ``i - 1`` and index ``N`` is the last layer's output before the final norm (see
:mod:`bisect_eagle.layers`), whatever a transformers version returns as ``hidden_states[N]``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from bisect_eagle.configs import read_config_json
from bisect_eagle.errors import BadInput


class TargetError(BadInput):
    """A target directory that cannot be used: the message names the file and what is missing."""


def _weight_files(target_dir: Path) -> dict[str, Path]:
    """Tensor name → safetensors file, following ``model.safetensors.index.json`` when sharded."""
    index = target_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: target_dir / fname for name, fname in weight_map.items()}
    single = target_dir / "model.safetensors"
    if not single.is_file():
        raise TargetError(f"{target_dir}: no model.safetensors or model.safetensors.index.json")
    with safe_open(str(single), "pt") as f:
        return {name: single for name in f.keys()}  # noqa: SIM118 (safe_open is not a mapping)


def read_target_tensors(target_dir: str | Path, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Read only the named tensors (float32) from a target's safetensors; pickle-free."""
    target_dir = Path(target_dir)
    files = _weight_files(target_dir)
    out = {}
    for name in names:
        if name not in files:
            raise TargetError(f"{target_dir}: tensor {name!r} not found in the target's safetensors")
        with safe_open(str(files[name]), "pt") as f:
            t = f.get_tensor(name)
        out[name] = t.float() if t.is_floating_point() else t
    return out


def read_target_config(target_dir: str | Path) -> dict:
    """The target's config.json (a Hugging Face model directory)."""
    return read_config_json(target_dir, "the target (a Hugging Face model directory)")


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
        cfg = read_target_config(target_dir)
        tied = bool(cfg.get("tie_word_embeddings", False))
        names = ["model.embed_tokens.weight", "model.norm.weight"] + ([] if tied else ["lm_head.weight"])
        t = read_target_tensors(target_dir, names)
        return cls(
            embed=t["model.embed_tokens.weight"],
            norm_weight=t["model.norm.weight"],
            lm_head=t["model.embed_tokens.weight"] if tied else t["lm_head.weight"],
            eps=float(cfg.get("rms_norm_eps", 1e-6)),
            num_layers=int(cfg["num_hidden_layers"]),
        )

    def norm(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()
        return self.norm_weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def greedy_from_prenorm(self, final: torch.Tensor) -> torch.Tensor:
        """Argmax token of pre-norm final states [..., H]."""
        return (self.norm(final) @ self.lm_head.T).argmax(-1)

    def greedy_from_normed(self, final: torch.Tensor) -> torch.Tensor:
        """Argmax token of final states already passed through the final norm."""
        return (final.float() @ self.lm_head.T).argmax(-1)


def load_target(target_dir: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """(model, tokenizer) of a Hugging Face causal LM directory, in eval mode, loaded without network."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    read_target_config(target_dir)
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype, local_files_only=True)
    model.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir), local_files_only=True)
    return model, tokenizer


def decoder_layers(model) -> Sequence[torch.nn.Module]:
    """The decoder layers of a Llama-style causal LM (``model.model.layers``)."""
    try:
        return model.model.layers
    except AttributeError:
        raise TargetError(f"{type(model).__name__}: expected a Llama-style model with model.model.layers") from None


@contextmanager
def capture_hidden(model, indices: Sequence[int]) -> Iterator[dict[int, torch.Tensor]]:
    """While active, each forward fills the yielded dict with canonical index → state [B, T, H]."""
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
            raise TargetError(f"hidden_states index {index} is outside [0, {n}] for this {n}-layer target")
        module = model.model.embed_tokens if index == 0 else layer_list[index - 1]
        handles.append(module.register_forward_hook(keep(index)))
    try:
        yield captured
    finally:
        for h in handles:
            h.remove()
