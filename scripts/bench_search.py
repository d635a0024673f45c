"""Benchmark the search and the bisect on a family of deployments the model was not built from.

The worlds are ``scripts/landscape.py``'s: each member's structure (what a verified token costs,
acceptance and its decay, tree gains, NCCL and server effects with an interaction, a biased and
noisy stage-1 proxy, drift) is drawn at random from its seed. ``--family`` runs every member of
:data:`landscape.REPORTED_SEEDS` (the figures the README reports); ``--heldout`` runs
:data:`landscape.HELDOUT_SEEDS` instead, members never looked at while the search was tuned. Without
either, member 0 alone (a quick look).

For each member and each seed (``--seeds``), with every live measurement multiplied by ``exp(N(0,
noise²))`` (the member's own noise scale and drift on top):

* ``default``: the tool itself, :func:`~bisect_eagle.search.study.run_study` with the world's
  engine, stage 1 simulated from the world's proxy (every wiring scored on a dump of 64 samples,
  then the tool's own gate), TPE, the throughput model and confirmation, all at their defaults.
* ``model_off``: the same study with ``search.model.enabled: false`` (the sampler alone).

A study's cost is its server launches until its winner is confirmed (baseline, live trials,
confirmation re-measurements); a study that confirms nothing within its budget (:data:`BUDGET` live
trials) never does (infinite launches). Per member: the median launches of each search over the
seeds, and the ratio of the default's to the model-off's; ``worst_member_ratio`` is the largest such
ratio, and ``members_default_failed`` counts the members where the model-off search confirms a
winner in most seeds and the default does not. ``false_success_rate``: the default's confirmed
winners whose noise-free value misses the noise-free target. ``gate_dropped_true_wiring_rate``:
studies whose gate dropped the wiring the draft was trained on. The model's calibration, from the
``predicted_output_tok_s`` (``_low``, ``_high``) each live run logs before it runs:
``first_prediction_rel_error`` (median over studies of the first prediction's relative error) and
``interval_coverage`` (the share of measurements inside their 80 % interval).
``tool_cpu_s_per_trial``: the studies' own CPU seconds per live trial (the outcome's figure; the
landscape engine costs next to nothing).

The bisect: :func:`~bisect_eagle.bisect.run_bisect` (ratio 0.9 of the good config) between a
member's good config and a bad one that adds planted culprits and harmless changes: a wrong wiring;
too many draft steps; two system values harmless alone that cannot launch together; and a wrong
wiring *masked* on the bad side by ``speculative_algorithm: EAGLE`` (which leaves the layer ids
unused). Correct when the bisect is isolated and verified, the culprits it names are exactly the
planted ones, and its repair set, reverted from the bad config, truly repairs it (noise-free):
``bisect_correct_rate``.

The last line printed is one JSON object. Stores (Optuna, MLflow) live in a temporary directory.

    python scripts/bench_search.py --family --noise 0.02 --workers 2  # 8 members x 20 seeds (the
    README's figures) python scripts/bench_search.py --family --heldout --noise 0.02    # the
    held-out members python scripts/bench_search.py --seeds 2                          # member 0,
    two seeds: a quick look
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import typer
import yaml

# thousands of artifact reads, no bars
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from landscape import HELDOUT_SEEDS, REPORTED_SEEDS, SPACE, SYSTEM, World, WorldEngine, draw_world  # noqa: E402

from bisect_eagle.bisect.run import BisectOptions, run_bisect  # noqa: E402
from bisect_eagle.keys import IDS_KEY  # noqa: E402
from bisect_eagle.search.study import Options, run_study  # noqa: E402
from bisect_eagle.spec.load import load_spec  # noqa: E402
from bisect_eagle.spec.schema import Spec  # noqa: E402
from bisect_eagle.tracking.runs import Tracking  # noqa: E402
from bisect_eagle.trials.accuracy import bootstrap_sd  # noqa: E402
from bisect_eagle.trials.standalone import Candidate, Verdict  # noqa: E402

app = typer.Typer(add_completion=False)
RATIO = 1.0  # the mission: reach the baseline tok/s
BUDGET = 60  # live trials of a study
STAGE1_STEPS = 3  # positions a standalone trial scores
# on log tok/s: how far a planted case lies from the bisect's limit (noise 2 % cannot blur it)
MARGIN = 0.05
HARMLESS = [
    {"env.NCCL_DEBUG": "INFO"},
    {"server_args.log_level": "warning"},
    {"env.NCCL_IB_HCA": "mlx5"},
]


@dataclass
class WorldScorer:
    """Stage 1 of a world: each wiring scored from the world's proxy (:meth:`World.standalone`), on
    a seeded dump.

    Stands in for :class:`~bisect_eagle.trials.standalone.Scorer` (``Options.scorer_factory``): the
    candidates are the spec's wirings, and the verdict's accuracy and its bootstrap error come from
    per-sample hits, as a dump's.
    """

    world: World
    spec: Spec
    seed: int

    def candidates(self) -> list[Candidate]:
        return [
            Candidate(w.label, list(w.layer_ids), "[0,1,2]", "target")
            for w in self.spec.standalone.wirings
        ]

    def score(self, c: Candidate) -> Verdict:
        index = [list(w) for w in self.world.wirings].index(sorted(c.layer_ids))
        got = self.world.standalone(
            index, steps=STAGE1_STEPS, rng=random.Random(self.seed * 1000 + index)
        )
        accuracy = sum(got["hits"]) / sum(got["tokens"])
        per_position = [
            {"full_vocab": r, "draft_vocab": r, "tokens": sum(got["tokens"])}
            for r in got["per_position"]
        ]
        simulated, running = 0.0, 1.0
        for r in got["per_position"]:
            running *= r
            simulated += running
        return Verdict(
            c.label,
            c.layer_ids,
            c.rule,
            c.source,
            accuracy,
            simulated,
            per_position,
            sum(got["tokens"]),
            accuracy_sd=bootstrap_sd(got["tokens"], got["hits"]),
        )


def write_spec(
    tmp: Path,
    name: str,
    *,
    world: World | None = None,
    settings: dict | None = None,
    search: dict | None = None,
) -> Spec:
    """A spec file for a world on an 8-GPU SGLang node and the spec it loads as: with ``world``, its
    wirings in stage 1 (scored by :class:`WorldScorer`), :data:`landscape.SPACE` searched and the
    target's ``config.json`` written (the cold prior reads it); with ``settings``, one fixed config
    (a bisect end)."""
    (tmp / "t").mkdir(exist_ok=True)
    if world is not None:
        (tmp / "t" / "config.json").write_text(json.dumps(world.config_json()))
    body: dict[str, Any] = {
        "name": name,
        "target": "t",
        "draft": "d",
        "dump": "u",
        "prompts": "p.jsonl",
        "engine": {"kind": "sglang", "sglang": {"tp": 8}, "settings": settings or {}},
        "baseline": "measure",
        "criterion": {"metric": "output_tok_s", "ratio": RATIO},
        "space": {} if settings else SPACE,
        "search": search or {},
    }
    if world is not None:
        body["standalone"] = {
            "wirings": [{"layer_ids": list(w)} for w in world.wirings],
            "steps": STAGE1_STEPS,
        }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    # the draft, dump and prompts are the world's, simulated
    return load_spec(path, check_inputs=False)


def study(
    tmp: Path, store: dict[str, str], world: World, *, noise: float, seed: int, model: bool
) -> dict[str, Any]:
    """One study on ``world``: launches to a confirmed winner (inf when none), whether the winner
    truly misses, the gate's decision on the true wiring, the model's errors and interval hits, and
    the tool's CPU per trial."""
    name = f"w{world.seed}-s{seed}-{'model' if model else 'off'}"
    spec = write_spec(
        tmp,
        name,
        world=world,
        search={"seed": seed, "max_live_trials": BUDGET, "model": {"enabled": model}},
    )
    engine = WorldEngine(world, noise=noise, seed=seed)
    out = run_study(
        spec,
        options=Options(
            storage=store["optuna"],
            tracking_uri=store["mlflow"],
            scorer_factory=lambda s: WorldScorer(world, s, seed),
        ),
        engine_factory=lambda s: engine,
    )
    false = False
    if out.target_reached:
        flat = {k: v for k, v in out.best["params"].items() if v is not None}
        false = world.truth(flat) < RATIO * world.base_tok_s
    true_ids = sorted(world.true_wiring)
    dropped = not any(v["passed"] for v in out.gate if sorted(v["layer_ids"]) == true_ids)
    errors, inside = [], []
    tracking = Tracking.open(store["mlflow"], spec.name)
    # oldest first: the k-th prediction
    for run in tracking.child_runs(out.parent_run_id, stage="live"):
        m = run.data.metrics
        if {
            "predicted_output_tok_s",
            "predicted_output_tok_s_low",
            "predicted_output_tok_s_high",
        } <= set(m) and (m.get("output_tok_s")):
            errors.append(abs(m["predicted_output_tok_s"] - m["output_tok_s"]) / m["output_tok_s"])
            inside.append(
                m["predicted_output_tok_s_low"]
                <= m["output_tok_s"]
                <= m["predicted_output_tok_s_high"]
            )
    return {
        "launches": out.launches["total"] if out.target_reached else math.inf,
        "spent": out.launches["total"],
        "live": out.counts["live_measured"],
        "confirm": out.launches["confirm"],
        "reached": out.target_reached,
        "false": false,
        "dropped": dropped,
        "errors": errors,
        "inside": inside,
        "cpu": out.tool_cpu_s_per_trial,
        "stop": out.stop_reason,
    }


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.inf


