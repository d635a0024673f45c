"""Benchmark the local EAGLE-3 engine against the target alone: the true wiring and the incident's wrong ones.

Every setting runs at each requested draft depth: by default SGLang's auto choice for a chain draft (3 steps,
4 draft tokens) and the incident's deployment (16 draft tokens: topk = 1 forces 15 steps), where the wrong
wiring ran 56.8 tok/s against a 90 tok/s baseline. A wrong wiring loses acceptance at every depth; whether
that costs more than speculation gains depends on how many drafts each verify step pays for.

Each repeat runs the baseline and every (depth, wiring) once, interleaved, so slow phases of a shared machine
hit all settings alike; speedups are per-repeat ratios to that repeat's baseline. Reported per setting: median
(and median absolute deviation) of tok/s and speedup, accept length, and the share of wall time spent outside
model forwards. The last line is one JSON object: ``speedup_true`` and ``overhead_share`` (true wiring, first
depth), and per depth the true wiring's speedup, the wrong wirings' best speedup and their accept-length drop.

    python scripts/bench_engine.py --repeats 5 --threads 1
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch
import typer

from bisect_eagle.cli.common import resolve_paths
from bisect_eagle.engines.local import LocalEngine
from bisect_eagle.spec.settings import LiveSettings

TRUE = "true [1,5,9]"
SEEDS_WRONG = {"[1:] -> [5,9,11]": [5, 9, 11], "embedding first [-1,1,5]": [-1, 1, 5]}
WIRINGS = {TRUE: [1, 5, 9], **SEEDS_WRONG, "shift -1 [0,4,8]": [0, 4, 8], "shift +1 [2,6,10]": [2, 6, 10]}


def median_mad(xs: list[float]) -> tuple[float, float]:
    """Median and median absolute deviation."""
    m = statistics.median(xs)
    return m, statistics.median(abs(x - m) for x in xs)


def main(
    scenario: str = typer.Option("tiny", help="Shipped scenario (its target, draft and prompts)."),
    target: Path = typer.Option(None, help="Target directory (overrides the scenario's)."),
    draft: Path = typer.Option(None, help="Draft directory (overrides the scenario's)."),
    prompts: Path = typer.Option(None, help="Prompts JSONL (overrides the scenario's)."),
    repeats: int = typer.Option(5, help="Trials per setting; medians are reported."),
    num_prompts: int = typer.Option(8, help="Measured requests per trial."),
    warmup_prompts: int = typer.Option(2, help="Warm-up requests per trial (not measured)."),
    max_new_tokens: int = typer.Option(64, help="Tokens generated per request."),
    num_steps: list[int] = typer.Option(
        [3, 15], help="Draft steps per verify, repeatable (topk = 1, so num_draft_tokens = steps + 1)."),
    threads: int = typer.Option(1, help="torch intra-op threads."),
    device: str = typer.Option("cpu", help="Device for the models."),
) -> None:
    torch.set_num_threads(threads)
    p = resolve_paths(scenario, target=target, draft=draft, prompts=prompts)
    common = {"num_prompts": num_prompts, "warmup_prompts": warmup_prompts, "max_new_tokens": max_new_tokens,
              "device": device}
    settings = {("baseline", 0): LiveSettings(speculative_algorithm="none", **common)}
    settings |= {(name, steps): LiveSettings(eagle_aux_hidden_state_layer_ids=ids, num_steps=steps, **common)
                 for steps in num_steps for name, ids in WIRINGS.items()}
    runs: dict[tuple[str, int], list] = {key: [] for key in settings}
    with LocalEngine(p["target"], p["draft"], p["prompts"], device=device) as engine:
        for r in range(repeats):
            for key, s in settings.items():
                result = engine.run(s)
                if not result.ok:
                    raise SystemExit(f"{key}: trial failed ({result.failure_class}): {result.failure_detail}")
                runs[key].append(result)
            print(f"repeat {r + 1}/{repeats}: " + ", ".join(
                f"{name.split()[0]}@{steps} {res[-1].output_tok_s:.0f}" for (name, steps), res in runs.items()),
                flush=True)
    base_tps = [res.output_tok_s for res in runs[("baseline", 0)]]
    summary: dict[tuple[str, int], dict] = {}
    print(f"\n{'setting':28s} {'steps':>5s} {'tok/s':>14s} {'base tok/s':>10s} {'speedup':>14s} "
          f"{'accept len':>10s} {'overhead':>8s}")
    for (name, steps), results in runs.items():
        tps, tps_mad = median_mad([res.output_tok_s for res in results])
        speedup, speedup_mad = median_mad([res.output_tok_s / b for res, b in zip(results, base_tps, strict=True)])
        accept = statistics.median(res.accept_length for res in results)
        overhead = statistics.median(1 - res.model_s / res.wall_s for res in results)
        rates = [round(r, 3) for r in results[-1].accept_rate_per_position]
        summary[(name, steps)] = {"tok_s": tps, "tok_s_mad": tps_mad, "speedup": speedup,
                                  "speedup_mad": speedup_mad, "accept_length": accept, "overhead_share": overhead,
                                  "accept_rate_per_position": rates}
        print(f"{name:28s} {steps or '-':>5} {tps:8.1f} ±{tps_mad:5.1f} {statistics.median(base_tps):10.1f} "
              f"{speedup:7.2f} ±{speedup_mad:5.2f} {accept:10.2f} {overhead:8.2f}")
    by_depth = {}
    for steps in num_steps:
        true = summary[(TRUE, steps)]
        wrong = [summary[(name, steps)] for name in SEEDS_WRONG]
        by_depth[str(steps)] = {
            "speedup_true": round(true["speedup"], 3),
            "speedup_wrong_max": round(max(w["speedup"] for w in wrong), 3),
            "accept_drop_wrong_min": round(min(1 - w["accept_length"] / true["accept_length"] for w in wrong), 3),
        }
    first = summary[(TRUE, num_steps[0])]
    print(json.dumps({"speedup_true": round(first["speedup"], 3), "speedup_true_mad": round(first["speedup_mad"], 3),
                      "overhead_share": round(first["overhead_share"], 3), "by_num_steps": by_depth,
                      "repeats": repeats, "threads": threads,
                      "settings": {f"{name}@{steps}": {m: v if isinstance(v, list) else round(v, 3)
                                                        for m, v in d.items()}
                                   for (name, steps), d in summary.items()}}))


if __name__ == "__main__":
    typer.run(main)
