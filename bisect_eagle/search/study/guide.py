"""The throughput model inside a study: predict before launching, run the likeliest winner next, never launch a
config that cannot reach the target, and log every prediction beside its measurement.

A :class:`ModelGuide` holds one :class:`~bisect_eagle.perf.model.ThroughputModel` per process. It learns
acceptance priors from stage 1's per-position accuracy (the gate), and then every finished trial of the study
(the baseline and each worker's live trials, read back from their MLflow runs, so all workers learn the same
things). Before a config runs, :meth:`ModelGuide.forecast` gives its criterion metric (``output_tok_s`` or
``accept_length``) with the model's 80 % interval of a *measurement*, the chance that a measurement reaches
the target and the ``search.model.optimism`` quantile. The study loop
(:mod:`bisect_eagle.search.study.loop`) then:

- runs next the untried config with the highest chance (:meth:`ModelGuide.choose`, when the space can be
  listed; ties go to the higher prediction; at most :data:`CHOOSE_LIMIT` configs, a seeded sample of larger
  spaces), through Optuna's ``enqueue_trial``, so the sampler's history stays complete;
- never launches a config whose optimistic quantile misses the target (the Optuna trial is PRUNED with an
  infeasibility constraint and the user attribute ``skipped``), and stops when no untried config is left that
  could reach it, saying so — but only once the model has learned from a speculative live trial of this study:
  priors alone (stage 1's teacher-forced accuracy, default step costs) never rule a config out;
- logs ``predicted_*`` metrics on each live run (:meth:`Forecast.metrics`).

Forecasts are reused while nothing they depend on changed: a forecast depends only on the model's view of a
config (:class:`~bisect_eagle.perf.model.Config`: its wiring, speculative shape, concurrency and context, not its
fingerprint), the target and the model's state. So configs the model cannot tell apart share one forecast, the
config the guide chose is not forecast again when it runs, and trials that teach the model nothing (a failure,
a duplicate, a skipped or refused config) keep every forecast. A trial the model learns from changes its step
costs (refitted on all trials) and its acceptance posterior (a shift shared by all wirings), so every forecast
is made again then; what configs share within a model state (the acceptance part of a wiring and draft shape,
the target alone per context) is computed once (:class:`~bisect_eagle.perf.model.ThroughputModel`, "Reuse").

Before any cost observation (the baseline) there is no prediction and the sampler alone decides. From the
baseline on, the step costs no trial has measured yet come from the cold prior (:func:`cold_prior`:
:mod:`bisect_eagle.perf.prior` from the target's and the draft's config.json, the engine's tensor parallelism
and device, and the baseline's measured seconds per token), with an interval that is wide until speculative
trials fit them. The
distribution of a measurement is read as log-normal around the prediction with the spread of the interval's
upper half (speculation's risk is on the upside: an unseen wiring may accept more than stage 1 says), and never
narrower than :data:`MISFIT`: the model's own structural error, which its posterior does not know about.

Which model: the one the engine says fits it (:attr:`~bisect_eagle.engines.base.Engine.benchmark`: the local
engine's finite generations with truncated drafts; a server's steady state for SGLang, the stand-in and test
engines).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from bisect_eagle.artifacts.configs import read_config_json
from bisect_eagle.engines import benchmark_of
from bisect_eagle.engines.base import Engine
from bisect_eagle.errors import BadInput
from bisect_eagle.perf.cost import CostModel
from bisect_eagle.perf.model import Config, Prediction, ThroughputModel
from bisect_eagle.perf.prior import CPU_BANDWIDTH, GPU_BANDWIDTH, ColdPrior, Deployment, ModelSize
from bisect_eagle.spec.schema import Spec
from bisect_eagle.tracking.runs import Tracking
from bisect_eagle.trials.record import ACCEPT_CURVE, effective_of

INTERVAL_Z = NormalDist().inv_cdf(0.9)  # ThroughputModel's default interval is the central 80 %
MISFIT = 0.15  # least log-sd of a measurement around its prediction (scripts/bench_model.py: p90 error ~0.1)
CHOOSE_LIMIT = 5000  # configs forecast per choice (a forecast costs ~2-3 ms)
PREDICTED = ("predicted_output_tok_s", "predicted_output_tok_s_low", "predicted_output_tok_s_high",
             "predicted_accept_length")


@dataclass(frozen=True, kw_only=True)
class Forecast:
    """A config's predicted criterion metric before it runs, and its odds against the target."""

    metric: str  # the criterion metric: output_tok_s | accept_length
    value: float
    low: float  # the central 80 % of a measurement
    high: float
    optimistic: float  # the search.model.optimism quantile of a measurement
    chance: float  # probability that a measurement reaches the target
    prediction: Prediction

    def metrics(self) -> dict[str, float]:
        """The ``predicted_*`` metrics of a live run (tok/s with its interval, accept length, the chance)."""
        p = self.prediction
        out = {"predicted_output_tok_s": p.tok_s, "predicted_output_tok_s_low": p.low,
               "predicted_output_tok_s_high": p.high, "predicted_accept_length": p.accept_length,
               "predicted_chance": self.chance}
        if self.metric == "accept_length":
            out.update({"predicted_accept_length_low": self.low, "predicted_accept_length_high": self.high})
        return {k: float(v) for k, v in out.items() if math.isfinite(v)}

    def to_json(self) -> dict[str, Any]:
        """The forecast as stored on its Optuna trial (user attribute ``predicted``) and in ``model.json``."""
        return {"metric": self.metric, "value": self.value, "low": self.low, "high": self.high,
                "optimistic": self.optimistic, "chance": self.chance,
                "predicted_output_tok_s": self.prediction.tok_s}


