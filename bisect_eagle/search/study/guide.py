"""The throughput model inside a study: predict before launching, run the likeliest winner next,
never launch a config that cannot reach the target, and log every prediction beside its measurement.

A :class:`ModelGuide` holds one :class:`~bisect_eagle.perf.model.ThroughputModel` per process. It
learns acceptance priors from stage 1's per-position accuracy (the gate), and then every finished
trial of the study (the baseline and each worker's live trials, read back from their MLflow runs, so
all workers learn the same things). Before a config runs, :meth:`ModelGuide.forecast` gives its
criterion metric (``output_tok_s`` or ``accept_length``) with the model's 80 % interval of a
*measurement*, the chance that a measurement reaches the target, its expected improvement over the
target and the ``search.model.optimism`` quantile. The study loop
(:mod:`bisect_eagle.search.study.loop`) then:

- runs next the untried config with the highest **expected improvement** over the target
  (:meth:`ModelGuide.choose`: ``E[max(0, log measurement − log target)]``, which values both a
  config's predicted margin, what makes its confirmation cheap, and what the model does not know
  about it), through Optuna's ``enqueue_trial``, so the sampler's history stays complete (when the
  space can be listed; at most :data:`CHOOSE_LIMIT` configs, a seeded sample of larger spaces);
- **identifies before it trusts**: while the best untried config's chance is below
  :data:`IDENTIFY_BELOW` and the trials so far cannot tell a cost term apart (every speculative
  trial verified the same number of tokens, or ran the same number of draft steps:
  :meth:`ModelGuide.unidentified`), it runs the best config that varies that term, and says so;
- never launches a config whose optimistic quantile misses the target (the Optuna trial is PRUNED
  with an infeasibility constraint and the user attribute ``skipped``), and stops when no untried
  config is left that could reach it, saying so, but only once the model has earned it
  (:meth:`ModelGuide.vetoes`): it learned from a speculative live trial of this study and every cost
  term the untried configs vary is identified;
- logs ``predicted_*`` metrics on each live run (:meth:`Forecast.metrics`).

**Never worse than the sampler alone.** The model proposes; the loop keeps the sampler's guarantee
(:mod:`bisect_eagle.search.study.loop`): every :data:`SAMPLER_EVERY`-th live trial is the sampler's
own proposal, never vetoed, and when the model is stuck (:data:`STUCK_AFTER` of its own picks in a
row found no better measurement while its best untried chance stays below :data:`STUCK_CHANCE`) the
sampler proposes the next :data:`HANDOFF` trials alone. The spread of every forecast is never
narrower than the model's own measured error in this study (:meth:`ModelGuide.misfit`): a model that
predicts badly here widens its intervals, rules out less and leaves more to exploration; and each
forecast is corrected by the model's recent bias (:meth:`ModelGuide.bias`).

Forecasts are reused while nothing they depend on changed: a forecast depends only on the model's
view of a config (:class:`~bisect_eagle.perf.model.Config`: its wiring, speculative shape,
concurrency and context, not its fingerprint), the target and the model's state. So configs the
model cannot tell apart share one forecast, the config the guide chose is not forecast again when it
runs, and trials that teach the model nothing (a failure, a duplicate, a skipped or refused config)
keep every forecast. A trial the model learns from changes its step costs (refitted on all trials)
and its acceptance posterior (a shift shared by all wirings), so every forecast is made again then;
what configs share within a model state (the acceptance part of a wiring and draft shape, the target
alone per context) is computed once (:class:`~bisect_eagle.perf.model.ThroughputModel`, "Reuse").

Before any cost observation (the baseline) there is no prediction and the sampler alone decides.
From the baseline on, the step costs no trial has measured yet come from the cold prior
(:func:`cold_prior`: :mod:`bisect_eagle.perf.prior` from the target's and the draft's config.json,
the engine's tensor parallelism and device, and the baseline's measured seconds per token), with an
interval that is wide until speculative trials fit them. The distribution of a measurement is read
as log-normal around the prediction with the spread of the interval's upper half (speculation's risk
is on the upside: an unseen wiring may accept more than stage 1 says), and never narrower than
:data:`MISFIT`: the model's own structural error, which its posterior does not know about.

Which model: the one the engine says fits it (:attr:`~bisect_eagle.engines.base.Engine.benchmark`:
the local engine's finite generations with truncated drafts; a server's steady state for SGLang, the
stand-in and test engines).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any

import numpy as np

from bisect_eagle.artifacts.configs import read_config_json
from bisect_eagle.engines import benchmark_of
from bisect_eagle.engines.base import Engine
from bisect_eagle.engines.plan import acceptance_kind
from bisect_eagle.errors import BadInput
from bisect_eagle.perf.cost import CostModel
from bisect_eagle.perf.model import ThroughputModel
from bisect_eagle.perf.prior import CPU_BANDWIDTH, GPU_BANDWIDTH, ColdPrior, Deployment, ModelSize
from bisect_eagle.perf.values import Config, Prediction
from bisect_eagle.spec.schema import Spec
from bisect_eagle.tracking.runs import Tracking
from bisect_eagle.trials.record import ACCEPT_CURVE, effective_of

INTERVAL_Z = NormalDist().inv_cdf(0.9)  # ThroughputModel's default interval is the central 80 %
# least log-sd of a measurement around its prediction (scripts/bench_model.py: p90 error ~0.1)
MISFIT = 0.15
# below this best chance, a config that identifies an unidentified cost term runs first
IDENTIFY_BELOW = 0.5
SAMPLER_EVERY = 4  # every fourth live trial is the sampler's own proposal, never vetoed
STUCK_AFTER = 3  # the model's own picks in a row without a better measurement ...
# ... while its best untried config is likelier to miss the target than reach it: stuck
STUCK_CHANCE = 0.5
HANDOFF = 3  # live trials the sampler then proposes alone
# the model's own recent predictions whose errors set its least spread (ModelGuide.misfit)
RECENT = 4
CHOOSE_LIMIT = 5000  # configs forecast per choice (a forecast costs ~2-3 ms)


@dataclass(frozen=True, kw_only=True)
class Forecast:
    """A config's predicted criterion metric before it runs, and its odds against the target."""

    metric: str  # the criterion metric: output_tok_s | accept_length
    value: float
    low: float  # the central 80 % of a measurement
    high: float
    optimistic: float  # the search.model.optimism quantile of a measurement
    chance: float  # probability that a measurement reaches the target
    gain: float  # expected improvement over the target: E[max(0, log measurement - log target)]
    bias: float  # the log correction of the model's recent bias applied (ModelGuide.bias)
    prediction: Prediction  # with the bias corrected when the criterion is tok/s

    def metrics(self) -> dict[str, float]:
        """The ``predicted_*`` metrics of a live run (tok/s with its interval, accept length, the
        chance).

        Returns:
            Metric name -> value; a value that is not finite is left out.
        """
        p = self.prediction
        out = {
            "predicted_output_tok_s": p.tok_s,
            "predicted_output_tok_s_low": p.low,
            "predicted_output_tok_s_high": p.high,
            "predicted_accept_length": p.accept_length,
            "predicted_chance": self.chance,
            "predicted_gain": self.gain,
            "predicted_bias": self.bias,
        }
        if self.metric == "accept_length":
            out.update(
                {"predicted_accept_length_low": self.low, "predicted_accept_length_high": self.high}
            )
        return {k: float(v) for k, v in out.items() if math.isfinite(v)}

    def to_json(self) -> dict[str, Any]:
        """The forecast as stored on its Optuna trial (user attribute ``predicted``) and in
        ``model.json``.

        Returns:
            ``metric``, ``value``, ``low``, ``high``, ``optimistic``, ``chance``, ``gain`` and
            ``predicted_output_tok_s``.
        """
        return {
            "metric": self.metric,
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "optimistic": self.optimistic,
            "chance": self.chance,
            "gain": self.gain,
            "predicted_output_tok_s": self.prediction.tok_s,
        }


