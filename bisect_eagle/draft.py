"""EAGLE-3 draft model (one Llama decoder layer over fused target features) and its checkpoint loaders.

Forward, as in SpecForge's ``LlamaForCausalLMEagle3`` and speculators' ``Eagle3Speculator``::

    x = fc(cat(aux_0, aux_1, aux_2))                       # first step; later steps reuse the draft's own h
    a = cat(input_layernorm(embed(token)), hidden_norm(x))  # 2H wide
    h = x + o_proj(attn(q(a), k(a), v(a)))
    h = h + mlp(post_attention_layernorm(h))                # pre-norm h feeds the next draft step
    logits = lm_head(norm(h))                               # draft vocabulary; target id = i + d2t[i]

``norm`` is applied exactly once, in :meth:`Eagle3Draft.logits` (SpecForge's ``forward()`` already ends in
``norm``, so ``compute_logits(forward())`` would norm twice). Attention takes explicit keys/values and a
boolean mask so that one code path serves training-time test (TTT) evaluation and cached live decoding.

Two checkpoint layouts load into the same module: SpecForge/SGLang (``LlamaForCausalLMEagle3``,
``midlayer.*``, ids nested in ``eagle_config``, output-of-layer ids, no ``embed_tokens``) and speculators
(``Eagle3Speculator``, ``layers.0.*``, top-level input-to-layer ids, ``embed_tokens`` saved).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from bisect_eagle import layers
from bisect_eagle.configs import read_config_json
from bisect_eagle.errors import BadInput


class DraftLoadError(BadInput):
    """A draft checkpoint that cannot be loaded as it is: the message names the file and the key."""


@dataclass(frozen=True)
class DraftConfig:
    """Shapes and options of an EAGLE-3 draft."""

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


@dataclass
class LoadedDraft:
    """A draft ready to run, with where its aux layers come from."""

    model: Eagle3Draft
    config: DraftConfig
    layout: str  # "specforge" | "speculators"
    layer_ids: list[int]  # as written in the checkpoint
    id_convention: str  # convention of ``layer_ids``
    path: Path
    raw_config: dict = field(repr=False, default_factory=dict)

    def aux_indices(self, num_layers: int) -> list[int]:
        """Canonical hidden_states indices of the draft's aux inputs for a target of ``num_layers``."""
        return layers.ids_to_canonical(self.layer_ids, self.id_convention, num_layers)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate ``x`` [B, heads, T, d] by Llama's rotary embedding at ``positions`` [B, T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.to(torch.float32)[..., None] * inv  # [B, T, d/2]
    emb = torch.cat([ang, ang], dim=-1)[:, None]  # [B, 1, T, d]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class DraftAttention(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def qkv(self, a: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project [B, T, 2H] to rotated q [B, h, T, d] and k, v [B, kv, T, d]."""
        b, t, _ = a.shape
        c = self.c
        q = self.q_proj(a).view(b, t, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(a).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(a).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        return rope(q, positions, c.rope_theta), rope(k, positions, c.rope_theta), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Attention of q over all keys k/v with boolean ``mask`` [T, S] (True = visible); returns [B, T, H]."""
        groups = self.c.num_attention_heads // self.c.num_key_value_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        b, h, t, d = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * d))


class DraftMLP(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, c: DraftConfig):
        super().__init__()
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DraftAttention(c)
        self.mlp = DraftMLP(c)


class Eagle3Draft(nn.Module):
    """The EAGLE-3 draft network; see the module docstring for the forward."""

    def __init__(self, c: DraftConfig):
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(c.num_aux * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = DraftLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool))

    @property
    def fc_in_features(self) -> int:
        return self.fc.in_features

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """``fc`` over the concatenated aux states [..., num_aux·H_target] → [..., H]."""
        return self.fc(aux)

    def pre_attention(
        self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Residual, q, k, v for rows (hidden [B, T, H], tokens [B, T], positions [B, T])."""
        layer = self.midlayer
        normed = layer.hidden_norm(hidden)
        a = torch.cat([layer.input_layernorm(self.embed_tokens(tokens)), normed], dim=-1)
        residual = normed if self.config.norm_before_residual else hidden
        q, k, v = layer.self_attn.qkv(a, positions)
        return residual, q, k, v

    def post_attention(
        self, residual: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Attention over the given keys, the MLP, and the pre-norm output h [B, T, H]."""
        layer = self.midlayer
        h = residual + layer.self_attn.attend(q, k, v, mask)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of pre-norm states h (the only place ``norm`` is applied)."""
        return self.lm_head(self.norm(h))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocabulary ids to target-vocabulary ids (``i + d2t[i]``)."""
        return draft_ids + self.d2t[draft_ids]

    def ttt_forward(self, aux: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Teacher-forced multi-step forward, as EAGLE-3 trains and SpecForge evaluates.

        Row ``t`` of step ``k`` reads ``tokens[:, t + k]`` at position ``t + k`` and the draft's own step
        ``k-1`` output (step 0: ``fc(aux[:, t])``). It sees step-0 keys at rows ``<= t`` and its own row's
        keys of steps 1..k -- exactly what a chain draft sees in live decoding. ``tokens`` has ``T + steps
        - 1`` columns for ``T`` aux rows. Returns the pre-norm states [B, T, H] of each step.
        """
        b, t, _ = aux.shape
        if tokens.shape[1] < t + steps - 1:
            raise ValueError(f"ttt_forward needs {t + steps - 1} token columns, got {tokens.shape[1]}")
        rows = torch.arange(t, device=aux.device)
        causal = rows[None, :] <= rows[:, None]  # [T, T]
        diag = torch.eye(t, dtype=torch.bool, device=aux.device)
        hidden = self.project(aux)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        outs = []
        for k in range(steps):
            pos = (rows + k).expand(b, t)
            residual, q, kk, vv = self.pre_attention(hidden, tokens[:, k : k + t], pos)
            keys.append(kk)
            values.append(vv)
            mask = torch.cat([causal] + [diag] * k, dim=1)
            hidden = self.post_attention(residual, q, torch.cat(keys, 2), torch.cat(values, 2), mask)
            outs.append(hidden)
        return outs


# ---------------------------------------------------------------------------------------------------
# checkpoints

_SUPPORTED_ARCHS = {"LlamaForCausalLMEagle3": "specforge", "Eagle3Speculator": "speculators"}


def _need(cfg: dict, key: str, where: Path) -> object:
    if key not in cfg:
        raise DraftLoadError(f"{where}: key {key!r} is missing")
    return cfg[key]


def _layout_of(cfg: dict, cfg_path: Path) -> str:
    archs = cfg.get("architectures") or []
    for arch in archs:
        if arch in _SUPPORTED_ARCHS:
            return _SUPPORTED_ARCHS[arch]
    if cfg.get("speculators_model_type") == "eagle3":
        return "speculators"
    raise DraftLoadError(
        f"{cfg_path}: key 'architectures' is {archs}; expected one of {sorted(_SUPPORTED_ARCHS)}"
    )


def _parse_config(cfg: dict, layout: str, cfg_path: Path) -> tuple[DraftConfig, list[int], str]:
    """DraftConfig, layer ids and their convention from a config.json of either layout."""
    if layout == "specforge":
        body = cfg
        eagle = cfg.get("eagle_config")
        if not isinstance(eagle, dict) or "eagle_aux_hidden_state_layer_ids" not in eagle:
            raise DraftLoadError(
                f"{cfg_path}: key 'eagle_config.eagle_aux_hidden_state_layer_ids' is missing; SGLang reads "
                "the ids only from there and silently falls back to its default layers without it"
            )
        ids, conv = list(eagle["eagle_aux_hidden_state_layer_ids"]), "sglang"
        for key in ("fc_norm", "norm_before_fc"):
            if eagle.get(key) or cfg.get(key):
                raise DraftLoadError(f"{cfg_path}: key {key!r} is set; this draft variant is not supported yet")
    else:
        body = _need(cfg, "transformer_layer_config", cfg_path)
        ids, conv = list(_need(cfg, "eagle_aux_hidden_state_layer_ids", cfg_path)), "vllm"
        for key in ("norm_before_fc", "fc_norm"):
            if cfg.get(key):
                raise DraftLoadError(f"{cfg_path}: key {key!r} is true; this draft variant is not supported yet")
    heads = int(_need(body, "num_attention_heads", cfg_path))
    hidden = int(_need(body, "hidden_size", cfg_path))
    c = DraftConfig(
        hidden_size=hidden,
        intermediate_size=int(_need(body, "intermediate_size", cfg_path)),
        num_attention_heads=heads,
        num_key_value_heads=int(body.get("num_key_value_heads", heads)),
        head_dim=int(body.get("head_dim") or hidden // heads),
        vocab_size=int(_need(body, "vocab_size", cfg_path)),
        draft_vocab_size=int(cfg.get("draft_vocab_size") or body["vocab_size"]),
        target_hidden_size=int(cfg.get("target_hidden_size") or hidden),
        num_aux=len(ids),
        rms_norm_eps=float(body.get("rms_norm_eps", 1e-6)),
        rope_theta=float(body.get("rope_theta", 10000.0)),
        norm_before_residual=bool(cfg.get("norm_before_residual", False)),
    )
    return c, ids, conv


def _normalise_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """speculators ``layers.0.*`` → ``midlayer.*``; drop what inference does not use."""
    out = {}
    for key, value in state.items():
        if key.startswith("layers.0."):
            key = "midlayer." + key[len("layers.0.") :]
        if key.startswith(("verifier_lm_head", "verifier_norm")):
            continue
        out[key] = value
    return out


def target_embedding(target_dir: Path) -> torch.Tensor:
    """``model.embed_tokens.weight`` of a Hugging Face target directory (safetensors, pickle-free)."""
    from bisect_eagle.target import read_target_tensors

    return read_target_tensors(target_dir, ["model.embed_tokens.weight"])["model.embed_tokens.weight"]


def load_draft(path: str | Path, target: str | Path | None = None, device: str = "cpu") -> LoadedDraft:
    """Load an EAGLE-3 draft of either layout; ``embed_tokens`` comes from ``target`` when the draft lacks it."""
    path = Path(path)
    cfg = read_config_json(path, "an EAGLE-3 draft")
    cfg_path = path / "config.json"
    layout = _layout_of(cfg, cfg_path)
    c, ids, conv = _parse_config(cfg, layout, cfg_path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise DraftLoadError(f"{path}: no *.safetensors weights found")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except Exception as e:  # safetensors raises several types for a damaged file
            raise DraftLoadError(f"{f}: cannot read safetensors ({e})") from None
    state = _normalise_keys(state)
    if "embed_tokens.weight" not in state:
        if target is None:
            raise DraftLoadError(
                f"{path}: the draft has no embed_tokens.weight (SpecForge exports drop it); "
                "give the target directory so it can be taken from model.embed_tokens.weight"
            )
        state["embed_tokens.weight"] = target_embedding(Path(target))
    fc = state.get("fc.weight")
    if fc is None:
        raise DraftLoadError(f"{path}: key 'fc.weight' is missing")
    if fc.shape[1] != c.num_aux * c.target_hidden_size:
        raise DraftLoadError(
            f"{path}: fc.weight takes {fc.shape[1]} inputs but config.json has {c.num_aux} layer ids × "
            f"target_hidden_size {c.target_hidden_size} = {c.num_aux * c.target_hidden_size}"
        )
    model = Eagle3Draft(c)
    for key in ("d2t", "t2d"):
        if key not in state:
            state[key] = getattr(model, key)
            if c.draft_vocab_size != c.vocab_size:
                raise DraftLoadError(
                    f"{path}: key {key!r} is missing but draft_vocab_size {c.draft_vocab_size} != "
                    f"vocab_size {c.vocab_size}; a draft vocabulary map is required"
                )
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise DraftLoadError(f"{path}: weights do not match the config: missing {missing}, unexpected {unexpected}")
    model.to(device).eval()
    return LoadedDraft(model, c, layout, ids, conv, path, cfg)


def save_draft(
    model: Eagle3Draft,
    path: str | Path,
    layout: str,
    layer_ids: list[int],
    extra_config: dict | None = None,
    dtype: torch.dtype = torch.float32,
) -> None:
    """Write ``model`` as a checkpoint of ``layout``; ``layer_ids`` are in that layout's own convention."""
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
            "architectures": ["LlamaForCausalLMEagle3"],
            **layer_cfg,
            "draft_vocab_size": c.draft_vocab_size,
            "target_hidden_size": c.target_hidden_size,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids), "use_aux_hidden_state": True},
        }
        state.pop("embed_tokens.weight")
    elif layout == "speculators":
        cfg = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": layer_cfg,
            "draft_vocab_size": c.draft_vocab_size,
            "target_hidden_size": c.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(layer_ids),
            "norm_before_residual": c.norm_before_residual,
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            },
        }
        state = {("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v for k, v in state.items()}
    else:
        raise ValueError(f"unknown draft layout {layout!r}; expected 'specforge' or 'speculators'")
    cfg.update(extra_config or {})
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def init_weights(model: Eagle3Draft, seed: int, std: float = 0.02) -> None:
    """Deterministic normal init of all linear layers (embedding left as given)."""
    g = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            with torch.no_grad():
                module.weight.copy_(torch.randn(module.weight.shape, generator=g) * std)

