"""Throughput model: accepted tokens per verify cycle (acceptance) over the seconds of a cycle
(cost).

``tok/s = B · tokens per request / seconds for the batch's work``, where the work of a configuration
is its expected verify cycles, draft forwards and verified tokens
(:mod:`~bisect_eagle.perf.horizon`) under the acceptance posterior
(:mod:`~bisect_eagle.perf.acceptance`), priced by the fitted step costs and context factors
(:mod:`~bisect_eagle.perf.cost`). In steady state that is ``B · AL / cycle_s``.

Reuse: a prediction's parts that many configurations share are computed once per state of the model
(:attr:`ThroughputModel.state`, advanced by every learning call): the acceptance part (survival,
verify cycles, draft steps, with its posterior draws) per wiring, ``num_steps``, ``topk``,
``num_draft_tokens`` and tokens per request, and the target alone per concurrency, context and
tokens per request. Predictions are the same numbers as computed afresh (the acceptance part keeps
the state its draws left the seeded generator in).

Uncertainty: ``draws`` joint draws of the acceptance posterior and the cost parameters, each
multiplied by log-normal measurement noise with the cost fit's relative residual sd;
``low``/``high`` are the central ``interval`` quantiles, i.e. a prediction interval for the
*measured* tok/s. Both the posterior and the residual sd tighten as trials arrive. Draws use a fixed
seed, so a prediction is reproducible.

Learning (:meth:`ThroughputModel.update`): a chain trial adds its per-position (reached, accepted)
counts to its wiring's posterior; a tree trial refits the rank decay ``ρ`` (its per-depth rates mix
ranks and are not used as chain counts); every trial with a measured tok/s adds one cost observation
whose work is computed from the trial's *own* acceptance (its per-position rates, rescaled to its
measured accept length), so the cost fit never inherits the acceptance model's errors. Adaptive
trials only add acceptance counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from bisect_eagle.perf import acceptance as acc
from bisect_eagle.perf import horizon
from bisect_eagle.perf.acceptance import chain_survival
from bisect_eagle.perf.accuracy import ErrorRecord, ErrorReport, error_report
from bisect_eagle.perf.adaptive import simulate_occupancy, slot_for_batch
from bisect_eagle.perf.benchmark import STEADY_STATE, Benchmark
from bisect_eagle.perf.cost import CostModel, component_work, context_keys, generation_work
from bisect_eagle.perf.values import Config, Estimate, Prediction


def metrics_from_result(result: Any) -> dict[str, Any]:
    """The metrics :meth:`ThroughputModel.update` reads, from a ``TrialResult`` (or a mapping,
    unchanged)."""
    if isinstance(result, Mapping):
        return dict(result)
    requests = list(getattr(result, "requests", []) or [])
    out = {
        "output_tok_s": result.output_tok_s,
        "accept_length": result.accept_length,
        "accept_rate_per_position": list(result.accept_rate_per_position),
        "accept_length_hist": dict(result.accept_length_hist),
    }
    if requests:
        out["verify_steps"] = sum(r.verify_steps for r in requests)
        out["completion_tokens"] = sum(r.completion_tokens for r in requests)
        out["num_requests"] = len(requests)
    return out


class ThroughputModel:
    """Predicts tok/s (with an interval) for effective settings; learns from trials as they arrive.

    Args:
        benchmark: how the engine measures (:attr:`bisect_eagle.engines.base.Engine.benchmark`): a
            finite generation of ``max_new_tokens`` per request (prefills included), with drafts
            truncated in the last cycles where the engine does so, or steady-state decoding (the
            default, a server's benchmark).
        acceptance: the acceptance posterior (default: a fresh
            :class:`~bisect_eagle.perf.acceptance.AcceptanceModel`).
        cost: the step-cost fit (default: a fresh :class:`~bisect_eagle.perf.cost.CostModel`).
        draws: joint draws of the posterior and the costs per prediction.
        interval: the central share of a measurement's distribution that ``low``/``high`` bound, in
            (0, 1).
        rank_decay: the tree's rank decay ``ρ`` until tree trials refit it.
        seed: the draws' seed (a prediction is reproducible).
    """

    def __init__(
        self,
        *,
        benchmark: Benchmark = STEADY_STATE,
        acceptance: acc.AcceptanceModel | None = None,
        cost: CostModel | None = None,
        draws: int = 64,
        interval: float = 0.8,
        rank_decay: float = 0.6,
        seed: int = 0,
    ):
        if not 0 < interval < 1:
            raise ValueError(f"interval must be in (0, 1), got {interval}")
        self.benchmark = benchmark
        self.acceptance = acceptance or acc.AcceptanceModel()
        self.cost = cost or CostModel()
        self.draws = draws
        self.interval = interval
        self.rank_decay = rank_decay
        self.seed = seed
        self._tree_obs: list[tuple[tuple, int, int, int, float]] = []
        self._records: list[ErrorRecord] = []
        # advanced by every learning call: what a prediction depends on may have changed
        self.state = 0
        self._memo: dict[tuple, Any] = {}
        self._memo_state: tuple | None = None

    def _shared(self, key: tuple, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per ``key`` and state of the model (module docstring, "Reuse")."""
        state = (self.state, self.rank_decay, self.seed, self.draws)
        if state != self._memo_state:
            self._memo, self._memo_state = {}, state
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    # -- inputs
    # -----------------------------------------------------------------------------------------

    def config(self, effective: Mapping[str, Any], *, concurrency: int | None = None) -> Config:
        """The model's view of a plan's effective settings, under this model's benchmark.

        Args:
            effective: a plan's effective settings (:meth:`Config.from_effective` lists the keys
                read).
            concurrency: overrides the settings' own ``concurrency``.

        Returns:
            The config: wiring key, steps, topk, draft tokens, batch, cost context, and tokens per
            request when the benchmark is a finite generation.

        Raises:
            ValueError: concurrency below 1, or a speculative config without ``num_draft_tokens``.
        """
        return Config.from_effective(
            effective, concurrency=concurrency, finite_horizon=self.benchmark.finite_horizon
        )

    def set_standalone(
        self,
        layer_ids: Sequence[int] | None,
        per_position: Sequence[Any],
        *,
        algorithm: str = "EAGLE3",
        metric: str = "full_vocab",
    ) -> None:
        """Stage 1's per-position accuracy of a wiring: floats, or stage 1's dicts (``metric`` is
        read).

        Args:
            layer_ids: the wiring's aux layer ids (any order; None: the engine's default wiring).
            per_position: teacher-forced accuracy per draft position, position 0 first: floats in
                [0, 1], or stage 1's per-position dicts.
            algorithm: the speculative algorithm of the wiring key.
            metric: the dict key read from each dict (``"full_vocab"``).

        Raises:
            ValueError: no finite accuracy among ``per_position``.
        """
        vals = [p[metric] if isinstance(p, Mapping) else p for p in per_position]
        self.acceptance.set_prior(acc.wiring_key(layer_ids, algorithm), [float(v) for v in vals])
        self.state += 1

    def add_timing(
        self,
        component: str,
        seconds: float,
        *,
        tokens: int = 1,
        batch: int = 1,
        env: Mapping[str, object] | None = None,
        server_args: Mapping[str, object] | None = None,
        weight: float = 0.3,
    ) -> None:
        """A microbenchmarked forward (``verify``, ``draft_step``, ``draft_extend``, ``prefill``,
        ``draft_prefill``; see :func:`~bisect_eagle.perf.cost.component_work`) taking ``seconds``.

        ``weight`` is relative to one trial (1.0): an isolated forward is not exactly the same work
        inside a trial (hooks, Python between forwards, other logits), so by default trials outrank
        microbenchmarks where both inform a step cost, and microbenchmarks fill in what trials
        cannot separate.
        """
        work = component_work(component, tokens=tokens, batch=batch, knots=self.cost.knots)
        self.cost.add(
            work, seconds, context=context_keys(env, server_args), weight=weight, source="micro"
        )
        self.state += 1

    # -- prediction
    # -------------------------------------------------------------------------------------

    def _survival(self, cfg: Config, p: np.ndarray) -> np.ndarray:
        return acc.survival(
            p,
            num_steps=cfg.num_steps,
            topk=cfg.topk,
            num_draft_tokens=cfg.num_draft_tokens,
            rank_decay=self.rank_decay,
        )

    def _generation(self, cfg: Config, surv: np.ndarray) -> horizon.GenerationWork:
        if cfg.tokens is None:
            return horizon.steady_state(
                surv, num_steps=cfg.num_steps, num_draft_tokens=cfg.num_draft_tokens
            )
        return horizon.finite_generation(
            surv,
            tokens=cfg.tokens,
            num_steps=cfg.num_steps,
            num_draft_tokens=cfg.num_draft_tokens,
            truncate_drafts=self.benchmark.truncate_drafts and cfg.topk == 1,
        )

    def _work(
        self, cfg: Config, rng: np.random.Generator
    ) -> tuple[horizon.GenerationWork, horizon.GenerationWork]:
        """The acceptance part of ``cfg``'s work: at the posterior mean, and for ``draws`` posterior
        draws."""
        d, n = self.draws, max(cfg.num_steps, 1)
        if cfg.speculative:
            surv = self._survival(cfg, self.acceptance.mean(cfg.wiring, n))
            surv_d = self._survival(cfg, self.acceptance.sample(cfg.wiring, n, draws=d, rng=rng))
        else:
            surv, surv_d = np.zeros(1), np.zeros((d, 1))
        return self._generation(cfg, surv), self._generation(cfg, surv_d)

    def _seeded_work(
        self, cfg: Config
    ) -> tuple[horizon.GenerationWork, horizon.GenerationWork, dict]:
        """:meth:`_work` with the model's seeded generator, and the generator's state after it
        (shared)."""

        def compute() -> tuple[horizon.GenerationWork, horizon.GenerationWork, dict]:
            rng = np.random.default_rng(self.seed)
            return (*self._work(cfg, rng), rng.bit_generator.state)

        return self._shared(
            ("work", cfg.wiring, cfg.num_steps, cfg.topk, cfg.num_draft_tokens, cfg.tokens), compute
        )

    def estimate(self, cfg: Config, *, rng: np.random.Generator | None = None) -> Estimate:
        """Expected tokens, cycles and seconds of ``cfg`` (point and ``draws`` joint draws).

        Args:
            cfg: the configuration (:meth:`config`).
            rng: the generator for the draws; None: the model's seeded one, the acceptance part
                shared between configs and calls (a repeated call gives the same draws).

        Returns:
            Tokens and verify cycles per request, seconds for the batch, at the posterior mean and
            as ``draws`` joint draws each.
        """
        d = self.draws
        if rng is None:  # the seeded draws: the acceptance part is shared between configs and calls
            gen, gen_d, after = self._seeded_work(cfg)
            rng = np.random.default_rng(self.seed)
            rng.bit_generator.state = after
        else:
            gen, gen_d = self._work(cfg, rng)
        kw = {"batch": cfg.batch, "topk": cfg.topk, "knots": self.cost.knots}
        seconds = float(self.cost.predict(generation_work(gen, **kw), context=cfg.context))
        sec_d = self.cost.sample(
            generation_work(gen_d, **kw), context=cfg.context, draws=d, rng=rng
        )
        return Estimate(
            float(np.mean(gen.tokens)),
            float(np.mean(gen.cycles)),
            seconds,
            np.broadcast_to(gen_d.tokens, (d,)).astype(float),
            np.broadcast_to(gen_d.cycles, (d,)).astype(float),
            sec_d,
        )

    def interval_of(
        self, tok_s_draws: np.ndarray, *, rng: np.random.Generator | None = None
    ) -> tuple[float, float]:
        """Central ``interval`` of measured tok/s: parameter draws × log-normal measurement
        noise."""
        rng = rng or np.random.default_rng(self.seed + 1)
        noisy = tok_s_draws * np.exp(rng.normal(0.0, self.cost.sigma, size=tok_s_draws.shape))
        lo, hi = np.quantile(noisy, [(1 - self.interval) / 2, (1 + self.interval) / 2])
        return float(lo), float(hi)

    def predict(
        self, effective: Mapping[str, Any], *, concurrency: int | None = None
    ) -> Prediction:
        """Predicted tok/s of ``effective`` at ``concurrency`` (default: the settings' own, else 1).

        Needs at least one cost observation (the baseline or a microbenchmark).
        ``speculative_adaptive`` settings are predicted by :meth:`predict_adaptive`.

        Args:
            effective: a plan's effective settings (:meth:`config`).
            concurrency: the concurrency to predict at; None: the settings' own, else 1.

        Returns:
            The prediction: tok/s of the whole batch, accept length, the ``interval`` bounds of a
            measurement, seconds per verify cycle and the target-alone tok/s at the same
            concurrency.

        Raises:
            ValueError: what :meth:`config` refuses.
        """
        cfg = self.config(effective, concurrency=concurrency)
        if cfg.adaptive:
            return self.predict_adaptive(effective, concurrency=concurrency)
        est = self.estimate(cfg)
        tok_s = cfg.batch * est.tokens / est.seconds
        low, high = self.interval_of(cfg.batch * est.token_draws / est.second_draws)
        return Prediction(
            tok_s,
            est.tokens / est.cycles,
            low,
            high,
            cycle_s=est.seconds / est.cycles,
            baseline_tok_s=self._baseline_tok_s(cfg),
            concurrency=cfg.batch,
            details={"sigma_rel": self.cost.sigma},
        )

    def predict_adaptive(
        self,
        effective: Mapping[str, Any],
        *,
        concurrency: int | None = None,
        config: Mapping[str, Mapping[str, Any]] | None = None,
        cycles: int = 4000,
        seed: int = 0,
    ) -> Prediction:
        """Predicted tok/s of ``effective`` served with ``--speculative-adaptive``: SGLang's
        run-time ``num_steps`` policy simulated (:mod:`~bisect_eagle.perf.adaptive`) over this
        model's acceptance and costs at each candidate step count.

        Args:
            effective: a plan's effective settings; their wiring, context and ``num_steps`` (the
                initial step count) are used, and ``topk`` must be 1.
            concurrency: overrides the settings' own concurrency.
            config: the adaptive config (batch-size bucket -> slot); None: SGLang 0.5.23's default.
            cycles: verify cycles simulated.
            seed: the simulation's seed.

        Returns:
            The prediction; ``details`` carries ``occupancy`` (share of cycles per step count) and
            ``candidate_steps``.

        Raises:
            ValueError: ``topk`` is not 1 (SGLang refuses it).
        """
        cfg = replace(self.config(effective, concurrency=concurrency), adaptive=False)
        if cfg.topk != 1:
            raise ValueError(
                f"speculative_adaptive supports topk = 1 only (SGLang refuses topk = {cfg.topk})"
            )
        slot = slot_for_batch(cfg.batch, config)
        estimates, dist = {}, {}
        rng = np.random.default_rng(self.seed)
        for s in slot.candidate_steps:
            estimates[s] = self.estimate(
                replace(cfg, num_steps=s, topk=1, num_draft_tokens=s + 1), rng=rng
            )
            if s > 0:
                surv = chain_survival(self.acceptance.mean(cfg.wiring, s), s)
                dist[s] = np.clip(
                    np.concatenate([[1.0], surv]) - np.concatenate([surv, [0.0]]), 0.0, 1.0
                )
        initial = cfg.num_steps if cfg.num_steps in slot.candidate_steps else -1
        occ = simulate_occupancy(
            slot,
            initial_steps=initial,
            accepted_dist=dist,
            batch=cfg.batch,
            cycles=cycles,
            seed=seed,
        )
        # per cycle and request
        tokens = sum(occ[s] * estimates[s].tokens / estimates[s].cycles for s in occ)
        seconds = sum(occ[s] * estimates[s].seconds / estimates[s].cycles for s in occ)  # per cycle
        token_draws = sum(occ[s] * estimates[s].token_draws / estimates[s].cycle_draws for s in occ)
        second_draws = sum(
            occ[s] * estimates[s].second_draws / estimates[s].cycle_draws for s in occ
        )
        base = (
            estimates[0]
            if 0 in estimates
            else self.estimate(replace(cfg, num_steps=0, num_draft_tokens=1), rng=rng)
        )
        low, high = self.interval_of(cfg.batch * token_draws / second_draws)
        return Prediction(
            cfg.batch * tokens / seconds,
            tokens,
            low,
            high,
            cycle_s=seconds,
            baseline_tok_s=cfg.batch * base.tokens / base.seconds,
            concurrency=cfg.batch,
            details={
                "occupancy": {str(s): round(v, 4) for s, v in occ.items()},
                "candidate_steps": list(slot.candidate_steps),
                "sigma_rel": self.cost.sigma,
            },
        )

    def _baseline_tok_s(self, cfg: Config) -> float:
        """The target alone at ``cfg``'s concurrency, context and tokens per request (point values,
        shared)."""

        def compute() -> float:
            base = replace(cfg, num_steps=0, topk=1, num_draft_tokens=1)
            gen = self._generation(base, np.zeros(1))
            work = generation_work(gen, batch=base.batch, topk=1, knots=self.cost.knots)
            return (
                base.batch
                * float(np.mean(gen.tokens))
                / float(self.cost.predict(work, context=base.context))
            )

        return self._shared(("baseline", cfg.batch, cfg.context, cfg.tokens), compute)

    # -- learning
    # ---------------------------------------------------------------------------------------

    def update(
        self,
        effective: Mapping[str, Any],
        result_metrics: Any,
        *,
        concurrency: int | None = None,
        record: bool = True,
        learn_acceptance: bool = True,
        learn_cost: bool = True,
    ) -> Prediction | None:
        """Learn from one measured trial; returns the prediction made just before (None if none was
        possible).

        Args:
            effective: the trial plan's effective settings (:meth:`config`).
            result_metrics: a ``TrialResult`` or a mapping with ``output_tok_s``, ``accept_length``,
                ``accept_rate_per_position``, and optionally ``accept_length_hist``,
                ``verify_steps``, ``completion_tokens``, ``num_requests``.
            concurrency: overrides the settings' own ``concurrency``.
            record: predict first and keep the error record; False skips the prediction.
            learn_acceptance: let the trial update the acceptance posterior.
            learn_cost: let the trial add a cost observation (a held-out evaluation may let a trial
                inform acceptance only).

        Returns:
            The prediction made just before learning; None when ``record`` is False, no cost is
            observed yet, or the trial has no positive tok/s.

        Raises:
            ValueError: what :meth:`config` refuses.
        """
        m = metrics_from_result(result_metrics)
        cfg = self.config(effective, concurrency=concurrency)
        tok_s = float(m.get("output_tok_s") or math.nan)
        al = float(m.get("accept_length") or (1.0 if not cfg.speculative else math.nan))
        before = None
        if record and self.cost.n_obs and math.isfinite(tok_s) and tok_s > 0:
            before = self.predict(effective, concurrency=concurrency)
            self._records.append(ErrorRecord(cfg, before, tok_s, al))
        rates = [
            float(r) if r is not None else math.nan for r in m.get("accept_rate_per_position") or []
        ]
        if not learn_acceptance or not cfg.speculative:
            pass
        elif cfg.topk == 1 and rates:
            steps = len(rates) if cfg.adaptive else cfg.num_steps
            reached, accepted = acc.position_counts(
                num_steps=steps,
                rates=rates,
                hist=m.get("accept_length_hist"),
                verify_steps=_verify_steps(m, al),
            )
            self.acceptance.observe(cfg.wiring, reached, accepted=accepted)
        elif cfg.topk == 1 and not cfg.adaptive and math.isfinite(al):
            # no per-position rates: match the accept length
            rates = list(self._rates_matching(cfg, al))
            reached, accepted = acc.position_counts(
                num_steps=cfg.num_steps, rates=rates, verify_steps=_verify_steps(m, al) or 50.0
            )
            self.acceptance.observe(cfg.wiring, reached, accepted=accepted)
        elif math.isfinite(al):
            self._tree_obs.append((cfg.wiring, cfg.num_steps, cfg.topk, cfg.num_draft_tokens, al))
            self._refit_rank_decay()
        if (
            learn_cost
            and not cfg.adaptive
            and math.isfinite(tok_s)
            and tok_s > 0
            and math.isfinite(al)
            and al > 0
        ):
            self._add_cost_row(cfg, m, rates, tok_s, al)
        self.state += 1
        return before

    def _add_cost_row(
        self, cfg: Config, m: Mapping[str, Any], rates: list[float], tok_s: float, al: float
    ) -> None:
        """One cost observation, its work computed from the trial's own acceptance (module
        docstring)."""
        tokens = cfg.tokens
        if tokens is not None and m.get("completion_tokens") and m.get("num_requests"):
            tokens = max(1, round(float(m["completion_tokens"]) / float(m["num_requests"])))
        own = replace(cfg, tokens=tokens)
        if not cfg.speculative:
            surv = np.zeros(1)
        elif cfg.topk == 1 and rates:
            surv = acc.chain_survival(
                np.nan_to_num(np.asarray(rates, dtype=float), nan=0.0), cfg.num_steps
            )
        else:
            surv = self._survival(cfg, self.acceptance.mean(cfg.wiring, cfg.num_steps))
        gen = self._generation(own, surv)
        cycles = float(np.mean(gen.tokens)) / al  # the measured accept length fixes the cycle count
        scale = cycles / float(np.mean(gen.cycles))
        gen = horizon.GenerationWork(
            gen.tokens,
            gen.cycles * scale,
            gen.spec_cycles * scale,
            gen.draft_steps * scale,
            gen.verify_tokens * scale,
            gen.requests,
            gen.rollbacks * scale,
        )
        work = generation_work(gen, batch=cfg.batch, topk=cfg.topk, knots=self.cost.knots)
        seconds = cfg.batch * float(np.mean(gen.tokens)) / tok_s
        self.cost.add(
            work, seconds, context=cfg.context, source="live" if cfg.speculative else "baseline"
        )

    def _rates_matching(self, cfg: Config, al: float) -> np.ndarray:
        """Posterior-mean rates shifted by one logit offset so the chain's accept length is ``al``
        (bisection)."""
        p = np.clip(self.acceptance.mean(cfg.wiring, cfg.num_steps), 1e-4, 1 - 1e-4)
        logit = np.log(p / (1 - p))
        lo, hi = -20.0, 20.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if acc.chain_accept_length(1 / (1 + np.exp(-(logit + mid))), cfg.num_steps) < al:
                lo = mid
            else:
                hi = mid
        return 1 / (1 + np.exp(-(logit + (lo + hi) / 2)))

    def _refit_rank_decay(self) -> None:
        obs = [(self.acceptance.mean(w, s), s, k, n, al) for w, s, k, n, al in self._tree_obs]
        rho = acc.fit_rank_decay(obs)
        if rho is not None:
            self.rank_decay = rho

    def error_report(self) -> ErrorReport:
        """Median (mean, p90) relative error of the predictions :meth:`update` made before each
        measurement."""
        return error_report(self._records)


def _verify_steps(m: Mapping[str, Any], al: float) -> float | None:
    if m.get("verify_steps"):
        return float(m["verify_steps"])
    if m.get("completion_tokens") and math.isfinite(al) and al > 0:
        return float(m["completion_tokens"]) / al
    return None
