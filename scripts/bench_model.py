"""Predicted vs measured tok/s of the local engine: every tiny-scenario wiring × num_steps 1..15.

1. Stage 1: each wiring's teacher-forced per-position accuracy on the dump (``standalone``, 15
   steps).
2. Microbenchmarks of the engine's forwards, before every pass (the fastest is kept): target
   prefill, target verify of 1..16 tokens, the draft's extend (the forward that opens a cycle), one
   chain step, and its prefill extend over a prompt.
3. Live grid: the baseline and every (wiring, num_steps), ``--repeats`` interleaved passes in a
   shuffled order; a config's measured tok/s is its fastest pass (timeit's convention: on a shared
   machine noise only slows a run; the median is reported too). Accept length is deterministic
   (greedy decoding).

   Clock (``--clock``). ``wall`` is the engine's own wall-clock tok/s. ``cpu`` (the default) divides
   it by the share of a CPU the benchmark's thread got during the trial (thread CPU time / wall time
   around ``engine.run``; torch runs on that one thread), i.e. tok/s per CPU-second, which equals
   wall tok/s on an idle machine and stays put when other processes load a shared one (where wall
   tok/s swings several-fold). Microbenchmarks use the same clock. Both errors are reported; the
   model is fitted on the chosen one.
4. Predictions, every config held out of what predicts it:

   - ``model`` (the headline): acceptance = stage 1 corrected by the live acceptance of every
     *other* config; cost = the baseline + the microbenchmarks + the first live points
     (``--calibration``: the true wiring at a few depths; a calibration config predicting itself is
     fitted without its own point);
   - ``loo``: as ``model``, the cost also fitted on every other live config;
   - ``cold``: stage 1 + baseline + microbenchmarks, no live trial at all;
   - ``sequential``: one model fed the trials in measurement order, each predicted before it is
     learnt (``ThroughputModel.error_report``).

Also printed: SGLang's ``--speculative-adaptive`` reference per wiring (predicted only: the local
engine does not run it) and the model's best config per wiring. The last line is one JSON object
with ``model_median_rel_error`` (goal ≤ 0.10).

    python scripts/bench_model.py            # about 5-8 minutes on 2 cores
    python scripts/bench_model.py --quick    # about a minute: 2 wirings, 4 depths, short
    generations python scripts/bench_model.py --save m.json; python scripts/bench_model.py --replay
    m.json  # re-evaluate
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import typer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import TRUE, WIRINGS  # noqa: E402

from bisect_eagle.engines.local import LocalEngine  # noqa: E402
from bisect_eagle.perf import ThroughputModel, metrics_from_result  # noqa: E402
from bisect_eagle.spec.load import load_spec  # noqa: E402
from bisect_eagle.spec.settings import LiveSettings  # noqa: E402

DEFAULT_SPEC = Path(__file__).resolve().parent.parent / "experiments" / "tiny.yaml"


def stage1(
    spec_path: Path, wirings: dict[str, list[int]], steps: int, samples: int
) -> dict[str, list[float]]:
    """Teacher-forced full-vocabulary accuracy per position, per wiring (stage 1's scorer)."""
    from bisect_eagle.trials.standalone import Scorer

    spec = load_spec(spec_path)
    spec.standalone.steps = steps
    spec.standalone.samples = samples
    scorer = Scorer(spec)
    by_ids = {tuple(sorted(c.layer_ids)): c for c in scorer.candidates()}
    out = {}
    for name, ids in wirings.items():
        cand = by_ids.get(tuple(sorted(ids)))
        if cand is None:
            raise SystemExit(f"{spec_path}: no standalone wiring with layer ids {ids} ({name})")
        out[name] = [p["full_vocab"] for p in scorer.score(cand).per_position]
    return out


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def _timed(fn, reps: int) -> dict[str, float]:
    """Median seconds of ``fn()`` on each clock over ``reps`` calls after two warm-up calls."""
    for _ in range(2):
        fn()
    times: dict[str, list[float]] = {c: [] for c in CLOCKS}
    for _ in range(reps):
        t0 = {c: f() for c, f in CLOCKS.items()}
        fn()
        for c, f in CLOCKS.items():
            times[c].append(f() - t0[c])
    return {c: statistics.median(v) for c, v in times.items()}


def _minus(a: dict[str, float], b: dict[str, float], div: float = 1.0) -> dict[str, float]:
    return {c: max((a[c] - b[c]) / div, 1e-6) for c in a}


@torch.inference_mode()
def microbenchmarks(paths: dict[str, Path], ids: list[int]):
    """A function of ``reps`` timing the engine's own forwards (a separate copy of the models,
    loaded once) on the first prompt: ``[(component, seconds per clock, tokens), ...]``."""
    import inspect

    from transformers import DynamicCache

    from bisect_eagle.artifacts.draft import load_draft
    from bisect_eagle.artifacts.prompts import load_prompts
    from bisect_eagle.artifacts.target import capture_hidden, load_target
    from bisect_eagle.engines.local.decoder import DraftChain, SpeculativeDecoder

    model, tokenizer = load_target(paths["target"])
    prompt_ids = list(load_prompts(paths["prompts"], tokenizer)[0].input_ids)
    draft = load_draft(paths["draft"], target=paths["target"])
    draft.model.to(torch.float32)
    dec = SpeculativeDecoder(model, draft, ids, 1)
    prompt = torch.tensor([prompt_ids[:-1]])
    aux = dec.aux_hidden_states(prompt_ids[:-1])[None]  # [1, T-1, k·H]: row t pairs with token t+1
    cache_kw = (
        "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    )
    chain = DraftChain(draft.model, len(prompt_ids) + 64, torch.device("cpu"), False)
    tokens = prompt_ids[1:]

    def forward(ids_: torch.Tensor, cache) -> None:
        model(input_ids=ids_, use_cache=True, **{cache_kw: cache}).logits[0].argmax(-1).tolist()

    def propose(rows: int, steps: int) -> None:
        chain.rows = 0 if rows == len(tokens) else len(tokens) - rows
        chain.propose(aux[:, -rows:], tokens[-rows:], steps=steps)

    @torch.inference_mode()
    def run(reps: int) -> list[tuple[str, dict[str, float], int]]:
        out = []
        with capture_hidden(model, dec.indices):
            out.append(
                (
                    "prefill",
                    _timed(lambda: forward(prompt, DynamicCache(config=model.config)), reps),
                    1,
                )
            )
            cache = DynamicCache(config=model.config)
            forward(torch.tensor([prompt_ids]), cache)
            for t in (1, 2, 4, 8, 16):
                ids_t = torch.tensor([prompt_ids[-t:]])

                def verify(ids_t=ids_t, t=t) -> None:
                    forward(ids_t, cache)
                    cache.crop(-t)

                out.append(("verify", _timed(verify, reps), t))
        chain.propose(aux, tokens, steps=1)
        extend = _timed(lambda: propose(4, 1), reps)
        out.append(("draft_extend", extend, 1))
        out.append(("draft_step", _minus(_timed(lambda: propose(4, 9), reps), extend, 8), 1))
        out.append(
            ("draft_prefill", _minus(_timed(lambda: propose(len(tokens), 1), reps), extend), 1)
        )
        return out

    return run


def measure(
    engine: LocalEngine,
    configs: list[tuple[str, int]],
    common: dict,
    repeats: int,
    seed: int,
    micro,
    micro_reps: int,
):
    """Interleaved, shuffled passes, each opened by the microbenchmarks: ``{key: [(effective,
    metrics, cpu share), ...]}``, pass 1's order, the median share, and the fastest microbenchmark
    of each component."""
    rng = random.Random(seed)
    results: dict[tuple[str, int], list] = {key: [] for key in configs}
    shares, order, timings = [], [], []
    for r in range(repeats):
        timings.append(micro(micro_reps))
        keys = list(configs)
        rng.shuffle(keys)
        t0 = time.perf_counter()
        for key in keys:
            name, steps = key
            s = (
                LiveSettings(speculative_algorithm="none", **common)
                if name == "baseline"
                else LiveSettings(
                    eagle_aux_hidden_state_layer_ids=WIRINGS[name], num_steps=steps, **common
                )
            )
            plan = engine.plan(s)
            w0, c0 = time.perf_counter(), time.thread_time()
            res = engine.run(plan)
            share = min(1.0, (time.thread_time() - c0) / (time.perf_counter() - w0))
            if not res.ok:
                raise SystemExit(f"{key}: trial failed ({res.failure_class}): {res.failure_detail}")
            results[key].append((res.effective, metrics_from_result(res), share))
            shares.append(share)
            if r == 0:
                order.append(key)
        print(
            f"pass {r + 1}/{repeats}: {len(keys)} trials in {time.perf_counter() - t0:.0f} s, "
            f"median CPU share {statistics.median(shares[-len(keys) :]):.2f}",
            flush=True,
        )
    fastest = [
        (c, {k: min(t[i][1][k] for t in timings) for k in CLOCKS}, n)
        for i, (c, _, n) in enumerate(timings[0])
    ]
    return results, order, statistics.median(shares), fastest


def new_model(prior: dict[str, list[float]], micro: list[tuple], clock: str) -> ThroughputModel:
    model = ThroughputModel(benchmark=LocalEngine.benchmark)
    for name, acc in prior.items():
        model.set_standalone(WIRINGS[name], acc)
    for component, seconds, tokens in micro:
        model.add_timing(component, seconds[clock], tokens=tokens)
    return model


def held_out(
    prior, micro, clock, data, target, *, cost_keys, base_key=("baseline", 0)
) -> ThroughputModel:
    """A model that learnt acceptance from every config but ``target`` and cost from ``cost_keys``
    but it."""
    model = new_model(prior, micro, clock)
    model.update(*data[base_key], record=False)
    for key, (eff, m) in data.items():
        if key in (target, base_key):
            continue
        model.update(eff, m, record=False, learn_cost=key in cost_keys)
    return model


def _key(text: str) -> tuple[str, int]:
    name, steps = text.rsplit("|", 1)
    return name, int(steps)


def rel(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas


def evaluate(results, order, prior, micro, clock: str, cal: set) -> dict:
    """Every prediction variant (module docstring) against the fastest pass on ``clock``."""
    data, measured = {}, {}
    for key, res in results.items():
        tps = [m["output_tok_s"] / (share if clock == "cpu" else 1.0) for _, m, share in res]
        eff, m, _ = res[0]
        data[key] = (eff, {**m, "output_tok_s": max(tps)})
        measured[key] = (max(tps), statistics.median(tps), m["accept_length"])
    everything = set(data)
    rows, errs = (
        [],
        {"model": [], "loo": [], "cold": [], "model_vs_median": [], "accept_length": []},
    )
    for key in data:
        if key == ("baseline", 0):
            continue
        eff = data[key][0]
        pred = held_out(prior, micro, clock, data, key, cost_keys=cal).predict(eff)
        loo = held_out(prior, micro, clock, data, key, cost_keys=everything).predict(eff)
        cold = held_out(
            prior, micro, clock, {("baseline", 0): data[("baseline", 0)]}, key, cost_keys=set()
        ).predict(eff)
        fastest, med, al = measured[key]
        errs["model"].append(rel(pred.tok_s, fastest))
        errs["loo"].append(rel(loo.tok_s, fastest))
        errs["cold"].append(rel(cold.tok_s, fastest))
        errs["model_vs_median"].append(rel(pred.tok_s, med))
        errs["accept_length"].append(rel(pred.accept_length, al))
        rows.append((key, fastest, med, al, pred, loo, cold))
    seq = new_model(prior, micro, clock)
    for key in order:
        seq.update(*data[key], record=key != ("baseline", 0))
    return {
        "data": data,
        "measured": measured,
        "rows": rows,
        "errs": errs,
        "median": {k: round(statistics.median(v), 4) for k, v in errs.items()},
        "sequential": seq.error_report(),
        "full": held_out(prior, micro, clock, data, None, cost_keys=everything),
        "coverage": statistics.fmean(r[4].low <= r[1] <= r[4].high for r in rows),
    }


def main(
    spec: Path = typer.Option(
        DEFAULT_SPEC, help="Spec whose scenario, engine settings and wirings to use."
    ),
    repeats: int = typer.Option(
        2, help="Interleaved passes over the grid; the fastest pass is the measurement."
    ),
    clock: str = typer.Option(
        "cpu", help="cpu (tok/s per CPU-second of the engine thread) or wall (module doc)."
    ),
    max_steps: int = typer.Option(15, help="num_steps 1..max_steps for every wiring."),
    num_prompts: int = typer.Option(
        None, help="Measured requests per trial (default: the spec's)."
    ),
    warmup_prompts: int = typer.Option(
        None, help="Warm-up requests per trial (default: the spec's)."
    ),
    max_new_tokens: int = typer.Option(None, help="Tokens per request (default: the spec's)."),
    calibration: str = typer.Option(
        "2,6,12", help="num_steps of the true wiring whose cost the model may use."
    ),
    samples: int = typer.Option(32, help="Dump samples for stage 1."),
    micro_reps: int = typer.Option(15, help="Repetitions per microbenchmark."),
    threads: int = typer.Option(1, help="torch intra-op threads."),
    seed: int = typer.Option(0, help="Shuffle seed."),
    quick: bool = typer.Option(
        False, "--quick", help="Smoke run: 2 wirings, 4 depths, 1 pass, short requests."
    ),
    save: Path = typer.Option(
        None, help="Write stage 1, the microbenchmarks and every trial's metrics here."
    ),
    replay: Path = typer.Option(None, help="Evaluate a --save file again instead of measuring."),
) -> None:
    torch.set_num_threads(threads)
    if clock not in CLOCKS:
        raise typer.BadParameter(f"--clock: expected one of {sorted(CLOCKS)}, found {clock!r}")
    start = time.perf_counter()
    sp = load_spec(spec)
    settings = sp.engine.settings or {}
    common = {
        "num_prompts": num_prompts or settings.get("num_prompts", 4),
        "warmup_prompts": warmup_prompts
        if warmup_prompts is not None
        else settings.get("warmup_prompts", 1),
        "max_new_tokens": max_new_tokens or settings.get("max_new_tokens", 48),
        "device": "cpu",
    }
    wirings, depths = dict(WIRINGS), list(range(1, max_steps + 1))
    cal_steps = [int(x) for x in calibration.split(",") if x.strip()]
    if quick:
        wirings = {k: WIRINGS[k] for k in list(WIRINGS)[:2]}
        depths, cal_steps, repeats, samples, micro_reps = [1, 3, 7, 15], [3], 1, 8, 5
        common.update(num_prompts=2, max_new_tokens=min(common["max_new_tokens"], 32))
    paths = sp.paths()
    if replay is not None:
        saved = json.loads(replay.read_text())
        prior, micro, cpu_share, common = (
            saved["prior"],
            saved["micro"],
            saved["cpu_share"],
            saved["settings"],
        )
        results = {_key(k): v for k, v in saved["results"].items()}
        order = [_key(k) for k in saved["order"]]
        wirings = {n: WIRINGS[n] for n in dict.fromkeys(n for n, s in results if n != "baseline")}
        depths = sorted({s for n, s in results if n != "baseline"})
        repeats = len(next(iter(results.values())))
    else:
        prior = stage1(spec, wirings, max(depths), samples)
        print(
            f"stage 1 ({time.perf_counter() - start:.0f} s): "
            + ", ".join(
                f"{n.split()[0]} {[round(a, 2) for a in acc[:4]]}" for n, acc in prior.items()
            ),
            flush=True,
        )
        configs = [("baseline", 0)] + [(n, s) for n in wirings for s in depths]
        with LocalEngine(paths["target"], paths["draft"], paths["prompts"]) as engine:
            # load + warm
            engine.run(engine.plan(LiveSettings(speculative_algorithm="none", **common)))
            results, order, cpu_share, micro = measure(
                engine,
                configs,
                common,
                repeats,
                seed,
                microbenchmarks(paths, WIRINGS[TRUE]),
                micro_reps,
            )
            print(
                f"microbenchmarks ({clock} ms, fastest of {repeats}): "
                + ", ".join(
                    f"{c}{'@' + str(t) if c == 'verify' else ''} {s[clock] * 1e3:.2f}"
                    for c, s, t in micro
                ),
                flush=True,
            )
        if save is not None:
            save.write_text(
                json.dumps(
                    {
                        "prior": prior,
                        "micro": micro,
                        "cpu_share": cpu_share,
                        "settings": common,
                        "order": [f"{n}|{s}" for n, s in order],
                        "results": {f"{n}|{s}": v for (n, s), v in results.items()},
                    }
                )
            )
    cal = {(TRUE, s) for s in cal_steps if s in depths}
    ev = evaluate(results, order, prior, micro, clock, cal)
    other = "wall" if clock == "cpu" else "cpu"
    ev_other = evaluate(results, order, prior, micro, other, cal)

    print(f"\n{clock} clock; tok/s = fastest of {repeats} passes")
    print(
        f"{'wiring':26s} {'steps':>5s} {'tok/s':>7s} {'median':>7s} {'AL':>5s} {'pred AL':>7s} "
        f"{'pred':>7s} {'interval':>15s} {'err':>6s} {'loo err':>7s} {'cold err':>8s}"
    )
    base_fast, base_med, _ = ev["measured"][("baseline", 0)]
    print(f"{'baseline':26s} {'-':>5s} {base_fast:7.1f} {base_med:7.1f} {1.0:5.2f}")
    for (name, steps), fastest, med, al, pred, loo, cold in ev["rows"]:
        print(
            f"{name:26s} {steps:5d} {fastest:7.1f} {med:7.1f} {al:5.2f} {pred.accept_length:7.2f} "
            f"{pred.tok_s:7.1f} {pred.low:7.1f}-{pred.high:<7.1f} {rel(pred.tok_s, fastest):6.3f} "
            f"{rel(loo.tok_s, fastest):7.3f} {rel(cold.tok_s, fastest):8.3f}"
        )
    full, data, measured = ev["full"], ev["data"], ev["measured"]
    best_cfg, adaptive = {}, {}
    print()
    for name in wirings:
        preds = {s: full.predict(data[(name, s)][0]) for s in depths}
        s_best = max(preds, key=lambda s: preds[s].tok_s)
        s_meas = max(depths, key=lambda s: measured[(name, s)][0])
        ad = full.predict_adaptive({**data[(name, depths[0])][0], "num_steps": 3})
        best_cfg[name] = {
            "num_steps": s_best,
            "predicted_tok_s": round(preds[s_best].tok_s, 1),
            "measured_tok_s": round(measured[(name, s_best)][0], 1),
            "measured_best_num_steps": s_meas,
            "measured_best_tok_s": round(measured[(name, s_meas)][0], 1),
        }
        adaptive[name] = {
            "predicted_tok_s": round(ad.tok_s, 1),
            "occupancy": ad.details["occupancy"],
        }
        print(
            f"{name:26s} best predicted num_steps {s_best} ({preds[s_best].tok_s:.1f} tok/s, "
            f"measured {measured[(name, s_best)][0]:.1f}); measured best {s_meas} "
            f"({measured[(name, s_meas)][0]:.1f}); SGLang adaptive (predicted) {ad.tok_s:.1f} "
            f"tok/s, steps {ad.details['occupancy']}"
        )
    med, seq = ev["median"], ev["sequential"]
    print(
        f"\nmedian relative error ({clock}): model {med['model']:.3f}, loo {med['loo']:.3f}, cold "
        f"{med['cold']:.3f}, sequential {seq.median_rel_error:.3f}; accept length "
        f"{med['accept_length']:.3f}; interval coverage {ev['coverage']:.2f}; {other} clock: model "
        f"{ev_other['median']['model']:.3f}; median CPU share {cpu_share:.2f}; "
        f"{time.perf_counter() - start:.0f} s"
    )
    print(
        json.dumps(
            {
                "model_median_rel_error": med["model"],
                "clock": clock,
                "model_p90_rel_error": round(float(np.quantile(ev["errs"]["model"], 0.9)), 4),
                f"model_median_rel_error_{other}": ev_other["median"]["model"],
                "model_median_rel_error_vs_median_tok_s": med["model_vs_median"],
                "loo_median_rel_error": med["loo"],
                "cold_median_rel_error": med["cold"],
                "sequential_median_rel_error": round(seq.median_rel_error, 4),
                "accept_length_median_rel_error": med["accept_length"],
                "interval_coverage": round(ev["coverage"], 3),
                "median_cpu_share": round(cpu_share, 3),
                "configs": len(ev["rows"]),
                "repeats": repeats,
                "threads": threads,
                "settings": common,
                "calibration_num_steps": sorted(s for _, s in cal),
                "cost_fit": full.cost.summary(),
                "best_predicted": best_cfg,
                "adaptive_reference": adaptive,
                "wall_s": round(time.perf_counter() - start, 1),
            },
            default=float,
        )
    )


if __name__ == "__main__":
    typer.run(main)