def _finite(x: float) -> float | None:
    return None if math.isinf(x) else x


def member_summary(
    world: World, default: list[dict[str, Any]], off: list[dict[str, Any]]
) -> dict[str, Any]:
    """One member's figures over its seeds (module docstring)."""
    d, o = _median([r["launches"] for r in default]), _median([r["launches"] for r in off])
    ratio = d / o if math.isfinite(o) else (1.0 if math.isinf(d) else 0.0)
    return {
        "member": world.seed,
        "moe": world.moe,
        "verify_token": round(world.verify_token, 3),
        "headroom": round(world.best()[1] / world.base_tok_s, 3),
        "default_launches_median": _finite(d),
        "model_off_launches_median": _finite(o),
        "ratio": ratio if math.isfinite(ratio) else None,
        "default_confirmed": sum(r["reached"] for r in default),
        "model_off_confirmed": sum(r["reached"] for r in off),
        "seeds": len(default),
        "default_failed": sum(r["reached"] for r in off) * 2 > len(off)
        and (sum(r["reached"] for r in default) * 2 <= len(default)),
    }


# -- the bisect
# ------------------------------------------------------------------------------------------------


def bisect_cases(world: World) -> list[dict[str, Any]]:
    """Planted culprits on ``world``'s good config (module docstring), each checked to break it
    (noise-free): a wrong wiring, too many draft steps, two system values harmless alone that break
    it together (where the member has such a pair), and the wrong wiring masked by
    ``speculative_algorithm: EAGLE``."""
    good = {**world.good_config(), **{k: v[0] for k, v in SYSTEM.items()}}
    floor = 0.9 * world.truth(good)
    wrong = min(range(len(world.wirings)), key=lambda i: world.accept0[i])
    cases = [
        {IDS_KEY: list(world.wirings[wrong])},
        {"num_steps": 6},
        {"speculative_algorithm": "EAGLE", IDS_KEY: list(world.wirings[wrong])},
    ]
    values = [(k, v) for k, choices in SYSTEM.items() for v in choices[1:]]
    alone = [(k, v) for k, v in values if world.truth({**good, k: v}) >= 0.95 * world.truth(good)]
    pairs = [
        {a: x, b: y}
        for (a, x), (b, y) in itertools.combinations(alone, 2)
        if a != b and world.truth({**good, a: x, b: y}) < floor
    ]
    cases += pairs[:1]

    def clear(c: dict[str, Any]) -> bool:
        """The case has an answer at the bench's noise: it breaks by :data:`MARGIN` at least, every
        part of it launches (a launch failure is unresolved to a bisect, not BAD), and, unless
        masked (each change of a masked pair breaks alone too), every smaller part is :data:`MARGIN`
        clear of the limit on the good side."""
        values = {
            n: [world.truth({**good, **dict(sub)}) for sub in itertools.combinations(c.items(), n)]
            for n in range(1, len(c) + 1)
        }
        if any(v == 0.0 for vs in values.values() for v in vs) or values[len(c)][
            0
        ] >= floor * math.exp(-MARGIN):
            return False
        return "speculative_algorithm" in c or all(
            v >= floor * math.exp(MARGIN) for n in range(1, len(c)) for v in values[n]
        )

    return [
        {"good": good, "culprit": c, "masked": "speculative_algorithm" in c}
        for c in cases
        if clear(c)
    ]


