"""Accept length from per-position acceptance: chains, SGLang's draft trees, and a per-wiring
posterior.

Notation. ``p_i`` (``i = 0 .. num_steps-1``) is the *conditional* acceptance of draft position
``i``: P(draft ``i`` accepted | drafts ``0 .. i-1`` accepted), which is what the engines report as
``accept_rate_per_position`` and what stage 1's teacher-forced per-step accuracy estimates (step
``k`` reads the true tokens before it, i.e. it is scored as if the drafts before it were accepted).
The *survival* ``S_j = P(at least j+1 drafts accepted)`` is the vector every other module consumes;
the accept length (tokens per verify cycle, the bonus token included, SGLang's definition) is ``1 +
Σ_j S_j``.

Chain (``topk = 1``): ``S_j = Π_{i≤j} p_i``. This is an identity (chain rule), not an independence
assumption, as long as ``p_i`` are the conditional rates of the configuration being predicted;
transferring rates measured at one ``num_steps`` to another is the modelling assumption (cycle
boundaries shift).

Tree (``topk > 1``), SGLang's ``organize_draft_results``: depth 1 holds the root's ``topk``
children; at each later depth the ``topk`` best nodes of the previous depth are expanded by ``topk``
children each (``topk²`` candidates per depth), so there are ``topk + (num_steps-1)·topk²``
candidates, of which the ``num_draft_tokens - 1`` with the highest score (cumulative draft
probability along the path) are verified. Assumptions of :func:`tree_survival`:

1. rank acceptance depends on depth only: the target's greedy token at depth ``j`` is the draft's
   rank-``r`` candidate with probability ``q_{j,0} = p_j`` and ``q_{j,r} = (1 - p_j)(1 - ρ)ρ^{r-1}``
   for ``r ≥ 1`` (geometric decay of the top-1 misses over lower ranks, ``ρ = rank_decay``; recall@k
   = ``p + (1-p)(1-ρ^{k-1})``);
2. the draft is calibrated: a node's score equals the probability that its path is the target's
   path, so SGLang's top-score selection keeps the nodes most likely to be accepted (and is closed
   under ancestors: a child never outscores its parent);
3. greedy verification: at most one node per depth lies on the target's path, so ``S_j`` is the
   summed reach probability of the selected depth-``j+1`` nodes and the expected accepted drafts is
   the summed reach probability of every selected node. ``topk = 1`` reduces exactly to the chain.

Posterior (:class:`AcceptanceModel`): stage 1's per-position accuracy ``a_i`` of a wiring is the
prior, shifted on the logit scale by a per-wiring calibration ``δ_w`` (MAP of a logistic shift
fitted to the wiring's live counts, shrunk toward a global shift pooled over all wirings, itself
shrunk toward 0), then each position is a Beta with ``κ`` prior pseudo-counts around ``σ(logit a_i +
δ_w)`` updated with the live counts (reached, accepted) of that position: ``p_i ~ Beta(κ m_i +
acc_i, κ(1 - m_i) + reached_i - acc_i)``. Positions beyond stage 1's depth reuse its last accuracy;
a wiring without stage 1 data uses ``default_accuracy``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

EPS = 1e-4


def _check_steps(num_steps: int) -> None:
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")


def _positions(p: np.ndarray | Sequence[float], num_steps: int) -> np.ndarray:
    """``p`` [..., n] as floats [..., num_steps]; missing trailing positions repeat the last given
    one."""
    arr = np.asarray(p, dtype=float)
    if arr.ndim == 0 or arr.shape[-1] == 0:
        raise ValueError("per-position acceptance needs at least one position")
    if arr.shape[-1] < num_steps:
        pad = np.repeat(arr[..., -1:], num_steps - arr.shape[-1], axis=-1)
        arr = np.concatenate([arr, pad], axis=-1)
    return np.clip(arr[..., :num_steps], 0.0, 1.0)


def chain_survival(p: np.ndarray | Sequence[float], num_steps: int) -> np.ndarray:
    """``S_j = Π_{i≤j} p_i`` for ``j < num_steps`` (shape ``[..., num_steps]``; leading axes are
    draws)."""
    _check_steps(num_steps)
    return np.cumprod(_positions(p, num_steps), axis=-1)


def chain_accept_length(p: np.ndarray | Sequence[float], num_steps: int) -> np.ndarray | float:
    """``E[tokens per verify] = 1 + Σ_{j<num_steps} Π_{i≤j} p_i`` (bonus token included)."""
    out = 1.0 + chain_survival(p, num_steps).sum(axis=-1)
    return float(out) if np.ndim(out) == 0 else out


def rank_probabilities(p: np.ndarray, topk: int, *, rank_decay: float) -> np.ndarray:
    """``q[..., j, r]``: P(the target's token at depth ``j`` is the draft's rank-``r`` candidate)
    (assumption 1)."""
    if not 0.0 <= rank_decay < 1.0:
        raise ValueError(f"rank_decay must be in [0, 1), got {rank_decay}")
    p = np.asarray(p, dtype=float)[..., None]
    r = np.arange(topk, dtype=float)
    lower = (1.0 - p) * (1.0 - rank_decay) * rank_decay ** np.maximum(r - 1.0, 0.0)
    return np.where(r == 0, p, lower)


def tree_survival(
    p: np.ndarray | Sequence[float],
    *,
    num_steps: int,
    topk: int,
    num_draft_tokens: int,
    rank_decay: float = 0.6,
) -> np.ndarray:
    """Per-depth survival ``[..., num_steps]`` of SGLang's selected draft tree (module docstring).

    ``num_draft_tokens`` counts the root (the verified bonus position), so ``num_draft_tokens - 1``
    candidates are kept (clamped to the candidate count). ``topk = 1, num_draft_tokens = num_steps +
    1`` is the chain.
    """
    _check_steps(num_steps)
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    if num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
    pp = _positions(p, num_steps)
    lead = pp.shape[:-1]
    flat = pp.reshape(-1, num_steps)
    draws = flat.shape[0]
    q = rank_probabilities(flat, topk, rank_decay=rank_decay)  # [D, depth, topk]
    scores = [q[:, 0, :]]  # depth-1 candidates [D, topk]
    depths = [np.zeros(topk, dtype=int)]
    current = q[:, 0, :]  # the nodes expanded at the next depth (best topk of this depth)
    for j in range(1, num_steps):
        expanded = (current[:, :, None] * q[:, j, None, :]).reshape(draws, topk * topk)
        scores.append(expanded)
        depths.append(np.full(topk * topk, j))
        best = np.argsort(-expanded, axis=1, kind="stable")[:, :topk]
        current = np.take_along_axis(expanded, best, axis=1)
    all_scores = np.concatenate(scores, axis=1)
    all_depths = np.concatenate(depths)
    keep = min(num_draft_tokens - 1, all_scores.shape[1])
    survival = np.zeros((draws, num_steps))
    if keep > 0:
        order = np.argsort(-all_scores, axis=1, kind="stable")[:, :keep]
        chosen = np.take_along_axis(all_scores, order, axis=1)
        np.add.at(
            survival, (np.repeat(np.arange(draws), keep), all_depths[order].ravel()), chosen.ravel()
        )
    return np.clip(survival, 0.0, 1.0).reshape(*lead, num_steps)


def survival(
    p: np.ndarray | Sequence[float],
    *,
    num_steps: int,
    topk: int,
    num_draft_tokens: int,
    rank_decay: float = 0.6,
) -> np.ndarray:
    """Chain or tree survival ``[..., num_steps]`` of one speculative setting.

    Args:
        p: conditional per-position acceptance ``[..., n]`` (leading axes are draws).
        num_steps, topk, num_draft_tokens: the setting as a plan's effective settings state it (the
            engine applied SGLang's rules; nothing is filled in here).
        rank_decay: ``ρ`` of :func:`rank_probabilities` (trees only).

    A ``topk = 1`` setting that verifies every draft is the chain (a fast path:
    :func:`tree_survival` gives the same); any other is a tree.
    """
    if topk == 1 and num_draft_tokens - 1 >= num_steps:  # keeps every one of the chain's drafts
        return chain_survival(p, num_steps)
    return tree_survival(
        p, num_steps=num_steps, topk=topk, num_draft_tokens=num_draft_tokens, rank_decay=rank_decay
    )


def accept_length(surv: np.ndarray) -> np.ndarray | float:
    """``1 + Σ_j S_j`` over the last axis.

    Args:
        surv: ``S_j = P(at least j+1 drafts accepted)`` on the last axis (any leading shape).

    Returns:
        A float for a 1-D ``surv``, else an array of its leading shape.
    """
    out = 1.0 + np.asarray(surv, dtype=float).sum(axis=-1)
    return float(out) if np.ndim(out) == 0 else out


def position_counts(
    *,
    num_steps: int,
    rates: Sequence[float],
    hist: Mapping[int | str, int] | None = None,
    verify_steps: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(reached, accepted) per draft position of one chain trial, from what engines report.

    ``reached_k``: verify cycles whose first ``k`` drafts were accepted, read off the accept-length
    histogram (tokens per cycle → count) as ``Σ_{e ≥ k+1} hist[e]``; without one, ``verify_steps ·
    Π_{i<k} rate_i``. ``accepted_k = rate_k · reached_k`` with the engine's own conditional rate
    (exact where the engine truncated its last drafts). A NaN rate (position never judged) counts as
    not reached.
    """
    rates_arr = np.full(num_steps, np.nan)
    given = np.asarray(list(rates)[:num_steps], dtype=float)
    rates_arr[: len(given)] = given
    if hist:
        emitted = {int(k): float(v) for k, v in hist.items()}
        reached = np.array(
            [sum(v for e, v in emitted.items() if e >= k + 1) for k in range(num_steps)]
        )
    else:
        total = float(verify_steps) if verify_steps else 0.0
        prefix = np.concatenate([[1.0], np.cumprod(np.nan_to_num(rates_arr, nan=0.0))[:-1]])
        reached = total * prefix
    ok = np.isfinite(rates_arr)
    reached = np.where(ok, reached, 0.0)
    return reached, np.where(ok, np.clip(rates_arr, 0, 1) * reached, 0.0)


