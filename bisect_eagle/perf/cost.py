"""The cost of speculative decoding: seconds for a batch's work, linear in fitted step costs, with
learned factors.

Work is a mapping ``term → amount`` (see :data:`TERMS`); for one verify cycle of a batch of ``B``
requests, each verifying ``T = num_draft_tokens`` tokens (1 without speculation) after ``s =
num_steps`` draft forwards (:func:`generation_work` builds it from a
:class:`~bisect_eagle.perf.horizon.GenerationWork`)::

    cycle_s = F_verify · (v0 + v1·B·T + Σ_k h_k·max(0, B·T - knot_k))   target verify (piecewise
                                                                       linear)
            + F_draft · s · (d0 + d1·(B·topk - 1))                     draft forwards
            + F_overhead · (x_spec·[s > 0] + r·B·P(reject) + c0 + c1·(B - 1))   per-cycle overheads

plus, for a finite generation, per request ``F_verify · prefill`` and ``F_draft · draft_prefill``
(the draft's first extend over the prompt). The verify cost is a function of the tokens in the
forward (``B·T``), so concurrency enters the same curve as longer drafts: speculation pays less as
the batch grows because ``v1`` (and any hinge slope) multiplies ``B·T`` while the accepted tokens
per request stay the same. On a GPU the curve is flat while memory-bound, then linear: give
``knots`` (e.g. the tokens where the verify becomes compute-bound) and the hinge slopes are fitted.
Attention's growth with context is ignored.

Factors. Each observation carries a context: ``key=value`` strings for environment variables and
server arguments (:func:`context_keys`). ``F_g = exp(Σ_k γ_{k,g})`` over the context's keys, per
group ``g`` of terms (verify, draft, overhead); the ``γ`` have a ridge penalty (a normal prior, sd
``factor_prior_sd``), so a key never seen, or one whose effect the data cannot tell apart from the
base costs, has factor 1.0.

Fit: weighted non-linear least squares on *relative* residuals ``pred/measured - 1`` (scipy's
``least_squares``, Huber loss beyond ``robust_scale``, step costs bounded ≥ 0), with a weak normal
prior on each step cost around a share of the typical one-token forward (sd ``prior_rel_sd`` × that
value), so the fit is defined from the baseline alone and collinear terms split sensibly; data
override it. A ``prior`` (e.g. :meth:`bisect_eagle.perf.prior.ColdPrior.terms`) replaces the share
and relative sd of the terms it names, given the measured one-token forward (the baseline's, from
its observations; the typical one without them). The residual sd is a scaled-inverse-χ² posterior
(prior ``sigma_prior`` with ``sigma_prior_dof`` pseudo-observations), and the parameter covariance
is ``σ² (JᵀJ)⁻¹`` at the solution: both shrink as observations arrive. A prediction's own
uncertainty is the delta-method relative sd of its seconds (:meth:`CostModel.relative_sd`), with the
ridge prior's sd for each context key no observation had (its factor is 1.0, not known to be).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from bisect_eagle.perf.horizon import GenerationWork

# term -> (factor group, prior share of a one-token target forward)
TERMS: dict[str, tuple[str, float]] = {
    "verify_fixed": ("verify", 0.95),  # per target forward
    "verify_token": ("verify", 0.03),  # per token in the forward (batch × tokens per request)
    "draft_step": ("draft", 0.1),  # per draft forward
    "draft_row": ("draft", 0.003),  # per extra row in a draft forward (batch·topk - 1)
    # per drafting cycle: draft extend/projection, tree build, acceptance
    "spec_fixed": ("overhead", 0.1),
    # per drafting cycle with a rejected draft (KV caches rolled back)
    "rollback": ("overhead", 0.02),
    "cycle_fixed": ("overhead", 0.05),  # per cycle outside the forwards (scheduling, sampling)
    "cycle_row": ("overhead", 0.005),  # per extra request in the batch, per cycle
    "prefill": ("verify", 2.0),  # per request: the target's prefill (finite generations only)
    # per drafting request: the draft's first extend over the prompt
    "draft_prefill": ("draft", 0.3),
}
HINGE_SHARE = 0.0
GROUPS = ("verify", "draft", "overhead")
COMPONENTS = ("verify", "draft_step", "draft_extend", "prefill", "draft_prefill")


def context_keys(
    env: Mapping[str, object] | None = None,
    server_args: Mapping[str, object] | None = None,
    server: Mapping[str, object] | None = None,
) -> tuple:
    """The factor keys of a configuration: ``env:NAME=value`` and ``server_args:name=value``,
    sorted.

    Every variable and argument is a candidate factor (NCCL_*, disable_custom_all_reduce,
    attention_backend, ...); the ridge keeps those without a measurable effect at 1.0. ``server``
    holds the server settings an engine resolved (a plan's ``effective["server"]``: SGLang's
    resolution moves ``attention_backend``, ``disable_custom_all_reduce`` ... there out of
    ``server_args``): each is a server argument too, under the same key as when it is only
    requested, and where both name one argument the resolved value is the one the server runs.
    Values that are mappings or lists are no setting of their own and are left out.
    """
    args = {
        **(server_args or {}),
        **{k: v for k, v in (server or {}).items() if not isinstance(v, Mapping | list)},
    }
    keys = [f"env:{k}={v}" for k, v in (env or {}).items()]
    keys += [f"server_args:{k}={v}" for k, v in args.items()]
    return tuple(sorted(keys))


def _hinges(
    n: np.ndarray | float, cycles: np.ndarray | float, knots: Iterable[float]
) -> dict[str, object]:
    """Hinge terms for ``n`` tokens per forward over ``cycles`` forwards (average tokens per
    forward)."""
    return {f"hinge_{k:g}": cycles * np.maximum(0.0, n - k) for k in knots}


def generation_work(
    gen: GenerationWork, *, batch: int = 1, topk: int = 1, knots: Iterable[float] = ()
) -> dict:
    """Work of a batch of ``batch`` requests each doing ``gen`` (module docstring); arrays stay
    arrays."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    cycles = gen.cycles
    per_forward = batch * gen.verify_tokens / np.maximum(cycles, 1e-12)
    spec_request = float(np.max(gen.spec_cycles) > 0) * gen.requests
    return {
        "verify_fixed": cycles,
        "verify_token": batch * gen.verify_tokens,
        **_hinges(per_forward, cycles, knots),
        "draft_step": gen.draft_steps,
        "draft_row": gen.draft_steps * (batch * topk - 1),
        "spec_fixed": gen.spec_cycles,
        "rollback": batch * np.asarray(gen.rollbacks, dtype=float) * np.ones_like(cycles),
        "cycle_fixed": cycles,
        "cycle_row": cycles * (batch - 1),
        "prefill": batch * gen.requests,
        "draft_prefill": batch * spec_request,
    }