def _typed(key: str, value: Any) -> Any:
    """A ``key=value`` string of a world's system setting back to its choice's type."""
    for choice in SYSTEM.get(key, []):
        if str(choice) == str(value):
            return choice
    return value


def bisect_run(
    tmp: Path, store: dict[str, str], world: World, case: dict[str, Any], *, noise: float, seed: int
) -> dict[str, Any]:
    """One bisect of a planted case: whether it is correct (module docstring), and what it cost."""
    good, culprit = case["good"], case["culprit"]
    harmless = HARMLESS[: 1 + seed % len(HARMLESS)]
    bad = {**good, **culprit, **{k: v for h in harmless for k, v in h.items()}}
    good_spec = write_spec(tmp, f"good-{world.seed}-{seed}", settings=good)
    bad_spec = write_spec(tmp, f"bad-{world.seed}-{seed}", settings=bad)
    engine = WorldEngine(world, noise=noise, seed=seed)
    report = run_bisect(
        BisectOptions(
            good=str(good_spec.source),
            bad=str(bad_spec.source),
            tracking_uri=store["mlflow"],
            log_path=tmp / f"bisect-{world.seed}-{seed}.log",
        ),
        engine_factory=lambda s: engine,
    )
    reverted = {n for c in report.changes if c.name in (report.repair or []) for n in c.good}
    repaired = (
        None
        if report.repair is None
        else world.truth(
            {
                **{k: v for k, v in bad.items() if k not in reverted},
                **{n: good[n] for n in reverted if n in good},
            }
        )
    )
    named = sorted(c.name for c in report.culprits) == sorted(culprit)
    repairs = repaired is not None and repaired >= 0.9 * world.truth(good)
    body = report.to_json()
    return {
        "masked": case["masked"],
        "correct": report.status.value == "isolated" and report.verified and named and repairs,
        "status": report.status.value,
        "probes": body["probes_used"],
        "launches": body.get("launches"),
        "live_trials": report.live_trials,
    }