def model_inputs(metrics: Mapping[str, float], effective: Mapping[str, Any], *,
                 rates: list[float]) -> dict[str, Any]:
    """What :meth:`ThroughputModel.update` reads, from a live run's logged metrics, effective settings and its
    per-position acceptance curve (``rates``; NaN where a position was never reached)."""
    out: dict[str, Any] = {"output_tok_s": metrics.get("output_tok_s"), "accept_length": metrics.get("accept_length"),
                           "accept_rate_per_position": rates}
    if metrics.get("completion_tokens") and effective.get("num_prompts"):
        out["completion_tokens"] = metrics["completion_tokens"]
        out["num_requests"] = int(effective["num_prompts"])
    return out


class ModelGuide:
    """One process's throughput model of a study, and the search decisions taken from it (module docstring)."""

    def __init__(self, *, engine: Engine | type[Engine] | str, metric: str, optimism: float,
                 standalone_metric: str = "full_vocab", prior: ColdPrior | None = None):
        """A guide with an untaught model.

        Args:
            engine: the study's engine (or its class), whose :attr:`~bisect_eagle.engines.base.Engine.benchmark`
                picks the model; an engine's name is looked up by :func:`~bisect_eagle.engines.benchmark_of`.
            metric: the criterion metric forecast: ``output_tok_s`` or ``accept_length``.
            optimism: the quantile of a config's measurement that must reach the target for it to run, in (0, 1).
            standalone_metric: which stage-1 per-position accuracy is the acceptance prior (``full_vocab`` ...).
            prior: the cold prior of the speculative step costs (:func:`cold_prior`); None: the cost model's
                default shares.
        """
        self.model = ThroughputModel(benchmark=benchmark_of(engine),
                                     cost=CostModel(prior=prior.terms if prior is not None else None))
        self.metric = metric
        self.optimism = optimism
        self.standalone_metric = standalone_metric
        self.learned: set[str] = set()  # MLflow run ids already taught to the model
        self._cache: dict[tuple[Config, float], Forecast | None] = {}  # (model's view, target) -> forecast
        self._cache_state = self.model.state  # the model's state the cached forecasts were made in
        self.forecasts = 0  # forecasts computed (not reused): what the model's guidance cost
        self._z = NormalDist().inv_cdf(optimism)
        self.live_learned = 0  # speculative live trials learned: until one, nothing is ruled out

    @property
    def ready(self) -> bool:
        """Whether the model can predict (it has seen at least one cost observation)."""
        return self.model.cost.n_obs > 0

    def learn_gate(self, gate: Iterable[Mapping[str, Any]]) -> None:
        """Stage 1's per-position accuracy of each scored wiring, as the acceptance prior of its layer ids."""
        for v in gate:
            per_position = [p[self.standalone_metric] if isinstance(p, Mapping) else p for p in v.get("per_position")
                            or []]
            if per_position and v.get("layer_ids"):
                self.model.set_standalone(v["layer_ids"], per_position)

    def learn_runs(self, tracking: Tracking, run_ids: Iterable[str | None]) -> int:
        """Teach the model every finished trial among ``run_ids`` it has not seen; returns how many were new.

        A run whose settings or metrics cannot be read (deleted, failed without metrics) is skipped for good.
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
            try:
                self.model.update(effective, model_inputs(run.data.metrics, effective, rates=_curve(tracking, run_id)),
                                  record=False)
            except ValueError:  # settings the model cannot read (e.g. topk > 1 without num_draft_tokens)
                continue
            new += 1
            self.live_learned += int(effective.get("num_steps") or 0) > 0
        return new  # what the model learned advanced its state: the forecasts are made again (forecast)

    def forecast(self, effective: Mapping[str, Any], *, target: float) -> Forecast | None:
        """The criterion metric of ``effective`` predicted against ``target``; None while the model cannot predict.

        Reused until the model learns something (the module docstring): settings the model reads alike share it.
        """
        if not self.ready:
            return None
        try:
            key = (self.model.config(effective), target)
        except ValueError:  # settings the model cannot read (e.g. topk > 1 without num_draft_tokens)
            return None
        if self._cache_state != self.model.state:  # the model learned something: every forecast may change
            self._cache, self._cache_state = {}, self.model.state
        if key not in self._cache:
            self._cache[key] = self._forecast(effective, target=target)
        return self._cache[key]

    def _forecast(self, effective: Mapping[str, Any], *, target: float) -> Forecast | None:
        self.forecasts += 1
        try:
            p = self.model.predict(effective)
        except ValueError:
            return None
        if self.metric == "output_tok_s":
            value, low, high = p.tok_s, p.low, p.high
        else:  # accept length: the acceptance posterior's draws (deterministic under greedy decoding)
            value, low, high = p.accept_length, *self._accept_length_interval(effective, p)
        if not (value > 0 and math.isfinite(value)):
            return None
        spread = max(math.log(max(high, value) / value) / INTERVAL_Z, MISFIT)
        chance = 1.0 - NormalDist(math.log(value), spread).cdf(math.log(target))
        optimistic = value * math.exp(self._z * spread)
        return Forecast(metric=self.metric, value=value, low=low, high=high, optimistic=optimistic, chance=chance,
                        prediction=p)

    def _accept_length_interval(self, effective: Mapping[str, Any], p: Prediction) -> tuple[float, float]:
        cfg = self.model.config(effective)
        if not cfg.speculative or cfg.adaptive:  # adaptive: no draws; the MISFIT floor gives its spread
            return p.accept_length, p.accept_length
        est = self.model.estimate(cfg)
        lo, hi = np.quantile(est.token_draws / est.cycle_draws, [0.1, 0.9])
        return float(lo), float(hi)

    def hopeless(self, forecast: Forecast | None, *, target: float) -> bool:
        """True when even the optimistic quantile of the prediction misses ``target`` (never launched); always
        False before the model has learned from a speculative live trial."""
        return self.live_learned > 0 and forecast is not None and forecast.optimistic < target

    def choose(self, untried: Mapping[str, tuple[dict[str, Any], dict[str, Any]]], *,
               target: float) -> tuple[dict[str, Any] | None, Forecast | None, int | None]:
        """The next config to run among ``untried`` (fingerprint -> (sampled values, effective settings)).

        Returns (its sampled values, its forecast, how many untried configs are hopeless); (None, None, n)
        when every untried config is hopeless, or when the model cannot predict yet (then n is 0). Above
        :data:`CHOOSE_LIMIT` configs a seeded sample is ranked and the count is None (nothing is concluded).
        """
        best: tuple[float, float] | None = None
        chosen: tuple[dict[str, Any] | None, Forecast | None] = (None, None)
        hopeless = 0
        items = list(untried.items())
        if len(items) > CHOOSE_LIMIT:
            rng = np.random.default_rng(len(self.learned))
            items = [items[i] for i in rng.choice(len(items), CHOOSE_LIMIT, replace=False)]
        for _, (sampled, effective) in items:
            fc = self.forecast(effective, target=target)  # reused until the model learns something
            if fc is None:
                return None, None, 0
            if self.hopeless(fc, target=target):
                hopeless += 1
                continue
            key = (fc.chance, fc.value)
            if best is None or key > best:
                best, chosen = key, (sampled, fc)
        return chosen[0], chosen[1], hopeless if len(items) == len(untried) else None


def cold_prior(spec: Spec) -> ColdPrior:
    """The cold prior of ``spec``'s deployment (:mod:`bisect_eagle.perf.prior`).

    Args:
        spec: read at ``target`` and ``draft`` (their config.json; one that cannot be read leaves that model's
            size unknown, as for a server's path that exists only on its node), the engine's tensor
            parallelism (``engine.sglang.tp`` / ``engine.vllm.tp``; 1 in process) and device (the local engine
            on ``cpu`` streams weights from DRAM; every other engine from a GPU's HBM).
    """
    server = spec.engine.server
    on_cpu = spec.engine.in_process and str(spec.fixed_settings().device).startswith("cpu")
    return ColdPrior(Deployment(target=_size(spec.target), draft=_size(spec.draft),
                                tp=server.tp if server is not None else 1,
                                bandwidth=CPU_BANDWIDTH if on_cpu else GPU_BANDWIDTH))


def _size(directory: Any) -> ModelSize | None:
    """The size of a model directory's config.json; None when there is none or it cannot be read."""
    if directory is None:
        return None
    try:
        return ModelSize.from_config(read_config_json(directory, "a model directory"))
    except (BadInput, OSError):
        return None


def _curve(tracking: Tracking, run_id: str) -> list[float]:
    """A run's per-position acceptance curve (``trials.ACCEPT_CURVE``, step = position; NaN for a gap)."""
    history = tracking.client.get_metric_history(run_id, ACCEPT_CURVE)
    by_step = {m.step: m.value for m in history}
    return [by_step.get(k, math.nan) for k in range(max(by_step) + 1)] if by_step else []


def summarize(guide: ModelGuide, *, tracking: Tracking, parent_run_id: str, skipped: list[dict[str, Any]],
              listed: Mapping[str, tuple[dict[str, Any], dict[str, Any]]] | None,
              best: Mapping[str, Any] | None,
              adaptive: Mapping[str, Any] | None) -> tuple[dict[str, float], dict[str, Any]]:
    """The study's model at its end: parent-run metrics and the ``model.json`` artifact.

    ``best``: the outcome's best trial (``fingerprint``, ``params`` = effective settings) or None; ``adaptive``:
    the engine's plan (effective settings) of the best config with SGLang's ``--speculative-adaptive``, None
    when the engine refuses it or SGLang turns it off. In ``model.json``: ``error``, the relative error of
    each live run's ``predicted_output_tok_s`` (made before it ran) against its measured tok/s and the share
    inside the 80 % interval; ``skipped``, the configs never launched (their params and forecast);
    ``adaptive``, that plan predicted; ``per_concurrency``, the best config the final model predicts at each
    concurrency level of the listed configs (the best trial's own level when the space cannot be listed), with
    the baseline's prediction at that level and the run that measured it, if any.
    """
    runs = [r for r in tracking.child_runs(parent_run_id) if r.data.tags.get("stage") == "live"]
    guide.learn_runs(tracking, [r.info.run_id for r in runs])
    pairs = [r.data.metrics for r in runs
             if {*PREDICTED[:3], "output_tok_s"} <= set(r.data.metrics) and r.data.metrics["output_tok_s"] > 0]
    errors = sorted(abs(m["predicted_output_tok_s"] - m["output_tok_s"]) / m["output_tok_s"] for m in pairs)
    inside = [m["predicted_output_tok_s_low"] <= m["output_tok_s"] <= m["predicted_output_tok_s_high"] for m in pairs]
    error: dict[str, float] = {"n": len(errors)}
    metrics = {"model_predictions": float(len(errors)), "model_skipped": float(len(skipped))}
    if errors:
        error.update(median_rel_error=float(np.median(errors)), mean_rel_error=float(np.mean(errors)),
                     p90_rel_error=float(np.quantile(errors, 0.9)), coverage=sum(inside) / len(inside))
        metrics.update(model_median_rel_error=error["median_rel_error"], model_coverage=error["coverage"])
    reference = None
    if adaptive is not None and guide.ready:
        with contextlib.suppress(ValueError):
            p = guide.model.predict(adaptive)
            reference = {"params": dict(adaptive), "predicted_output_tok_s": p.tok_s, "low": p.low, "high": p.high}
            metrics.update(predicted_adaptive_output_tok_s=p.tok_s, predicted_adaptive_output_tok_s_low=p.low,
                           predicted_adaptive_output_tok_s_high=p.high)
    measured = {r.data.tags.get("fingerprint"): r.info.run_id for r in runs if r.info.status == "FINISHED"}
    configs = dict(listed) if listed else ({best["fingerprint"]: ({}, dict(best["params"]))} if best else {})
    per_level = _per_concurrency(guide, configs, measured) if guide.ready else []
    return metrics, {"error": error, "skipped": skipped, "adaptive": reference, "per_concurrency": per_level}


def _per_concurrency(guide: ModelGuide, configs: Mapping[str, tuple[dict[str, Any], dict[str, Any]]],
                     measured: Mapping[str | None, str]) -> list[dict[str, Any]]:
    """The predicted best of ``configs`` (fingerprint -> (sampled, effective)) at each of their concurrency
    levels, beside the target alone at that level."""
    levels: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    for fp, (_, effective) in configs.items():
        levels.setdefault(int(effective.get("concurrency") or 1), []).append((fp, effective))
    out = []
    for level, items in sorted(levels.items()):
        scored = []
        for fp, effective in items:
            with contextlib.suppress(ValueError):
                scored.append((guide.model.predict(effective, concurrency=level), fp, effective))
        if not scored:
            continue
        p, fp, effective = max(scored, key=lambda x: x[0].tok_s)
        out.append({"concurrency": level, "best_params": dict(effective), "predicted_output_tok_s": p.tok_s,
                    "low": p.low, "high": p.high, "baseline_predicted_output_tok_s": p.baseline_tok_s,
                    "measured_run_id": measured.get(fp)})
    return out