@dataclass(frozen=True, kw_only=True)
class Judgement:
    """The model's whole decision about a proposed config, as plain values
    (:meth:`ModelGuide.judge`)."""

    forecast: Forecast | None  # None while the model cannot predict the config
    predicted: dict[str, Any] | None  # as stored on the Optuna trial (Forecast.to_json)
    start_metrics: dict[str, float] | None  # its live run's ``predicted_*`` (Forecast.metrics)
    skip: str | None  # why it is never launched (the ``skipped`` attribute); None: it may run


def model_inputs(
    metrics: Mapping[str, float], effective: Mapping[str, Any], *, rates: list[float]
) -> dict[str, Any]:
    """What :meth:`ThroughputModel.update` reads, from a live run's logged metrics, effective
    settings and its per-position acceptance curve (``rates``; NaN where a position was never
    reached)."""
    out: dict[str, Any] = {
        "output_tok_s": metrics.get("output_tok_s"),
        "accept_length": metrics.get("accept_length"),
        "accept_rate_per_position": rates,
    }
    if metrics.get("completion_tokens") and effective.get("num_prompts"):
        out["completion_tokens"] = metrics["completion_tokens"]
        out["num_requests"] = int(effective["num_prompts"])
    return out


class ModelGuide:
    """One process's throughput model of a study, and the search decisions taken from it (module
    docstring)."""

    def __init__(
        self,
        *,
        engine: Engine | type[Engine] | str,
        metric: str,
        optimism: float,
        standalone_metric: str = "full_vocab",
        prior: ColdPrior | None = None,
    ):
        """A guide with an untaught model.

        Args:
            engine: the study's engine (or its class), whose
                :attr:`~bisect_eagle.engines.base.Engine.benchmark` picks the model; an engine's
                name is looked up by :func:`~bisect_eagle.engines.benchmark_of`.
            metric: the criterion metric forecast: ``output_tok_s`` or ``accept_length``.
            optimism: the quantile of a config's measurement that must reach the target for it to
                run, in (0, 1).
            standalone_metric: which stage-1 per-position accuracy is the acceptance prior
                (``full_vocab`` ...).
            prior: the cold prior of the speculative step costs (:func:`cold_prior`); None: the cost
                model's default shares.
        """
        self.model = ThroughputModel(
            benchmark=benchmark_of(engine),
            cost=CostModel(prior=prior.terms if prior is not None else None),
        )
        self.metric = metric
        self.optimism = optimism
        self.standalone_metric = standalone_metric
        self.learned: set[str] = set()  # MLflow run ids already taught to the model
        # (model's view, target) -> forecast
        self._cache: dict[tuple[Config, float], Forecast | None] = {}
        self._cache_state = self.model.state  # the model's state the cached forecasts were made in
        self.forecasts = 0  # forecasts computed (not reused): what the model's guidance cost
        self._z = NormalDist().inv_cdf(optimism)
        self.live_learned = 0  # speculative live trials learned: until one, nothing is ruled out
        # pinned-acceptance trials learned: their cost terms only (learn_runs)
        self.cost_learned = 0
        # (num_steps, topk, num_draft_tokens) of those trials
        self.shapes: set[tuple[int, int, int]] = set()
        self.errors: list[float] = []  # log(measured / predicted) of each live run, oldest first
        # why the last choice was made, when it was not the plain best expected improvement
        self.note = ""
        # the terms the untried configs of the last choice vary
        self.varied = {"verify_token", "draft_step"}

    @property
    def ready(self) -> bool:
        """Whether the model can predict (it has seen at least one cost observation)."""
        return self.model.cost.n_obs > 0

    def learn_gate(self, gate: Iterable[Mapping[str, Any]]) -> None:
        """Stage 1's per-position accuracy of each scored wiring, as the acceptance prior of its
        layer ids."""
        for v in gate:
            per_position = [
                p[self.standalone_metric] if isinstance(p, Mapping) else p
                for p in v.get("per_position") or []
            ]
            if per_position and v.get("layer_ids"):
                self.model.set_standalone(v["layer_ids"], per_position)

    def learn_runs(self, tracking: Tracking, run_ids: Iterable[str | None]) -> int:
        """Teach the model every finished trial among ``run_ids`` it has not seen; returns how many
        were new.

        A trial with acceptance pinned (``acceptance=pinned``: a bisect's side probe, a user's
        ``live --pin-acceptance`` logged in the study) teaches the cost terms alone: its cost row is
        computed from the profile it was pinned to and its measured accept length, as every trial's
        is from its own acceptance, while its accepted tokens were drawn, not the deployment's, and
        never reach the acceptance posterior, the model's error record or the count of live trials
        that earn it a veto (:meth:`vetoes`). A run whose settings or metrics cannot be read
        (deleted, failed without metrics) is skipped for good.

        Args:
            tracking: the study's tracking store.
            run_ids: MLflow run ids (None entries are ignored).

        Returns:
            How many runs were new to the model.
        """
        new = 0
        for run_id in run_ids:
            if not run_id or run_id in self.learned:
                continue
            self.learned.add(run_id)
            run = tracking.get_run(run_id)
            if run.info.status != "FINISHED" or "output_tok_s" not in run.data.metrics:
                continue
            effective = effective_of(tracking, run)
            # a pinned trial's acceptance was drawn: cost only
            natural = acceptance_kind(effective) == "natural"
            try:
                self.model.update(
                    effective,
                    model_inputs(run.data.metrics, effective, rates=_curve(tracking, run_id)),
                    record=False,
                    learn_acceptance=natural,
                )
            # settings the model cannot read (e.g. topk > 1 without num_draft_tokens)
            except ValueError:
                continue
            new += 1
            steps = int(effective.get("num_steps") or 0)
            if steps > 0 and effective.get("speculative_algorithm") != "none":
                self.shapes.add(
                    (
                        steps,
                        int(effective.get("topk") or 1),
                        int(effective.get("num_draft_tokens") or 0),
                    )
                )
                if natural:
                    self.live_learned += 1
                else:
                    self.cost_learned += 1
            if natural:
                self._score(run.data.metrics)
        # what the model learned advanced its state: the forecasts are made again (forecast)
        return new

    def _score(self, metrics: Mapping[str, float]) -> None:
        """Keep how a live run's prediction (logged before it ran) fared against its measurement."""
        name = "output_tok_s" if self.metric == "output_tok_s" else "accept_length"
        predicted, measured = metrics.get(f"predicted_{name}"), metrics.get(name)
        # against the model's own, uncorrected
        if predicted and measured and predicted > 0 and measured > 0:
            corrected = metrics.get("predicted_bias", 0.0) if name == "output_tok_s" else 0.0
            self.errors.append(math.log(measured / predicted) + corrected)

    def bias(self) -> float:
        """The model's recent bias in this study: the mean log error of its last :data:`RECENT`
        predictions (two or more; else 0), shrunk by ``n / (n + 1)``. Every forecast is corrected by
        it, so a model that keeps over-predicting (a cost it does not have a term for) stops
        believing its own optimism."""
        recent = self.errors[-RECENT:]
        return sum(recent) / (len(recent) + 1) if len(recent) >= 2 else 0.0

    def misfit(self) -> float:
        """The least log-sd of a measurement around its (bias-corrected) prediction: :data:`MISFIT`,
        or the root mean square of the model's log errors over its last :data:`RECENT` predictions
        in this study about their bias (:meth:`bias`) when that is larger (two or more): a model
        that predicts this deployment erratically widens every interval, rules out less and explores
        more; its cold start's errors, once the trials have taught it, no longer do."""
        recent = self.errors[-RECENT:]
        if len(recent) < 2:
            return MISFIT
        bias = self.bias()
        return max(MISFIT, math.sqrt(sum((e - bias) ** 2 for e in recent) / len(recent)))

    def unidentified(self) -> list[tuple[str, str]]:
        """Cost terms the speculative trials so far cannot tell apart from the rest, with why, among
        those the untried configs of the last :meth:`choose` vary (a term no remaining config varies
        changes none of their predictions): ``verify_token`` while every trial verified the same
        number of tokens, ``draft_step`` while every trial ran the same number of draft steps. Empty
        before the first speculative trial."""
        if not self.shapes:
            return []
        out = []
        ndts = {n for _, _, n in self.shapes}
        if len(ndts) < 2 and "verify_token" in self.varied:
            out.append(
                (
                    "verify_token",
                    f"every speculative trial so far verified {next(iter(ndts))} tokens",
                )
            )
        steps = {k for k, _, _ in self.shapes}
        if len(steps) < 2 and "draft_step" in self.varied:
            out.append(
                (
                    "draft_step",
                    f"every speculative trial so far ran {next(iter(steps))} draft steps",
                )
            )
        return out

    def vetoes(self) -> bool:
        """Whether the model may rule configs out (module docstring): it learned from a speculative
        live trial and every cost term the untried configs vary is identified (its recent errors
        already set its spread:
        :meth:`misfit`)."""
        return self.live_learned > 0 and not self.unidentified()

    def forecast(self, effective: Mapping[str, Any], *, target: float) -> Forecast | None:
        """The criterion metric of ``effective`` predicted against ``target``; None while the model
        cannot predict.

        Reused until the model learns something (the module docstring): settings the model reads
        alike share it.
        """
        if not self.ready:
            return None
        try:
            key = (self.model.config(effective), target)
        # settings the model cannot read (e.g. topk > 1 without num_draft_tokens)
        except ValueError:
            return None
        # the model learned something: every forecast may change
        if self._cache_state != self.model.state:
            self._cache, self._cache_state = {}, self.model.state
        if key not in self._cache:
            self._cache[key] = self._forecast(effective, target=target)
        return self._cache[key]

    def judge(self, effective: Mapping[str, Any], *, target: float, may_skip: bool) -> Judgement:
        """The model's whole decision about a proposed config, in one call: its forecast
        (:meth:`forecast`), as stored and as logged, and whether it is skipped (:meth:`hopeless`).

        Args:
            effective: the plan's effective settings.
            target: the study's target of the criterion metric.
            may_skip: whether the config may be ruled out (False for the sampler's own proposal).

        Returns:
            The judgement; ``skip`` names the predicted and optimistic values against the target
            when ``may_skip`` and the config is hopeless.
        """
        fc = self.forecast(effective, target=target)
        skip = None
        if may_skip and fc is not None and self.hopeless(fc, target=target):
            skip = (
                f"predicted {fc.metric} {fc.value:.4g} (optimistic {fc.optimistic:.4g}) < target "
                f"{target:.4g}"
            )
        return Judgement(
            forecast=fc,
            predicted=None if fc is None else fc.to_json(),
            start_metrics=None if fc is None else fc.metrics(),
            skip=skip,
        )

    def _forecast(self, effective: Mapping[str, Any], *, target: float) -> Forecast | None:
        self.forecasts += 1
        try:
            p = self.model.predict(effective)
        except ValueError:
            return None
        shift = math.exp(self.bias())
        if self.metric == "output_tok_s":
            p = replace(p, tok_s=p.tok_s * shift, low=p.low * shift, high=p.high * shift)
            value, low, high = p.tok_s, p.low, p.high
        # accept length: the acceptance posterior's draws (deterministic under greedy decoding)
        else:
            value, low, high = (
                x * shift for x in (p.accept_length, *self._accept_length_interval(effective, p))
            )
        if not (value > 0 and math.isfinite(value)):
            return None
        spread = max(math.log(max(high, value) / value) / INTERVAL_Z, self.misfit())
        margin = math.log(value / target)
        z = margin / spread
        unit = NormalDist()
        chance = unit.cdf(z)
        gain = spread * math.exp(-z * z / 2) / math.sqrt(2 * math.pi) + margin * unit.cdf(z)
        optimistic = value * math.exp(self._z * spread)
        return Forecast(
            metric=self.metric,
            value=value,
            low=low,
            high=high,
            optimistic=optimistic,
            chance=chance,
            gain=gain,
            bias=self.bias(),
            prediction=p,
        )

    def _accept_length_interval(
        self, effective: Mapping[str, Any], p: Prediction
    ) -> tuple[float, float]:
        cfg = self.model.config(effective)
        # adaptive: no draws; the MISFIT floor gives its spread
        if not cfg.speculative or cfg.adaptive:
            return p.accept_length, p.accept_length
        est = self.model.estimate(cfg)
        lo, hi = np.quantile(est.token_draws / est.cycle_draws, [0.1, 0.9])
        return float(lo), float(hi)

    def hopeless(self, forecast: Forecast | None, *, target: float) -> bool:
        """True when even the optimistic quantile of the prediction misses ``target`` (never
        launched); always False while the model has not earned a veto (:meth:`vetoes`)."""
        return forecast is not None and forecast.optimistic < target and self.vetoes()

    def choose(
        self, untried: Mapping[str, tuple[dict[str, Any], dict[str, Any]]], *, target: float
    ) -> tuple[dict[str, Any] | None, Forecast | None, int | None]:
        """The next config to run among ``untried`` (fingerprint -> (sampled values, effective
        settings)).

        The highest expected improvement over ``target``; while the best chance is below
        :data:`IDENTIFY_BELOW` and a cost term is unidentified, the highest among the configs that
        vary it (:attr:`note` says why).

        Returns:
            (its sampled values, its forecast, how many untried configs are hopeless); (None, None,
            n) when every untried config is hopeless, or when the model cannot predict yet (then n
            is 0). Above :data:`CHOOSE_LIMIT` configs a seeded sample is ranked and the count is
            None (nothing is concluded).
        """
        self.note = ""
        items = list(untried.items())
        self.varied = {
            t
            for t in ("verify_token", "draft_step")
            if any(_varies(t, e, self.shapes) for _, e in untried.values())
        }
        if len(items) > CHOOSE_LIMIT:
            rng = np.random.default_rng(len(self.learned))
            items = [items[i] for i in rng.choice(len(items), CHOOSE_LIMIT, replace=False)]
        ranked: list[tuple[float, float, dict[str, Any], dict[str, Any], Forecast]] = []
        hopeless = 0
        for _, (sampled, effective) in items:
            fc = self.forecast(effective, target=target)  # reused until the model learns something
            if fc is None:
                return None, None, 0
            if self.hopeless(fc, target=target):
                hopeless += 1
                continue
            ranked.append((fc.gain, fc.value, sampled, effective, fc))
        counted = hopeless if len(items) == len(untried) else None
        if not ranked:
            return None, None, counted
        best = max(ranked, key=lambda r: (r[0], r[1]))
        if best[4].chance < IDENTIFY_BELOW:
            for term, why in self.unidentified():
                varying = [r for r in ranked if _varies(term, r[3], self.shapes)]
                if varying:
                    best = max(varying, key=lambda r: (r[0], r[1]))
                    self.note = (
                        f"identifying {term}: {why}; the best untried chance is "
                        f"{max(r[4].chance for r in ranked):.0%}"
                    )
                    break
        return best[2], best[4], counted


