"""Benchmark search strategies on the tiny scenario: measure its landscape once, then replay strategies on it.

1. Landscape: stage-1 standalone accuracy of every candidate wiring, and one live measurement of every
   distinct effective config (all wirings × the spec's space, deduplicated by fingerprint) plus the
   no-speculation baseline, with the spec's engine (default: the embedded tiny spec, local engine, CPU).
2. Replays (>= 20 seeds each), counting live trials until a measured config meets the spec's criterion:
   * ``grid``       -- SGLang's bench_speculative.py method: the Cartesian grid of *requested* configs in
                       nested-loop order (no dedupe of effective duplicates), here stopped at the first hit;
                       the seed shuffles the order of each dimension's choices. ``grid_full`` is the whole
                       sweep that bench_speculative.py actually runs (it has no stop criterion).
   * ``random``     -- random search over all wirings × the space (fingerprint dedupe, as the tool does);
   * ``tpe_nogate`` -- TPE over all wirings × the space (dedupe, no standalone gate);
   * ``staged``     -- the tool: the standalone gate first (0 live trials), then TPE over the survivors.
3. Tool overhead: the real ``run_study`` (Optuna SQLite + claims + MLflow SQLite + artifacts) with an engine
   that replays the landscape instantly, so all its time is orchestration and tracking.

The last line printed is one JSON object: {"live_trials_to_target": {...}, "tool_overhead_s_per_trial": ...}.

    python scripts/bench_search.py                        # measure (a few minutes on 2 cores) and replay
    python scripts/bench_search.py --landscape land.json  # reuse a saved landscape (written when absent)
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
import typer

from bisect_eagle.engines import make_engine
from bisect_eagle.engines.base import Engine, TrialResult
from bisect_eagle.search.gate import Scorer, Verdict, apply_gate
from bisect_eagle.search.space import SearchSpace
from bisect_eagle.search.study import Options, live_space, make_sampler, run_study
from bisect_eagle.settings import LiveSettings
from bisect_eagle.spec import DEFAULT_SPEC, WIRING_SETTING, Param, Spec, load_spec
from bisect_eagle.trials import identity

app = typer.Typer(add_completion=False)


# ---------------------------------------------------------------------------------------------------
# 1. the landscape


def full_space(spec: Spec, wirings: list[list[int]]) -> SearchSpace:
    """Every candidate wiring (no gate) × the spec's space."""
    params = {WIRING_SETTING: Param(type="categorical", choices=wirings), **spec.space}
    return SearchSpace(params, spec.engine.settings, str(spec.source))


def measure_landscape(spec: Spec) -> dict[str, Any]:
    """Stage-1 verdicts, the baseline and one measurement per distinct effective config."""
    scorer = Scorer(spec)
    verdicts = [scorer.score(c) for c in scorer.candidates()]
    del scorer
    space = full_space(spec, [v.layer_ids for v in verdicts])
    configs: dict[str, dict[str, Any]] = {}
    for sampled in space.enumerate():
        effective, _, fp = identity(space.settings(sampled))
        configs.setdefault(fp, {"sampled": sampled, "effective": effective})
    baseline = spec.fixed_settings().model_copy(update={"speculative_algorithm": "none"})
    with make_engine(spec) as engine:
        base = engine.run(baseline)
        print(f"baseline: {base.output_tok_s:.1f} tok/s, accept length {base.accept_length:.2f}", flush=True)
        for i, cfg in enumerate(configs.values()):
            r = engine.run(space.settings(cfg["sampled"]))
            cfg.update(status=r.status, output_tok_s=r.output_tok_s, accept_length=r.accept_length,
                       wall_s=r.wall_s, failure_class=r.failure_class)
            print(f"[{i + 1}/{len(configs)}] {cfg['sampled']}: {r.status} {r.output_tok_s:.1f} tok/s, "
                  f"accept length {r.accept_length:.2f}", flush=True)
    return {"spec": str(spec.source), "verdicts": [v.to_json() for v in verdicts],
            "baseline": {"output_tok_s": base.output_tok_s, "accept_length": base.accept_length,
                         "fingerprint": identity(baseline)[2]},
            "configs": configs}