def _logit(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, EPS, 1 - EPS)
    return np.log(x / (1 - x))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _map_shift(
    base: list[np.ndarray],
    reached: list[np.ndarray],
    accepted: list[np.ndarray],
    *,
    mean: float,
    scale: float,
) -> float:
    """MAP of δ in ``acc ~ Binomial(reached, σ(base + δ))`` with prior ``δ ~ N(mean, scale²)``
    (Newton)."""
    b, n, a = (np.concatenate(x) if x else np.zeros(0) for x in (base, reached, accepted))
    delta = mean
    for _ in range(50):
        s = _sigmoid(b + delta)
        grad = float(np.sum(a - n * s)) - (delta - mean) / scale**2
        hess = -float(np.sum(n * s * (1 - s))) - 1.0 / scale**2
        step = grad / hess
        delta -= step
        if abs(step) < 1e-9:
            break
    return float(delta)


@dataclass
class _Wiring:
    prior: np.ndarray | None = None  # stage 1 per-position accuracy
    reached: np.ndarray = field(default_factory=lambda: np.zeros(0))
    accepted: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def add(self, reached: np.ndarray, accepted: np.ndarray) -> None:
        """Add one trial's counts per position, padding the shorter side with zeros.

        Args:
            reached: how often each position was reached.
            accepted: how often each position was accepted.
        """
        n = max(len(self.reached), len(reached))
        grow = lambda x: np.pad(x, (0, n - len(x)))  # noqa: E731
        self.reached = grow(self.reached) + grow(np.asarray(reached, dtype=float))
        self.accepted = grow(self.accepted) + grow(np.asarray(accepted, dtype=float))

    def base(self, n: int, default: float) -> np.ndarray:
        """The prior logits of positions ``0 .. n-1``.

        Args:
            n: number of positions (past the prior's last position, its last value repeats).
            default: the accuracy to use when the wiring has no stage 1 prior.

        Returns:
            ``[n]`` logits of the prior per-position accuracy.
        """
        prior = np.array([default]) if self.prior is None else self.prior
        return _logit(_positions(prior, n))

    def counts(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The counts of positions ``0 .. n-1``.

        Args:
            n: number of positions (counts are cut to it, or padded with zeros).

        Returns:
            ``(reached, accepted)``, each ``[n]``.
        """
        pad = lambda x: np.pad(x, (0, max(0, n - len(x))))[:n]  # noqa: E731
        return pad(self.reached), pad(self.accepted)


class AcceptanceModel:
    """Per-wiring posterior of conditional per-position acceptance (module docstring).

    Wirings are any hashable key; :func:`wiring_key` builds the one
    :class:`~bisect_eagle.perf.model.ThroughputModel` uses. ``prior_strength`` is ``κ``
    (pseudo-counts per position), ``shift_scale`` the prior sd of a wiring's logit shift around the
    global one, ``global_shift_scale`` the prior sd of the global shift.
    """

    def __init__(
        self,
        *,
        prior_strength: float = 8.0,
        shift_scale: float = 0.5,
        global_shift_scale: float = 1.0,
        default_accuracy: float = 0.6,
    ):
        if prior_strength <= 0:
            raise ValueError(f"prior_strength must be > 0, got {prior_strength}")
        self.prior_strength = prior_strength
        self.shift_scale = shift_scale
        self.global_shift_scale = global_shift_scale
        self.default_accuracy = default_accuracy
        self._w: dict[Hashable, _Wiring] = {}
        self._shifts: dict[Hashable, float] | None = None

    def wirings(self) -> list[Hashable]:
        """The wirings the model holds, in the order they were first added.

        Returns:
            The wiring keys.
        """
        return list(self._w)

    def set_prior(self, wiring: Hashable, per_position: Sequence[float]) -> None:
        """Stage 1's teacher-forced per-position accuracy of ``wiring`` (full-vocabulary, one per
        step)."""
        vals = np.asarray(
            [v for v in per_position if v is not None and math.isfinite(v)], dtype=float
        )
        if vals.size == 0:
            raise ValueError(f"wiring {wiring!r}: no finite per-position accuracy")
        self._w.setdefault(wiring, _Wiring()).prior = np.clip(vals, 0.0, 1.0)
        self._shifts = None

    def observe(
        self, wiring: Hashable, reached: Sequence[float], *, accepted: Sequence[float]
    ) -> None:
        """Add one trial's live counts per position (see :func:`position_counts`).

        Args:
            wiring: the wiring key (:func:`wiring_key`).
            reached: how often each position was reached.
            accepted: how often each position was accepted (same shape as ``reached``).

        Raises:
            ValueError: the shapes differ, or not ``reached >= accepted >= 0`` at every position.
        """
        r, a = np.asarray(reached, dtype=float), np.asarray(accepted, dtype=float)
        if r.shape != a.shape or np.any(a > r + 1e-9) or np.any(r < 0) or np.any(a < 0):
            raise ValueError("observe needs reached >= accepted >= 0, position by position")
        self._w.setdefault(wiring, _Wiring()).add(r, a)
        self._shifts = None

    def shift(self, wiring: Hashable) -> float:
        """The wiring's logit calibration ``δ_w`` (global shift for a wiring without live
        counts)."""
        if self._shifts is None:
            self._shifts = self._fit_shifts()
        return self._shifts.get(wiring, self._shifts["__global__"])

    def _fit_shifts(self) -> dict[Hashable, float]:
        data = {}
        for key, w in self._w.items():
            n = len(w.reached)
            if n and w.reached.sum() > 0:
                data[key] = (w.base(n, self.default_accuracy), *w.counts(n))
        glob = _map_shift(
            [d[0] for d in data.values()],
            [d[1] for d in data.values()],
            [d[2] for d in data.values()],
            mean=0.0,
            scale=self.global_shift_scale,
        )
        out: dict[Hashable, float] = {"__global__": glob}
        for key, (b, n, a) in data.items():
            out[key] = _map_shift([b], [n], [a], mean=glob, scale=self.shift_scale)
        return out

    def beta(self, wiring: Hashable, num_positions: int) -> tuple[np.ndarray, np.ndarray]:
        """Posterior Beta parameters ``(α, β)`` of ``p_0 .. p_{n-1}``."""
        w = self._w.get(wiring, _Wiring())
        m = _sigmoid(w.base(num_positions, self.default_accuracy) + self.shift(wiring))
        reached, accepted = w.counts(num_positions)
        k = self.prior_strength
        return k * m + accepted, k * (1 - m) + reached - accepted

    def mean(self, wiring: Hashable, num_positions: int) -> np.ndarray:
        """Posterior mean of ``p_0 .. p_{n-1}``.

        Args:
            wiring: the wiring key.
            num_positions: ``n``, the number of positions.

        Returns:
            ``[n]`` posterior means.
        """
        a, b = self.beta(wiring, num_positions)
        return a / (a + b)

    def sample(
        self, wiring: Hashable, num_positions: int, *, draws: int, rng: np.random.Generator
    ) -> np.ndarray:
        """Posterior draws ``[draws, n]`` of ``p_0 .. p_{n-1}`` (independent Betas).

        Args:
            wiring: the wiring key.
            num_positions: ``n``, the number of positions.
            draws: number of draws.
            rng: the random generator drawn from.

        Returns:
            ``[draws, n]`` draws.
        """
        a, b = self.beta(wiring, num_positions)
        return rng.beta(a, b, size=(draws, num_positions))

    def counts(self, wiring: Hashable) -> tuple[np.ndarray, np.ndarray]:
        """Live (reached, accepted) per position so far.

        Args:
            wiring: the wiring key.

        Returns:
            ``(reached, accepted)`` per position; empty arrays for a wiring never observed.
        """
        w = self._w.get(wiring, _Wiring())
        return w.counts(len(w.reached))


def wiring_key(layer_ids: Sequence[int] | None, algorithm: str = "EAGLE3") -> tuple:
    """A wiring's identity: the algorithm and its aux layer ids in capture (ascending) order."""
    return (algorithm, None if layer_ids is None else tuple(sorted(int(i) for i in layer_ids)))


def fit_rank_decay(
    observations: Sequence[tuple[np.ndarray, int, int, int, float]],
    grid: Sequence[float] = tuple(round(0.05 * i, 2) for i in range(1, 20)),
) -> float | None:
    """``ρ`` minimising the squared relative error of tree accept lengths.

    Each observation is ``(p, num_steps, topk, num_draft_tokens, measured accept length)`` with
    ``p`` the chain posterior mean at that time. ``None`` without observations.
    """
    if not observations:
        return None
    best, best_err = None, math.inf
    for rho in grid:
        err = 0.0
        for p, steps, topk, ndt, measured in observations:
            pred = accept_length(
                tree_survival(p, num_steps=steps, topk=topk, num_draft_tokens=ndt, rank_decay=rho)
            )
            err += ((pred - measured) / measured) ** 2
        if err < best_err:
            best, best_err = float(rho), err
    return best