def _cell(x: float | None) -> str:
    return "never" if x is None else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def run_member(job: tuple[int, int, float, int]) -> tuple[dict[str, Any] | None, list, list, list]:
    """Member ``job[0]``'s studies over ``job[1]`` seeds (noise ``job[2]``; 0: none) and ``job[3]``
    bisects per planted case, in stores of its own: (its summary row or None without studies, the
    default's studies, the model-off's, the bisects)."""
    member, seeds, noise, bisects = job
    _quiet()
    world = draw_world(member)
    default, off, bisected = [], [], []
    with tempfile.TemporaryDirectory(prefix=f"bench-search-{member}-") as name:
        tmp = Path(name)
        store = {"optuna": f"sqlite:///{tmp}/optuna.db", "mlflow": f"sqlite:///{tmp}/mlflow.db"}
        for seed in range(seeds):
            default.append(study(tmp, store, world, noise=noise, seed=seed, model=True))
            off.append(study(tmp, store, world, noise=noise, seed=seed, model=False))
            print(
                f"member {member} seed {seed}: launches {default[-1]['launches']} with the model "
                f"({default[-1]['live']} live), {off[-1]['launches']} without ({off[-1]['live']} "
                f"live){'; GATE DROPPED THE TRUE WIRING' if default[-1]['dropped'] else ''}",
                flush=True,
            )
        for i, case in enumerate(bisect_cases(world)):
            for seed in range(bisects):
                bisected.append(
                    bisect_run(tmp, store, world, case, noise=noise, seed=seed * 10 + i)
                )
                got = bisected[-1]
                print(
                    f"member {member} bisect {sorted(case['culprit'])}: {got['status']}, "
                    f"{'correct' if got['correct'] else 'WRONG'}, {got['launches']} launches",
                    flush=True,
                )
    return (member_summary(world, default, off) if seeds else None), default, off, bisected


def _quiet() -> None:
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore")
    logging.getLogger("mlflow").setLevel(logging.ERROR)


