"""A weightless EAGLE-3 draft for a fixture target: its ``config.json`` and a safetensors file whose
header declares every tensor the config implies while the data region is a hole (a sparse file:
nothing is stored or read).

What checks a draft (``inspect_draft``, the doctor, SGLang's resolution) reads only the config and
the header, so a draft for a 61-layer, 6144-wide target costs no disk and no time.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from bisect_eagle.artifacts.draft.checkpoint import INTEGER_TENSORS, expected_shapes
from bisect_eagle.artifacts.draft.config import read_draft_config

DTYPE_BYTES = {"BF16": 2, "I64": 8, "BOOL": 1}


def weightless_draft(
    directory: Path, target: Path, ids: list[int], *, draft_vocab_size: int = 32000
) -> Path:
    """A SpecForge-layout draft at ``directory`` for the target ``target`` (its ``config.json``),
    nested ids ``ids``."""
    t = json.loads((target / "config.json").read_text())
    t = {**t.get("text_config", {}), **t}
    hidden = int(t["hidden_size"])
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "target_hidden_size": hidden,
        "intermediate_size": 4 * hidden,
        "num_attention_heads": hidden // 128,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": int(t["vocab_size"]),
        "draft_vocab_size": draft_vocab_size,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(ids),
            "use_aux_hidden_state": True,
        },
    }
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    shapes = expected_shapes(read_draft_config(directory).draft_config(len(ids)))
    header: dict = {}
    offset = 0
    for name, shape in sorted(shapes.items()):
        dtype = ("I64" if name == "d2t" else "BOOL") if name in INTEGER_TENSORS else "BF16"
        size = DTYPE_BYTES[dtype]
        for dim in shape:
            size *= dim
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(directory / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.truncate(8 + len(text) + offset)  # the data: a hole
    return directory


def small_dump(directory: Path, target: Path, *, aux: int = 3, tokens: int = 8) -> Path:
    """A one-sample legacy (speculators) dump for the target ``target``: ``aux`` aux states and the
    final state of ``tokens`` tokens, random bf16 values (for checks of the dump's layout and width,
    not of a draft's accuracy)."""
    import torch

    t = json.loads((target / "config.json").read_text())
    t = {**t.get("text_config", {}), **t}
    g = torch.Generator().manual_seed(0)
    states = [
        torch.randn(tokens, int(t["hidden_size"]), generator=g).to(torch.bfloat16)
        for _ in range(aux + 1)
    ]
    directory.mkdir(parents=True)
    torch.save(
        {
            "input_ids": torch.arange(tokens),
            "loss_mask": torch.ones(tokens, dtype=torch.long),
            "hidden_states": states,
        },
        directory / "data_0.pt",
    )
    return directory