# ---------------------------------------------------------------------------------------------------
# 2. replays


def target_of(spec: Spec, land: dict[str, Any]) -> float:
    return spec.criterion.ratio * land["baseline"][spec.criterion.metric]


def value_of(land: dict[str, Any], fp: str, metric: str) -> float | None:
    cfg = land["configs"][fp]
    return cfg[metric] if cfg["status"] == "ok" else None


def replay_optuna(spec: Spec, land: dict[str, Any], space: SearchSpace, sampler_name: str, seed: int,
                  cap: int) -> int:
    """Distinct live configs an Optuna sampler measures before one meets the target (dedupe as the tool)."""
    metric, target = spec.criterion.metric, target_of(spec, land)
    s = spec.model_copy(update={"search": spec.search.model_copy(update={"sampler": sampler_name})})
    study = optuna.create_study(direction="maximize", sampler=make_sampler(s, space, seed))
    seen: dict[str, float | None] = {}
    for _ in range(cap * 50):
        trial = study.ask()
        fp = identity(space.settings(space.suggest(trial)))[2]
        if fp not in seen:
            seen[fp] = value_of(land, fp, metric)
            if seen[fp] is not None and seen[fp] >= target:
                return len(seen)
        if seen[fp] is None:
            trial.set_constraint("crashed", 1.0)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, seen[fp])
        if len(seen) >= cap:
            break
    return cap + 1  # not reached within every distinct config: counted as one past the cap


def grid_orders(space: SearchSpace, rng: random.Random) -> list[dict[str, Any]]:
    """The requested grid in nested-loop order, each dimension's choices shuffled by ``rng``."""
    dims = []
    for name in space.order:
        vals = list(space.values(name))
        rng.shuffle(vals)
        dims.append(vals)
    out = []
    for combo in itertools.product(*dims):
        sampled: dict[str, Any] = {}
        for name, value in zip(space.order, combo, strict=True):
            if space.active(name, sampled):
                sampled[name] = value
        out.append(sampled)
    return out


def replay_grid(spec: Spec, land: dict[str, Any], space: SearchSpace, seed: int) -> int:
    """bench_speculative.py's sweep: every requested config in order (effective duplicates run again)."""
    metric, target = spec.criterion.metric, target_of(spec, land)
    order = grid_orders(space, random.Random(seed))
    for i, sampled in enumerate(order, 1):
        value = value_of(land, identity(space.settings(sampled))[2], metric)
        if value is not None and value >= target:
            return i
    return len(order) + 1


def gated_space(spec: Spec, land: dict[str, Any]) -> SearchSpace:
    verdicts = [Verdict(**v) for v in land["verdicts"]]
    reference = spec.training_accuracy if spec.standalone.reference == "training" else None
    apply_gate(verdicts, spec.standalone.margin, reference)
    return live_space(spec, [v.to_json() for v in verdicts])


# ---------------------------------------------------------------------------------------------------
# 3. tool overhead


class ReplayEngine(Engine):
    """Returns the landscape's measurement of a config instantly (so a study's time is all tool overhead)."""

    name = "replay"

    def __init__(self, land: dict[str, Any]):
        self.land = land

    def run(self, settings: LiveSettings) -> TrialResult:
        effective, warnings, fp = identity(settings)
        cfg = self.land["baseline"] if settings.is_baseline else self.land["configs"][fp]
        status = cfg.get("status", "ok")
        return TrialResult(self.name, status, settings.model_dump(), effective,
                           output_tok_s=cfg["output_tok_s"], accept_length=cfg["accept_length"],
                           failure_class=cfg.get("failure_class"), warnings=warnings)