@app.command()
def main(
    noise: float = typer.Option(
        0.02, min=0.0, help="Relative measurement noise (sd of log samples)."
    ),
    seeds: int = typer.Option(
        20, min=0, help="Seeds (studies of each search) per member (0: the bisects alone)."
    ),
    family: bool = typer.Option(
        False, "--family", help="Every reported member (landscape.REPORTED_SEEDS)."
    ),
    heldout: bool = typer.Option(
        False, "--heldout", help="The held-out members (landscape.HELDOUT_SEEDS)."
    ),
    members: int = typer.Option(
        0, min=0, help="At most this many members (0: all of the chosen set)."
    ),
    bisects: int = typer.Option(2, min=0, help="Bisects per planted case and member."),
    workers: int = typer.Option(
        1, min=1, help="Members measured in parallel processes (one core each)."
    ),
) -> None:
    """Launches to a confirmed winner with the model and without, per member, and the bisect's
    accuracy."""
    _quiet()
    chosen = list(HELDOUT_SEEDS if heldout else REPORTED_SEEDS if family else REPORTED_SEEDS[:1])
    chosen = chosen[:members] if members else chosen
    rows, default_all, off_all, bisect_all = [], [], [], []
    jobs = [(member, seeds, noise, bisects) for member in chosen]
    if workers > 1:
        with ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn")
        ) as pool:
            results = list(pool.map(run_member, jobs))
    else:
        results = [run_member(job) for job in jobs]
    for row, default, off, bisected in results:
        rows += [row] if row else []
        default_all += default
        off_all += off
        bisect_all += bisected
    bisect_summary = {
        "bisect_correct_rate": sum(r["correct"] for r in bisect_all) / len(bisect_all)
        if bisect_all
        else None,
        "bisect_cases": len(bisect_all),
        "bisect_masked_cases": sum(r["masked"] for r in bisect_all),
        "bisect_launches_median": statistics.median(r["launches"] for r in bisect_all)
        if bisect_all
        else None,
    }
    if not seeds:
        print(json.dumps({"noise": noise, "members": chosen, "heldout": heldout, **bisect_summary}))
        return
    firsts = [r["errors"][0] for r in default_all if r["errors"]]
    inside = [i for r in default_all for i in r["inside"]]
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    reached = [r for r in default_all if r["reached"]]
    summary = {
        "noise": noise,
        "seeds": seeds,
        "members": chosen,
        "heldout": heldout,
        "family_members": len(rows),
        "default_launches_median": _finite(_median([r["launches"] for r in default_all])),
        "model_off_launches_median": _finite(_median([r["launches"] for r in off_all])),
        "worst_member_ratio": max(ratios) if ratios else None,
        "worst_member": max(rows, key=lambda r: r["ratio"] if r["ratio"] is not None else math.inf)[
            "member"
        ],
        "members_default_failed": sum(r["default_failed"] for r in rows),
        "false_success_rate": sum(r["false"] for r in reached) / len(reached) if reached else 0.0,
        "false_success_rate_model_off": (
            sum(r["false"] for r in off_all if r["reached"])
            / max(1, sum(r["reached"] for r in off_all))
        ),
        "default_confirmed_rate": len(reached) / len(default_all),
        "model_off_confirmed_rate": sum(r["reached"] for r in off_all) / len(off_all),
        "default_live_median": statistics.median(r["live"] for r in default_all),
        "model_off_live_median": statistics.median(r["live"] for r in off_all),
        "first_prediction_rel_error": statistics.median(firsts) if firsts else None,
        "interval_coverage": sum(inside) / len(inside) if inside else None,
        "gate_dropped_true_wiring_rate": sum(r["dropped"] for r in default_all) / len(default_all),
        "tool_cpu_s_per_trial": {
            "default": statistics.median(r["cpu"] for r in default_all if r["cpu"] is not None),
            "model_off": statistics.median(r["cpu"] for r in off_all if r["cpu"] is not None),
        },
        **bisect_summary,
        "per_member": rows,
    }
    print(
        f"\n{'member':>6} {'kind':>5} {'vt':>6} {'headroom':>8} {'default':>8} {'model off':>9} "
        f"{'ratio':>6} {'confirmed':>10}   launches to a confirmed winner (median over {seeds} "
        "seeds)"
    )
    for r in rows:
        print(
            f"{r['member']:>6} {'moe' if r['moe'] else 'dense':>5} {r['verify_token']:>6.3f} "
            f"{r['headroom']:>8.3f} {_cell(r['default_launches_median']):>8} "
            f"{_cell(r['model_off_launches_median']):>9} {_cell(r['ratio']):>6} "
            f"{r['default_confirmed']:>4}/{r['model_off_confirmed']:<5}"
        )
    print(
        f"worst member ratio {_cell(summary['worst_member_ratio'])} (member "
        f"{summary['worst_member']}); false successes {summary['false_success_rate']:.2f}; gate "
        f"dropped the true wiring {summary['gate_dropped_true_wiring_rate']:.2f}; first "
        f"prediction's error {_cell(summary['first_prediction_rel_error'])}; coverage "
        f"{_cell(summary['interval_coverage'])}; bisect correct "
        f"{_cell(summary['bisect_correct_rate'])} of {len(bisect_all)}"
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    app()