def _varies(term: str, effective: Mapping[str, Any], shapes: set[tuple[int, int, int]]) -> bool:
    """Whether a config's shape differs from every measured one in what identifies ``term``."""
    if int(effective.get("num_steps") or 0) == 0:
        return False
    if term == "verify_token":
        return int(effective.get("num_draft_tokens") or 0) not in {n for _, _, n in shapes}
    return int(effective.get("num_steps") or 0) not in {k for k, _, _ in shapes}


def cold_prior(spec: Spec) -> ColdPrior:
    """The cold prior of ``spec``'s deployment (:mod:`bisect_eagle.perf.prior`).

    Args:
        spec: read at ``target`` and ``draft`` (their config.json; one that cannot be read leaves
            that model's size unknown, as for a server's path that exists only on its node), the
            engine's tensor parallelism (``engine.sglang.tp`` / ``engine.vllm.tp``; 1 in process)
            and device (the local engine on ``cpu`` streams weights from DRAM; every other engine
            from a GPU's HBM).
    """
    server = spec.engine.server
    on_cpu = spec.engine.in_process and str(spec.fixed_settings().device).startswith("cpu")
    return ColdPrior(
        Deployment(
            target=_size(spec.target),
            draft=_size(spec.draft),
            tp=server.tp if server is not None else 1,
            bandwidth=CPU_BANDWIDTH if on_cpu else GPU_BANDWIDTH,
        )
    )


def _size(directory: Any) -> ModelSize | None:
    """The size of a model directory's config.json; None when there is none or it cannot be read."""
    if directory is None:
        return None
    try:
        return ModelSize.from_config(read_config_json(directory, "a model directory"))
    except (BadInput, OSError):
        return None


def _curve(tracking: Tracking, run_id: str) -> list[float]:
    """A run's per-position acceptance curve (``trials.ACCEPT_CURVE``, step = position; NaN for a
    gap)."""
    history = tracking.client.get_metric_history(run_id, ACCEPT_CURVE)
    by_step = {m.step: m.value for m in history}
    return [by_step.get(k, math.nan) for k in range(max(by_step) + 1)] if by_step else []