def tool_overhead(spec: Spec, land: dict[str, Any], trials: int) -> tuple[float, int]:
    """(seconds of tool time per live trial, trials) of a real study over every wiring (no stage 1) with a
    target no config meets, so it measures ``trials`` configs."""
    ids = [v["layer_ids"] for v in land["verdicts"]]
    never = spec.model_copy(update={
        "criterion": spec.criterion.model_copy(update={"ratio": 1e9}),
        "standalone": spec.standalone.model_copy(update={"wirings": []}),
        "space": {WIRING_SETTING: Param(type="categorical", choices=ids), **spec.space},
    })
    with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
        opts = Options(f"sqlite:///{tmp}/optuna.db", f"sqlite:///{tmp}/mlflow.db", max_live_trials=trials)
        out = run_study(never, opts, lambda s: ReplayEngine(land))
    return out.tool_overhead_s_per_trial, out.counts["live_measured"]


# ---------------------------------------------------------------------------------------------------


@app.command()
def main(
    spec_path: Path = typer.Option(DEFAULT_SPEC, "--spec", help="Spec to benchmark (default: the tiny spec)."),
    landscape: Path = typer.Option(None, help="Landscape JSON: loaded when it exists, else measured and saved."),
    seeds: int = typer.Option(25, min=20, help="Replays per strategy (medians are reported)."),
    overhead_trials: int = typer.Option(20, min=1, help="Live trials of the overhead study."),
) -> None:
    """Measure the landscape once, replay grid, random, TPE without gate and the staged search on it."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    spec = load_spec(spec_path)
    if landscape is not None and landscape.exists():
        land = json.loads(landscape.read_text())
    else:
        t0 = time.perf_counter()
        land = measure_landscape(spec)
        print(f"landscape measured in {time.perf_counter() - t0:.0f} s", flush=True)
        if landscape is not None:
            landscape.write_text(json.dumps(land, indent=1, default=str))
    metric, target = spec.criterion.metric, target_of(spec, land)
    all_ids = [v["layer_ids"] for v in land["verdicts"]]
    space, staged_space = full_space(spec, all_ids), gated_space(spec, land)
    cap = len(land["configs"])
    results = {
        "grid": [replay_grid(spec, land, space, s) for s in range(seeds)],
        "random": [replay_optuna(spec, land, space, "random", s, cap) for s in range(seeds)],
        "tpe_nogate": [replay_optuna(spec, land, space, "tpe", s, cap) for s in range(seeds)],
        "staged": [replay_optuna(spec, land, staged_space, "tpe", s, cap) for s in range(seeds)],
    }
    grid_full = len(grid_orders(space, random.Random(0)))
    print(f"\ncriterion: {metric} >= {spec.criterion.ratio} x baseline {land['baseline'][metric]:.3f} = {target:.3f}")
    print(f"{'wiring':<32} {'ids':<14} {'standalone':>10} {'best ' + metric:>22}")
    for v in land["verdicts"]:
        vals = [c[metric] for c in land["configs"].values()
                if c["status"] == "ok" and c["effective"][WIRING_SETTING] == sorted(v["layer_ids"])]
        print(f"{v['label'][:32]:<32} {str(v['layer_ids']):<14} {v['accuracy']:>10.3f} {max(vals, default=0):>22.3f}")
    print(f"\n{'strategy':<12} {'median':>7} {'mean':>7} {'min':>5} {'max':>5}   (live trials to target, "
          f"{seeds} seeds; {cap} distinct configs, grid of {grid_full} requested)")
    for name, xs in results.items():
        print(f"{name:<12} {statistics.median(xs):>7.1f} {statistics.mean(xs):>7.2f} {min(xs):>5} {max(xs):>5}")
    overhead, n = tool_overhead(spec, land, min(overhead_trials, cap))
    print(f"tool overhead: {overhead:.3f} s per live trial over {n} trials (engine time excluded)")
    summary = {name: statistics.median(xs) for name, xs in results.items()}
    print(json.dumps({"live_trials_to_target": summary, "grid_full": grid_full,
                      "tool_overhead_s_per_trial": round(overhead, 4)}))


if __name__ == "__main__":
    app()