def component_work(
    component: str, *, tokens: int = 1, batch: int = 1, knots: Iterable[float] = ()
) -> dict:
    """Work of one microbenchmarked forward.

    ``verify``: a target forward of ``tokens`` tokens per request; ``draft_step``: one draft forward
    (rows = ``batch·tokens``); ``draft_extend``: the draft forward that opens a cycle (a draft step
    + the per-cycle speculative overhead); ``prefill`` / ``draft_prefill``: one request's target /
    draft prefill.
    """
    n = batch * tokens
    if component == "verify":
        return {"verify_fixed": 1.0, "verify_token": float(n), **_hinges(float(n), 1.0, knots)}
    if component == "draft_step":
        return {"draft_step": 1.0, "draft_row": float(n - 1)}
    if component == "draft_extend":
        return {"draft_step": 1.0, "draft_row": float(batch - 1), "spec_fixed": 1.0}
    if component == "prefill":
        return {"prefill": float(batch)}
    if component == "draft_prefill":
        return {"draft_prefill": float(batch)}
    raise ValueError(f"unknown component {component!r}; expected one of {COMPONENTS}")


@dataclass
class _Obs:
    work: dict[str, float]
    seconds: float
    context: tuple
    weight: float
    source: str


class CostModel:
    """Step costs and context factors fitted to timed work (module docstring).

    ``knots``: token counts where the verify cost's slope may change; ``factor_prior_sd``: prior sd
    of each log factor (the ridge; 0.3 ≈ a factor within ×/÷1.35 a priori); ``prior_rel_sd``: prior
    sd of each step cost relative to its prior value (:data:`TERMS` shares of the typical one-token
    forward); ``sigma_prior`` (with ``sigma_prior_dof`` pseudo-observations): prior relative sd of
    one measurement around the model; ``robust_scale``: relative residual beyond which an
    observation's pull grows linearly, not quadratically (Huber loss: a trial slowed by a noisy
    neighbour bends the fit less; None = plain least squares); ``prior``: seconds of a one-token
    target forward -> ``{term: (share, relative sd)}`` replacing those terms' prior (module
    docstring; None = :data:`TERMS` and ``prior_rel_sd``).
    """

    def __init__(
        self,
        *,
        knots: Iterable[float] = (),
        factor_prior_sd: float = 0.3,
        prior_rel_sd: float = 3.0,
        sigma_prior: float = 0.08,
        sigma_prior_dof: float = 3.0,
        robust_scale: float | None = 0.05,
        prior: Callable[[float], Mapping[str, tuple[float, float]]] | None = None,
    ):
        self.knots = tuple(sorted(float(k) for k in knots))
        self.terms = {**TERMS, **{f"hinge_{k:g}": ("verify", HINGE_SHARE) for k in self.knots}}
        self.names = list(self.terms)
        self.factor_prior_sd = factor_prior_sd
        self.prior_rel_sd = prior_rel_sd
        self.sigma_prior = sigma_prior
        self.sigma_prior_dof = sigma_prior_dof
        self.robust_scale = robust_scale
        self.prior = prior
        self._obs: list[_Obs] = []
        self._fit: dict | None = None

    # -- data
    # -------------------------------------------------------------------------------------------

    def add(
        self,
        work: Mapping[str, float],
        seconds: float,
        *,
        context: Iterable[str] = (),
        weight: float = 1.0,
        source: str = "live",
    ) -> None:
        """One timing: ``seconds`` for ``work`` under ``context`` (``source``: ``live`` | ``micro``
        | ...).

        Args:
            work: cost term -> amount of work (an array is averaged).
            seconds: the measured seconds, finite and > 0.
            context: ``key=value`` strings of the conditions (:func:`context_keys`).
            weight: the observation's weight in the fit.
            source: where the timing comes from.

        Raises:
            ValueError: ``seconds`` is not finite and > 0, or ``work`` names an unknown term.
        """
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"seconds must be finite and > 0, got {seconds}")
        unknown = set(work) - set(self.terms)
        if unknown:
            raise ValueError(f"unknown cost terms {sorted(unknown)}; known: {self.names}")
        clean = {k: float(np.mean(v)) for k, v in work.items()}
        self._obs.append(_Obs(clean, float(seconds), tuple(sorted(context)), float(weight), source))
        self._fit = None

    @property
    def n_obs(self) -> int:
        return len(self._obs)

    def sources(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self._obs:
            out[o.source] = out.get(o.source, 0) + 1
        return out

    # -- fit
    # --------------------------------------------------------------------------------------------

    def _design(self, keys: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        x = np.array([[o.work.get(t, 0.0) for t in self.names] for o in self._obs])
        c = np.array([[float(k in o.context) for k in keys] for o in self._obs]).reshape(
            len(self._obs), len(keys)
        )
        y = np.array([o.seconds for o in self._obs])
        w = np.array([o.weight for o in self._obs])
        return x, c, y, w

    def fit(self) -> dict:
        """Fit (cached until the next :meth:`add`); returns the fitted state (see
        :meth:`summary`)."""
        if self._fit is not None:
            return self._fit
        if not self._obs:
            raise ValueError(
                "the cost model has no observations; add the baseline or a microbenchmark first"
            )
        keys = sorted({k for o in self._obs for k in o.context})
        x, c, y, w = self._design(keys)
        nt, ng = len(self.names), len(GROUPS)
        group_of = np.array([GROUPS.index(self.terms[t][0]) for t in self.names])
        shares = np.array([self.terms[t][1] for t in self.names])
        per_forward = y / np.maximum(x @ shares, 1e-12)
        unit = float(np.median(per_forward))  # one-token forward, seconds
        rel_sd = np.full(nt, self.prior_rel_sd)
        if self.prior is not None:
            baseline = [i for i, o in enumerate(self._obs) if o.source == "baseline"]
            for term, (share, sd) in self.prior(
                float(np.median(per_forward[baseline])) if baseline else unit
            ).items():
                shares[self.names.index(term)], rel_sd[self.names.index(term)] = share, sd
        theta0 = shares * unit
        # prior rows in the data's noise units: (θ - θ0) / sd_prior · σ_prior ~ N(0, σ²)
        sp = self.sigma_prior / (rel_sd * np.maximum(theta0, 0.01 * unit))
        # ridge on γ: γ ~ N(0, factor_prior_sd²)
        sw, sr = np.sqrt(w), self.sigma_prior / self.factor_prior_sd

        def unpack(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return z[:nt], z[nt:].reshape(len(keys), ng)

        def fun(z: np.ndarray) -> np.ndarray:
            theta, gamma = unpack(z)
            f = np.exp(c @ gamma)[:, group_of]  # [n, terms]
            pred = (x * f) @ theta
            return np.concatenate([sw * (pred / y - 1), sp * (theta - theta0), sr * gamma.ravel()])

        def jac(z: np.ndarray) -> np.ndarray:
            theta, gamma = unpack(z)
            f = np.exp(c @ gamma)[:, group_of]
            d_theta = sw[:, None] * x * f / y[:, None]
            contrib = x * f * theta  # [n, terms]
            per_group = np.stack([contrib[:, group_of == g].sum(axis=1) for g in range(ng)], axis=1)
            d_gamma = (sw / y)[:, None, None] * c[:, :, None] * per_group[:, None, :]
            top = np.concatenate([d_theta, d_gamma.reshape(len(y), -1)], axis=1)
            prior = np.concatenate([np.diag(sp), np.zeros((nt, len(keys) * ng))], axis=1)
            ridge = np.concatenate(
                [np.zeros((len(keys) * ng, nt)), np.eye(len(keys) * ng) * sr], axis=1
            )
            return np.concatenate([top, prior, ridge])

        z0 = np.concatenate([theta0, np.zeros(len(keys) * ng)])
        lower = np.concatenate([np.zeros(nt), np.full(len(keys) * ng, -np.inf)])
        robust = {"loss": "huber", "f_scale": self.robust_scale} if self.robust_scale else {}
        sol = least_squares(
            fun, z0, jac=jac, bounds=(lower, np.inf), method="trf", x_scale="jac", **robust
        )
        resid = fun(sol.x)[: len(y)] / np.maximum(sw, 1e-12)
        nu0 = self.sigma_prior_dof
        sigma = math.sqrt(
            (nu0 * self.sigma_prior**2 + float(np.sum(w * resid**2))) / (nu0 + float(np.sum(w)))
        )
        jj = jac(sol.x)
        cov = sigma**2 * np.linalg.pinv(jj.T @ jj)
        self._fit = {
            "z": sol.x,
            "cov": cov,
            "keys": keys,
            "sigma": sigma,
            "unit": unit,
            "group_of": group_of,
            "residuals": resid,
        }
        return self._fit

    # -- predict
    # ----------------------------------------------------------------------------------------

    def _vectors(
        self, work: Mapping[str, object], context: Iterable[str]
    ) -> tuple[np.ndarray, np.ndarray]:
        fit = self.fit()
        arrays = [np.asarray(work.get(t, 0.0), dtype=float) for t in self.names]
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
        x = np.stack([np.broadcast_to(a, shape) for a in arrays], axis=-1)  # [..., terms]
        ctx = set(context)
        c = np.array([float(k in ctx) for k in fit["keys"]])
        return x, c

    def predict(
        self, work: Mapping[str, object], *, context: Iterable[str] = ()
    ) -> np.ndarray | float:
        """Seconds for ``work`` under ``context`` at the fitted parameters (arrays in work stay
        arrays).

        Args:
            work: cost term -> amount of work (scalars or arrays).
            context: ``key=value`` strings of the conditions (:func:`context_keys`).

        Returns:
            Seconds: a float for scalar work, else an array.
        """
        x, c = self._vectors(work, context)
        out = self._gradient(x, c)[0]
        return float(out) if np.ndim(out) == 0 else out

    def _gradient(self, x: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(predictions [...], gradient [..., params]) of ``x`` [..., terms] at the fitted
        parameters."""
        fit = self.fit()
        nt, keys = len(self.names), fit["keys"]
        theta, gamma = fit["z"][:nt], fit["z"][nt:].reshape(len(keys), len(GROUPS))
        f = np.exp(c @ gamma)[fit["group_of"]]
        contrib = x * f * theta
        per_group = np.stack(
            [contrib[..., fit["group_of"] == g].sum(axis=-1) for g in range(len(GROUPS))], -1
        )
        d_gamma = c[:, None] * per_group[..., None, :]  # [..., keys, groups]
        grad = np.concatenate([x * f, d_gamma.reshape(*x.shape[:-1], -1)], axis=-1)
        return contrib.sum(axis=-1), grad

    def relative_sd(
        self, work: Mapping[str, object], *, context: Iterable[str] = ()
    ) -> np.ndarray | float:
        """Relative sd of the predicted seconds from parameter uncertainty (delta method on the
        fit)."""
        out = self._with_sd(work, context)[1]
        return float(out) if np.ndim(out) == 0 else out

    def _with_sd(
        self, work: Mapping[str, object], context: Iterable[str]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(predicted seconds, their relative sd) of ``work``, from one design vector and one
        gradient.

        A context key no observation had has factor 1.0 and its prior's uncertainty: each group's
        log factor ``N(0, factor_prior_sd²)``, scaled like the fitted keys' by ``σ / sigma_prior``.
        """
        fit = self.fit()
        x, c = self._vectors(work, context)
        pred, grad = self._gradient(x, c)
        var = np.einsum("...i,ij,...j->...", grad, fit["cov"], grad)
        unseen = len(set(context) - set(fit["keys"]))
        if unseen:
            contrib = grad[..., : len(self.names)] * fit["z"][: len(self.names)]
            per_group = np.stack(
                [contrib[..., fit["group_of"] == g].sum(axis=-1) for g in range(len(GROUPS))], -1
            )
            sd = self.factor_prior_sd * fit["sigma"] / self.sigma_prior
            var = var + unseen * sd**2 * (per_group**2).sum(axis=-1)
        return pred, np.sqrt(np.maximum(var, 0.0)) / np.maximum(pred, 1e-300)

    def sample(
        self,
        work: Mapping[str, object],
        *,
        context: Iterable[str] = (),
        draws: int,
        rng: np.random.Generator,
    ) -> np.ndarray:
        """``[draws]`` seconds under parameter uncertainty: the prediction times a log-normal factor
        whose sd is :meth:`relative_sd` (positive and centred on the point prediction). Arrays in
        ``work`` must have ``draws`` entries (e.g. paired acceptance draws) or be scalars.

        Args:
            work: cost term -> amount of work (scalars, or arrays of ``draws`` entries).
            context: ``key=value`` strings of the conditions (:func:`context_keys`).
            draws: number of draws.
            rng: the random generator drawn from.

        Returns:
            ``[draws]`` seconds.
        """
        pred, rel = self._with_sd(work, context)
        seconds = np.broadcast_to(np.asarray(pred, dtype=float), (draws,))
        sd = np.broadcast_to(np.asarray(rel, dtype=float), (draws,))
        return seconds * np.exp(sd * rng.standard_normal(draws))

    @property
    def sigma(self) -> float:
        """Relative sd of one measurement around the fitted cost (posterior)."""
        return float(self.fit()["sigma"])

    def params(self) -> dict[str, float]:
        """Fitted step costs in seconds.

        Returns:
            Cost term -> its fitted seconds per unit of work.
        """
        fit = self.fit()
        return {t: float(v) for t, v in zip(self.names, fit["z"][: len(self.names)], strict=True)}

    def factors(self) -> dict[str, dict[str, float]]:
        """Fitted multiplicative factor of each context key on each group (1.0 = no effect)."""
        fit = self.fit()
        gamma = fit["z"][len(self.names) :].reshape(len(fit["keys"]), len(GROUPS))
        return {
            k: {g: float(math.exp(gamma[i, j])) for j, g in enumerate(GROUPS)}
            for i, k in enumerate(fit["keys"])
        }

    def summary(self) -> dict:
        """Step costs, factors, residual sd and the observation count per source (JSON-friendly).

        Returns:
            ``params_s`` (:meth:`params`), ``factors``, ``sigma_rel`` and ``observations``.
        """
        return {
            "params_s": self.params(),
            "factors": self.factors(),
            "sigma_rel": self.sigma,
            "observations": self.sources(),
        }
