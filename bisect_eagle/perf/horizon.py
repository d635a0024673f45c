"""Verify cycles and the work they do per request: one cycle in steady state, or a whole finite
generation.

Steady state (``tokens=None``): one verify cycle emits ``1 + Σ_j S_j`` tokens (the accept length)
and does ``num_steps`` draft forwards, one verify of ``num_draft_tokens`` tokens, and a rollback
with probability ``1 - S_{s-1}``.

Finite generation of ``tokens`` tokens per request (what a short benchmark measures): an exact
dynamic programme over the remaining tokens ``r``. A cycle emits ``k`` tokens with probability
``S_{k-2} - S_{k-1}`` (``S_{-1} = 1``, ``S_{s} = 0``), capped at ``r``. With ``truncate_drafts``
(the local engine) a cycle drafts only ``s' = min(num_steps, r - 1)`` tokens, so its survival is the
first ``s'`` entries, and a cycle with ``s' = 0`` runs no draft at all (a plain target step);
without it (SGLang) every cycle drafts in full and surplus tokens are dropped. ``E[cycles]``, draft
forwards, verified tokens and rollbacks (drafting cycles that rejected a draft, ``1 - S_{s'-1}``
each) follow by linearity; the measured accept length of such a run is ``tokens / E[cycles]`` (Σ
tokens / Σ verify steps), which is what the model predicts. Truncation is only defined for chains
(``topk = 1``); trees use full drafting. EOS before ``tokens`` is not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GenerationWork:
    """Expected work per request (arrays over draws, or floats): what the cost model prices."""

    tokens: np.ndarray  # tokens emitted
    cycles: np.ndarray  # verify cycles (target forwards after prefill)
    spec_cycles: np.ndarray  # cycles that ran the draft
    draft_steps: np.ndarray  # draft forwards (num_steps per drafting cycle)
    verify_tokens: np.ndarray  # tokens verified per request, summed over cycles
    requests: float  # requests started (prefills): 0 in steady state, 1 for a finite generation
    # drafting cycles with a rejected draft (the caches roll back)
    rollbacks: np.ndarray | float = 0.0

    @property
    def accept_length(self) -> np.ndarray:
        return self.tokens / self.cycles


def steady_state(surv: np.ndarray, *, num_steps: int, num_draft_tokens: int) -> GenerationWork:
    """One verify cycle (``num_steps = 0``: the target alone, one token per cycle)."""
    surv = np.asarray(surv, dtype=float)
    lead = surv.shape[:-1] if surv.ndim else ()
    ones = np.ones(lead)
    if num_steps == 0:
        return GenerationWork(ones, ones, 0 * ones, 0 * ones, ones, 0.0, 0 * ones)
    return GenerationWork(
        1.0 + surv.sum(axis=-1),
        ones,
        ones,
        num_steps * ones,
        num_draft_tokens * ones,
        0.0,
        1.0 - surv[..., num_steps - 1],
    )


def finite_generation(
    surv: np.ndarray, *, tokens: int, num_steps: int, num_draft_tokens: int, truncate_drafts: bool
) -> GenerationWork:
    """Expected work to emit ``tokens`` tokens for one request (module docstring); ``surv`` is
    ``[..., s]``."""
    if tokens < 1:
        raise ValueError(f"tokens must be >= 1, got {tokens}")
    surv = np.atleast_1d(np.asarray(surv, dtype=float))
    if num_steps == 0:
        n = float(tokens) * np.ones(surv.shape[:-1])
        return GenerationWork(n, n, 0 * n, 0 * n, n, 1.0, 0 * n)
    lead = surv.shape[:-1]
    zero = np.zeros(lead)
    cycles, spec, steps, verify, back = ([zero] for _ in range(5))
    dist = {
        s: _emit_distribution(surv, s)
        for s in {
            min(num_steps, r - 1) if truncate_drafts else num_steps for r in range(1, tokens + 1)
        }
    }
    for r in range(1, tokens + 1):
        s_eff = min(num_steps, r - 1) if truncate_drafts else num_steps
        probs = dist[s_eff]  # [..., s_eff + 1]: emit 1 .. s_eff + 1
        c = np.ones(lead)
        sp = np.full(lead, 1.0 if s_eff > 0 else 0.0)
        st = np.full(lead, float(s_eff))
        vt = np.full(lead, float(s_eff + 1 if truncate_drafts else num_draft_tokens))
        rb = 1.0 - probs[..., s_eff] if s_eff > 0 else np.zeros(lead)  # P(not every draft accepted)
        for k in range(1, s_eff + 2):
            rest = max(r - k, 0)
            pk = probs[..., k - 1]
            c = c + pk * cycles[rest]
            sp = sp + pk * spec[rest]
            st = st + pk * steps[rest]
            vt = vt + pk * verify[rest]
            rb = rb + pk * back[rest]
        cycles.append(c)
        spec.append(sp)
        steps.append(st)
        verify.append(vt)
        back.append(rb)
    return GenerationWork(
        float(tokens) * np.ones(lead), cycles[-1], spec[-1], steps[-1], verify[-1], 1.0, back[-1]
    )


def _emit_distribution(surv: np.ndarray, s: int) -> np.ndarray:
    """P(emit k) for ``k = 1 .. s+1`` from the first ``s`` survival entries."""
    head = surv[..., :s]
    ones = np.ones(surv.shape[:-1] + (1,))
    upper = np.concatenate([ones, head], axis=-1)
    lower = np.concatenate([head, 0 * ones], axis=-1)
    return np.clip(upper - lower, 0.0, 1.0)
