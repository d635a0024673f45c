"""Benchmark EAGLE-3 engines against the target alone: the true wiring and the incident's wrong
ones, on the local engine (in-process PyTorch) and on real vLLM servers (the ``vllm`` engine, one
server per trial), side by side.

Every setting runs at each requested draft depth: by default SGLang's auto choice for a chain draft
(3 steps, 4 draft tokens) and the incident's deployment (16 draft tokens: topk = 1 forces 15 steps),
where the wrong wiring ran 56.8 tok/s against a 90 tok/s baseline. A wrong wiring loses acceptance
at every depth; whether that costs more than speculation gains depends on how many drafts each
verify step pays for.

Each repeat runs, per engine, the baseline and every (depth, wiring) once, interleaved, so slow
phases of a shared machine hit all settings alike; speedups are per-repeat ratios to that repeat's
baseline on the same engine. Reported per engine and setting: median (and median absolute deviation)
of tok/s and speedup, accept length, and the share of wall time spent outside model forwards (the
local engine only: a server does not say). The last line is one JSON object: ``rows`` (the table,
one object per engine and setting), ``speedup_true`` and ``overhead_share`` (true wiring, first
depth, first engine), per depth the true wiring's speedup, the wrong wirings' best speedup and their
accept-length drop, and the same per engine under ``engines``.

The vllm engine takes its server settings (``engine.vllm``) and fixed trial settings (float32, eager
mode, one sequence, the CPU variables) from ``--vllm-spec`` (default
``experiments/tiny-vllm.yaml``); wiring ids are SGLang's, converted by the engine into vLLM's
numbering. Each vLLM trial starts and tears down its own server (about 20 s warm on 2 cores), so
``--quick`` (one repeat, 3 steps, the true wiring and the two seeded wrong ones, 4 prompts of 32
tokens) keeps ``--engine local,vllm`` to a few minutes.

    python scripts/bench_engine.py --repeats 5 --threads 1
    python scripts/bench_engine.py --engine local,vllm --quick --vllm-python .vllm-venv/bin/python
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import typer

from bisect_eagle.cli.common import resolve_paths
from bisect_eagle.engines.base import Engine, TrialResult
from bisect_eagle.engines.local import LocalEngine
from bisect_eagle.spec.settings import LiveSettings

TRUE = "true [1,5,9]"
SEEDS_WRONG = {"[1:] -> [5,9,11]": [5, 9, 11], "embedding first [-1,1,5]": [-1, 1, 5]}
WIRINGS = {
    TRUE: [1, 5, 9],
    **SEEDS_WRONG,
    "shift -1 [0,4,8]": [0, 4, 8],
    "shift +1 [2,6,10]": [2, 6, 10],
}
ENGINES = ("local", "vllm")
ROOT = Path(__file__).resolve().parents[1]
SPECULATIVE = (
    "speculative_algorithm",
    "eagle_aux_hidden_state_layer_ids",
    "num_steps",
    "topk",
    "num_draft_tokens",
)
QUICK = {
    "repeats": 1,
    "num_prompts": 4,
    "warmup_prompts": 1,
    "max_new_tokens": 32,
    "num_steps": [3],
}


def median_mad(xs: list[float]) -> tuple[float, float]:
    """Median and median absolute deviation."""
    m = statistics.median(xs)
    return m, statistics.median(abs(x - m) for x in xs)


def vllm_engine(
    spec_path: Path, *, python: str | None, paths: dict[str, Path], log_dir: Path
) -> tuple[Engine, dict]:
    """The vllm engine of ``spec_path`` on ``paths`` (target, draft, prompts), and the spec's fixed
    settings."""
    from bisect_eagle.engines.vllm import VllmEngine
    from bisect_eagle.spec.load import load_spec

    spec = load_spec(spec_path)
    server = (
        spec.engine.vllm if not python else spec.engine.vllm.model_copy(update={"python": python})
    )
    engine = VllmEngine(
        server,
        target=paths["target"],
        draft=paths["draft"],
        prompts=paths["prompts"],
        log_dir=log_dir,
    )
    fixed = spec.fixed_settings().model_dump(exclude_unset=True)
    for key in SPECULATIVE:  # each setting of the benchmark sets its own
        fixed.pop(key, None)
    return engine, fixed


def run_one(engine: Engine, settings: LiveSettings, key: tuple[str, str, int]) -> TrialResult:
    plan = engine.plan(settings)
    if plan.refusal is not None:
        raise SystemExit(f"{key}: the {engine.name} engine refuses it: {plan.refusal}")
    result = engine.run(plan)
    if not result.ok:
        raise SystemExit(f"{key}: trial failed ({result.failure_class}): {result.failure_detail}")
    return result


def summarize(runs: dict[tuple[str, int], list[TrialResult]], num_steps: list[int]) -> dict:
    """One engine's medians per setting, its per-depth view and its headline numbers (rounded for
    the JSON)."""
    base_tps = [res.output_tok_s for res in runs[("baseline", 0)]]
    settings: dict[tuple[str, int], dict] = {}
    for (name, steps), results in runs.items():
        tps, tps_mad = median_mad([res.output_tok_s for res in results])
        speedup, speedup_mad = median_mad(
            [res.output_tok_s / b for res, b in zip(results, base_tps, strict=True)]
        )
        accept = statistics.median(res.accept_length for res in results)
        # the local engine times its model forwards; a server does not (model_s stays 0)
        overhead = (
            statistics.median(1 - res.model_s / res.wall_s for res in results)
            if all(res.model_s > 0 for res in results)
            else None
        )
        rates = [round(r, 3) for r in results[-1].accept_rate_per_position]
        settings[(name, steps)] = {
            "tok_s": tps,
            "tok_s_mad": tps_mad,
            "base_tok_s": statistics.median(base_tps),
            "speedup": speedup,
            "speedup_mad": speedup_mad,
            "accept_length": accept,
            "overhead_share": overhead,
            "accept_rate_per_position": rates,
        }
    by_depth = {}
    for steps in num_steps:
        true = settings[(TRUE, steps)]
        wrong = [settings[(name, steps)] for name in SEEDS_WRONG if (name, steps) in settings]
        by_depth[str(steps)] = {
            "speedup_true": round(true["speedup"], 3),
            "accept_length_true": round(true["accept_length"], 3),
            "speedup_wrong_max": round(max(w["speedup"] for w in wrong), 3) if wrong else None,
            "accept_drop_wrong_min": (
                round(min(1 - w["accept_length"] / true["accept_length"] for w in wrong), 3)
                if wrong
                else None
            ),
        }
    first = settings[(TRUE, num_steps[0])]
    return {
        "speedup_true": round(first["speedup"], 3),
        "speedup_true_mad": round(first["speedup_mad"], 3),
        "overhead_share": None
        if first["overhead_share"] is None
        else round(first["overhead_share"], 3),
        "by_num_steps": by_depth,
        "rows": settings,
        "settings": {
            f"{name}@{steps}": {
                m: v if isinstance(v, list) or v is None else round(v, 3)
                for m, v in d.items()
                if m != "base_tok_s"
            }
            for (name, steps), d in settings.items()
        },
    }


def main(
    engine: str = typer.Option(
        "local", help="Engines to compare, comma-separated: local, vllm (e.g. local,vllm)."
    ),
    quick: bool = typer.Option(
        False,
        "--quick",
        help="A few minutes: one repeat, 3 steps, the true wiring and the two seeded wrong ones, 4 "
        "prompts of 32 tokens (overrides those options).",
    ),
    scenario: str = typer.Option("tiny", help="Shipped scenario (its target, draft and prompts)."),
    target: Path = typer.Option(None, help="Target directory (overrides the scenario's)."),
    draft: Path = typer.Option(None, help="Draft directory (overrides the scenario's)."),
    prompts: Path = typer.Option(None, help="Prompts JSONL (overrides the scenario's)."),
    repeats: int = typer.Option(5, help="Trials per setting; medians are reported."),
    num_prompts: int = typer.Option(8, help="Measured requests per trial."),
    warmup_prompts: int = typer.Option(2, help="Warm-up requests per trial (not measured)."),
    max_new_tokens: int = typer.Option(64, help="Tokens generated per request."),
    num_steps: list[int] = typer.Option(
        [3, 15],
        help="Draft steps per verify, repeatable (topk = 1, so num_draft_tokens = steps + 1).",
    ),
    threads: int = typer.Option(1, help="torch intra-op threads (local engine)."),
    device: str = typer.Option("cpu", help="Device for the local engine's models."),
    vllm_spec: Path = typer.Option(
        ROOT / "experiments" / "tiny-vllm.yaml",
        help="Spec whose engine.vllm and fixed settings the vllm engine runs with.",
    ),
    vllm_python: str = typer.Option(
        None,
        "--vllm-python",
        help="Interpreter that has vLLM; overrides the spec's engine.vllm.python.",
    ),
    log_dir: Path = typer.Option(
        None,
        help="Where the vLLM servers' per-trial logs go (default: a temporary directory, removed "
        "at the end).",
    ),
) -> None:
    names = [n.strip() for n in engine.split(",") if n.strip()]
    if not names or any(n not in ENGINES for n in names) or len(set(names)) != len(names):
        raise typer.BadParameter(
            f"expected engines from {', '.join(ENGINES)}, comma-separated; got {engine!r}",
            param_hint="--engine",
        )
    if quick:
        repeats, num_prompts, warmup_prompts = (
            QUICK["repeats"],
            QUICK["num_prompts"],
            QUICK["warmup_prompts"],
        )
        max_new_tokens, num_steps = QUICK["max_new_tokens"], list(QUICK["num_steps"])
    wirings = {TRUE: WIRINGS[TRUE], **SEEDS_WRONG} if quick else WIRINGS
    torch.set_num_threads(threads)
    p = resolve_paths(scenario, target=target, draft=draft, prompts=prompts)
    common = {
        "num_prompts": num_prompts,
        "warmup_prompts": warmup_prompts,
        "max_new_tokens": max_new_tokens,
    }
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        engines: dict[str, Engine] = {}
        fixed: dict[str, dict] = {}
        for name in names:
            if name == "local":
                engines[name] = stack.enter_context(
                    LocalEngine(p["target"], p["draft"], p["prompts"])
                )
                fixed[name] = {"device": device}
            else:
                logs = log_dir or Path(
                    stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-vllm-"))
                )
                eng, fixed[name] = vllm_engine(vllm_spec, python=vllm_python, paths=p, log_dir=logs)
                engines[name] = stack.enter_context(eng)

        def trial(name: str, **kw) -> LiveSettings:
            return LiveSettings(**{**fixed[name], **common, **kw})

        settings = {
            (name, "baseline", 0): trial(name, speculative_algorithm="none") for name in names
        }
        settings |= {
            (name, wiring, steps): trial(
                name, eagle_aux_hidden_state_layer_ids=ids, num_steps=steps
            )
            for name in names
            for steps in num_steps
            for wiring, ids in wirings.items()
        }
        runs: dict[str, dict[tuple[str, int], list[TrialResult]]] = {n: {} for n in names}
        for r in range(repeats):
            for key, s in settings.items():
                name, wiring, steps = key
                runs[name].setdefault((wiring, steps), []).append(run_one(engines[name], s, key))
            print(
                f"repeat {r + 1}/{repeats}: "
                + ", ".join(
                    f"{name}:{wiring.split()[0]}@{steps} {res[-1].output_tok_s:.0f}"
                    for name in names
                    for (wiring, steps), res in runs[name].items()
                ),
                flush=True,
            )
    summaries = {name: summarize(runs[name], num_steps) for name in names}
    print(
        f"\n{'engine':6s} {'setting':28s} {'steps':>5s} {'tok/s':>14s} {'base tok/s':>10s} "
        f"{'speedup':>14s} {'accept len':>10s} {'overhead':>8s}"
    )
    rows = []
    for key in runs[names[0]]:  # the engines' rows of one setting next to each other
        for name in names:
            d = summaries[name]["rows"][key]
            wiring, steps = key
            rows.append(
                {
                    "engine": name,
                    "setting": wiring,
                    "num_steps": steps,
                    **{
                        m: v if isinstance(v, list) or v is None else round(v, 3)
                        for m, v in d.items()
                    },
                }
            )
            overhead = "-" if d["overhead_share"] is None else f"{d['overhead_share']:.2f}"
            print(
                f"{name:6s} {wiring:28s} {steps or '-':>5} {d['tok_s']:8.1f} "
                f"±{d['tok_s_mad']:5.1f} {d['base_tok_s']:10.1f} {d['speedup']:7.2f} "
                f"±{d['speedup_mad']:5.2f} {d['accept_length']:10.2f} {overhead:>8s}"
            )
    first = summaries[names[0]]
    out = {k: v for k, v in first.items() if k != "rows"}
    wall_s = round(time.perf_counter() - started, 1)
    out.update(
        rows=rows,
        engine=names[0],
        repeats=repeats,
        threads=threads,
        quick=quick,
        wall_s=wall_s,
        engines={
            name: {k: v for k, v in s.items() if k != "rows"} for name, s in summaries.items()
        },
    )
    print(json.dumps(out))


if __name__ == "__main__":
    typer.run(main)
