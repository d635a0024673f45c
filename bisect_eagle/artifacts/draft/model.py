"""The EAGLE-3 draft network: one Llama decoder layer over fused target features.

Forward, as in SpecForge's ``LlamaForCausalLMEagle3`` and speculators' ``Eagle3Speculator``::

    x = fc(cat(aux_0, aux_1, aux_2))        # first step; later steps reuse the draft's own h
    a = cat(input_layernorm(embed(token)), hidden_norm(x))  # 2H wide
    h = x + o_proj(attn(q(a), k(a), v(a)))
    h = h + mlp(post_attention_layernorm(h)) # pre-norm h feeds the next draft step
    logits = lm_head(norm(h))                # draft vocabulary; target id = i + d2t[i]

``norm`` is applied exactly once, in :meth:`Eagle3Draft.logits` (SpecForge's ``forward()`` already
ends in ``norm``, so ``compute_logits(forward())`` would norm twice). Attention takes explicit
keys/values and a boolean mask so that one code path serves training-time test (TTT) evaluation and
cached live decoding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bisect_eagle.artifacts.draft.config import DraftConfig


class RMSNorm(nn.Module):
    """Llama's RMS norm, computed in float32 and cast back to the input dtype before the weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope(x: torch.Tensor, *, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate ``x`` [B, heads, T, d] by Llama's rotary embedding at ``positions`` [B, T]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.to(torch.float32)[..., None] * inv  # [B, T, d/2]
    emb = torch.cat([ang, ang], dim=-1)[:, None]  # [B, 1, T, d]
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class DraftAttention(nn.Module):
    """Grouped-query attention over the 2H-wide ``cat(embedding, hidden)`` input."""

    def __init__(self, c: DraftConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)

    def qkv(
        self, a: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project [B, T, 2H] to rotated q [B, h, T, d] and k, v [B, kv, T, d]."""
        b, t, _ = a.shape
        c = self.c
        q = self.q_proj(a).view(b, t, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(a).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(a).view(b, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        return (
            rope(q, positions=positions, theta=c.rope_theta),
            rope(k, positions=positions, theta=c.rope_theta),
            v,
        )

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, *, v: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Attention of q over all keys k/v with boolean ``mask`` [T, S] (True = visible); returns
        [B, T, H]."""
        groups = self.c.num_attention_heads // self.c.num_key_value_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        b, h, t, d = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * d))


class DraftMLP(nn.Module):
    """Llama's SwiGLU MLP."""

    def __init__(self, c: DraftConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """The draft's single decoder layer (``midlayer``): its norms, attention and MLP."""

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
        """Input width of ``fc``: aux count × target hidden size."""
        return self.fc.in_features

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """``fc`` over the concatenated aux states [..., num_aux·H_target] → [..., H].

        Args:
            aux: the aux states concatenated on the last dimension, in layer-id order.

        Returns:
            The fused hidden state [..., H], the draft's step-0 input.
        """
        return self.fc(aux)

    def pre_attention(
        self, hidden: torch.Tensor, tokens: torch.Tensor, *, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Residual, q, k, v for rows (hidden [B, T, H], tokens [B, T], positions [B, T]).

        Args:
            hidden: the draft's input states [B, T, H] (``fc`` output, or the previous step's h).
            tokens: the token ids embedded beside them [B, T] (target vocabulary).
            positions: the rotary positions [B, T].

        Returns:
            ``(residual, q, k, v)``: residual [B, T, H] (the normed hidden when
            ``norm_before_residual``), rotated q [B, heads, T, d], rotated k and v [B, kv, T, d].
        """
        layer = self.midlayer
        normed = layer.hidden_norm(hidden)
        a = torch.cat([layer.input_layernorm(self.embed_tokens(tokens)), normed], dim=-1)
        residual = normed if self.config.norm_before_residual else hidden
        q, k, v = layer.self_attn.qkv(a, positions)
        return residual, q, k, v

    def post_attention(
        self,
        residual: torch.Tensor,
        q: torch.Tensor,
        *,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Attention over the given keys, the MLP, and the pre-norm output h [B, T, H].

        Args:
            residual: :meth:`pre_attention`'s residual [B, T, H].
            q: the queries [B, heads, T, d].
            k: all visible keys [B, kv, S, d] (cached ones and this call's).
            v: the values matching ``k``.
            mask: boolean [T, S], True where a row may see a key.

        Returns:
            The pre-norm output h [B, T, H] (feeds :meth:`logits` and the next draft step).
        """
        layer = self.midlayer
        h = residual + layer.self_attn.attend(q, k, v=v, mask=mask)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of pre-norm states h (the only place ``norm`` is applied).

        Args:
            h: pre-norm states [..., H].

        Returns:
            Logits [..., draft_vocab_size]; map an argmax with :meth:`to_target_ids`.
        """
        return self.lm_head(self.norm(h))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Map draft-vocabulary ids to target-vocabulary ids (``i + d2t[i]``).

        Args:
            draft_ids: integer ids in ``[0, draft_vocab_size)``, any shape.

        Returns:
            The target-vocabulary ids, same shape.
        """
        return draft_ids + self.d2t[draft_ids]

    def ttt_forward(
        self, aux: torch.Tensor, tokens: torch.Tensor, *, steps: int
    ) -> list[torch.Tensor]:
        """Teacher-forced multi-step forward, as EAGLE-3 trains and SpecForge evaluates.

        Row ``t`` of step ``k`` reads ``tokens[:, t + k]`` at position ``t + k`` and the draft's own
        step ``k-1`` output (step 0: ``fc(aux[:, t])``). It sees step-0 keys at rows ``<= t`` and
        its own row's keys of steps 1..k -- exactly what a chain draft sees in live decoding.

        Args:
            aux: concatenated aux states [B, T, num_aux·H_target].
            tokens: target-vocabulary ids [B, ≥ T + steps - 1]; row ``t`` of step ``k`` reads column
                ``t + k``.
            steps: draft steps (≥ 1).

        Returns:
            The pre-norm states [B, T, H] of each step, step 0 first (``steps`` tensors).

        Raises:
            ValueError: ``tokens`` has fewer than ``T + steps - 1`` columns.
        """
        b, t, _ = aux.shape
        if tokens.shape[1] < t + steps - 1:
            raise ValueError(
                f"ttt_forward needs {t + steps - 1} token columns, got {tokens.shape[1]}"
            )
        rows = torch.arange(t, device=aux.device)
        causal = rows[None, :] <= rows[:, None]  # [T, T]
        diag = torch.eye(t, dtype=torch.bool, device=aux.device)
        hidden = self.project(aux)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        outs = []
        for k in range(steps):
            pos = (rows + k).expand(b, t)
            residual, q, kk, vv = self.pre_attention(hidden, tokens[:, k : k + t], positions=pos)
            keys.append(kk)
            values.append(vv)
            mask = torch.cat([causal] + [diag] * k, dim=1)
            hidden = self.post_attention(
                residual, q, k=torch.cat(keys, 2), v=torch.cat(values, 2), mask=mask
            )
            outs.append(hidden)
        return outs
