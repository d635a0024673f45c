"""Benchmark the bisect on the family of synthetic 8-GPU deployments (``scripts/landscape.py``),
with noise, graded against the noise-free truth over every subset of the changes.

Cases. For each member of the family (:data:`SEEDS`: ``landscape.REPORTED_SEEDS``, ``--heldout`` for
``landscape.HELDOUT_SEEDS``) the good configuration is the member's own (``World.good_config``); a
bad one applies 4 to 7 changes drawn from what a deployment gets wrong: another wiring, the draft
steps, the tree (``topk``, ``num_draft_tokens``), every searched NCCL and server setting (with the
member's interaction and its pair that cannot launch), ``speculative_algorithm: EAGLE`` (which
leaves the layer ids unused: it hides a wrong wiring) and settings that change nothing
(``env.NCCL_DEBUG``, ``server_args.log_level``). The truth of a case is every *minimal breaking
set*: a set of changes whose application to the good configuration brings its noise-free tok/s below
0.9 × the good configuration's, while no smaller part of it does (computed over all ``2^n``
subsets).

A case is kept only where the question has an answer at the bench's noise: every subset's noise-free
value lies at least :data:`MARGIN` (on logs) from the limit, and every subset runs (a configuration
that cannot launch is UNRESOLVED to a bisect, git bisect's *skip*, not BAD). Cases come in three
kinds, an equal number from each member:

- ``overlap``: two minimal breaking sets share a change (``{A, B}`` and ``{B, C}``). The family's
  members rarely make one at this margin by themselves, so these cases plant it: the member with two
  more interactions of its system settings (:class:`Planted`: ``A`` with ``B`` and ``B`` with ``C``,
  each :data:`PLANTED` on log tok/s, the shape of the NCCL group that broke the good configuration
  only with the wiring);
- ``masked``: a minimal breaking set holds a change the plans show hidden at one end (EAGLE leaves a
  wrong wiring unused in the bad configuration), or breaks alone but not with some other changes
  added (a compensating one);
- ``plain``: neither (one set, or independent ones).

Graded per case: ``exact`` when the bisect says ``isolated`` and its breaking sets are exactly the
truth's; a ``false culprit`` when any set it reports is not a minimal breaking set of the truth
(whatever its status). Reported: ``bisect_exact_rate`` (goal ≥ 0.95), ``bisect_false_culprit_rate``
(≤ 0.05), ``bisect_launches_median`` (≤ 20), ``bisect_launches_max``, per kind, and the share of
cases the bisect left ``partial``. Each true breaking set found also gets a side (acceptance or
cost: the bisect probes it again with acceptance pinned, ``bisect/sides.py``), graded against the
same rule applied to the noise-free truth: ``bisect_side_agreement`` over the sets whose pinned
value lies at least :data:`MARGIN` from the limit, and the share the bisect left ``unknown``.
Launches include these pinned probes. Stores live in a temporary directory. The last line printed is
one JSON object.

    python scripts/bench_bisect.py                      # 48 cases (8 members × 6), 2 % noise
    python scripts/bench_bisect.py --per-world 3 --noise 0.03
    python scripts/bench_bisect.py --per-world 1 --members 2   # a quick look: 2 cases
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import random
import statistics
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import landscape  # noqa: E402

from bisect_eagle.bisect.changes import list_changes  # noqa: E402
from bisect_eagle.bisect.ddmin import ProbeOutcome  # noqa: E402
from bisect_eagle.bisect.judge import MAX_LAUNCHES  # noqa: E402
from bisect_eagle.bisect.run import BisectOptions, run_bisect  # noqa: E402
from bisect_eagle.bisect.sides import classify  # noqa: E402
from bisect_eagle.keys import IDS_KEY  # noqa: E402
from bisect_eagle.spec.load import load_spec  # noqa: E402
from bisect_eagle.spec.schema import settings_from  # noqa: E402
from bisect_eagle.spec.settings import PINNED, profile_for_accept_length  # noqa: E402

app = typer.Typer(add_completion=False)
RATIO = 0.9  # the bisect's limit: 0.9 × the good configuration
MARGIN = 0.05  # every subset's noise-free value at least this far (log) from the limit
KINDS = ("overlap", "masked", "plain")
HARMLESS = {"env.NCCL_DEBUG": "INFO", "server_args.log_level": "warning"}
DRAWS = 600  # candidate bad configurations drawn per member and kind before giving up on it
PLANTED = -0.25  # log tok/s of each planted interaction of an overlap case


@dataclass(frozen=True, kw_only=True)
class Planted(landscape.World):
    """A member of the family with more interactions of its system settings: ``("key=value",
    "key=value", log factor)``, on top of its own."""

    extra: tuple[tuple[str, str, float], ...] = ()

    def _system(self, effective: dict[str, Any]) -> tuple[float, str | None]:
        log, failure = super()._system(effective)
        if failure is not None:
            return log, failure
        chosen = {
            f"{k}={(effective.get(k.split('.')[0]) or {}).get(k.split('.', 1)[1], values[0])}"
            for k, values in landscape.SYSTEM.items()
        }
        return log + sum(e for a, b, e in self.extra if {a, b} <= chosen), None


@dataclass
class Case:
    """One bisect to run: a member of the family, its good configuration and a bad one, and the
    truth."""

    world: landscape.World
    kind: str
    good: dict[str, Any]
    bad: dict[str, Any]
    changes: list[str]  # the settings that differ (each one change)
    truth: list[frozenset[str]] = field(default_factory=list)  # the minimal breaking sets


def choices(world: landscape.World, good: dict[str, Any]) -> dict[str, list[Any]]:
    """Each setting a bad configuration may change, and the values it may take there (not the good
    one's)."""
    out: dict[str, list[Any]] = {
        IDS_KEY: [list(w) for w in world.wirings if sorted(w) != sorted(good[IDS_KEY])],
        "num_steps": [s for s in range(1, 7) if s != good.get("num_steps")],
        "topk": [k for k in (2, 4) if k != good.get("topk", 1)],
        "num_draft_tokens": [4, 8, 16],
        "speculative_algorithm": ["EAGLE"],
        **{k: [v] for k, v in HARMLESS.items()},
    }
    for key, values in landscape.SYSTEM.items():
        out[key] = [v for v in values[1:] if v != good.get(key)]
    return {k: v for k, v in out.items() if v}


def subsets_truth(
    world: landscape.World, good: dict[str, Any], bad: dict[str, Any], names: list[str]
) -> dict[frozenset[str], float]:
    """The noise-free tok/s of the good configuration with every subset of ``names`` taken from
    ``bad``."""
    return {
        frozenset(s): world.truth({**good, **{n: bad[n] for n in s}})
        for k in range(len(names) + 1)
        for s in itertools.combinations(names, k)
    }


def minimal_breaking(values: dict[frozenset[str], float], limit: float) -> list[frozenset[str]]:
    """The minimal sets whose value is below ``limit``."""
    broken = [s for s, v in values.items() if v < limit]
    return sorted(
        (s for s in broken if not any(o < s for o in broken)), key=lambda s: (len(s), sorted(s))
    )


def kind_of(
    values: dict[frozenset[str], float], truth: list[frozenset[str]], limit: float, masked: set[str]
) -> str:
    """``overlap``, ``masked`` or ``plain`` (module docstring); ``masked``: the changes the plans
    show hidden at an end."""
    if any(a & b for a, b in itertools.combinations(truth, 2)):
        return "overlap"
    if any(t & masked for t in truth) or any(
        v >= limit and s > t for t in truth for s, v in values.items()
    ):
        return "masked"
    return "plain"


def draw_case(world: landscape.World, rng: random.Random, *, overlap: bool = False) -> Case | None:
    """One random bad configuration of ``world`` and its truth; None when it fails the bench's
    conditions (the bad configuration not truly broken, a subset within :data:`MARGIN` of the limit
    or failing, a difference the plans do not count as a change). ``overlap``: plant two
    interactions sharing a system setting first (:class:`Planted`) and change those three
    settings."""
    good = world.good_config()
    options = choices(world, good)
    keys = rng.sample(sorted(options), rng.randint(4, min(7, len(options))))
    if overlap:
        a, b, c = rng.sample(sorted(landscape.SYSTEM), 3)
        values = {k: rng.choice(options[k]) for k in (a, b, c)}
        pair = [f"{k}={values[k]}" for k in (a, b, c)]
        world = Planted(
            **{f.name: getattr(world, f.name) for f in dataclasses.fields(landscape.World)},
            extra=((pair[0], pair[1], PLANTED), (pair[1], pair[2], PLANTED)),
        )
        keys = [a, b, c, *(k for k in keys if k not in (a, b, c))][: rng.randint(4, 6)]
    # the incident's masked pair, often
    if rng.random() < 0.5 and "speculative_algorithm" not in keys:
        keys = [*keys[:-1], "speculative_algorithm"] if IDS_KEY in keys else keys
    bad = {**good, **{k: rng.choice(options[k]) for k in keys}}
    if overlap:
        bad.update(values)
    if bad.get("topk", 1) > 1 and "num_draft_tokens" not in bad:
        bad["num_draft_tokens"] = 8
        keys.append("num_draft_tokens")
    engine = landscape.WorldEngine(world)
    changes = list_changes(
        good, bad, plan=lambda flat: engine.plan(settings_from(dict(flat), "bench"))
    )
    names = sorted(n for c in changes for n in c.good)
    if sorted(keys) != names or any(len(c.good) != 1 for c in changes):
        return None
    values = subsets_truth(world, good, bad, names)
    limit = RATIO * values[frozenset()]
    if any(v <= 0 or abs(math.log(v / limit)) < MARGIN for v in values.values()):
        return None
    truth = minimal_breaking(values, limit)
    if not truth or values[frozenset(names)] >= limit:
        return None
    masked = {n for c in changes if c.masked_by for n in c.good}
    return Case(world, kind_of(values, truth, limit, masked), good, bad, names, truth)


def draw_cases(seeds: tuple[int, ...], per_world: int) -> list[Case]:
    """``per_world`` cases of each member, as even over :data:`KINDS` as the member allows (a kind
    it cannot make within :data:`DRAWS` draws is made up by the others)."""
    cases = []
    for seed in seeds:
        world = landscape.draw_world(seed)
        rng = random.Random(1000 + seed)
        want = {
            k: per_world // len(KINDS) + (i < per_world % len(KINDS)) for i, k in enumerate(KINDS)
        }
        picked: list[Case] = []
        for kind in (k for k in KINDS if want[k]):
            got = 0
            for _ in range(DRAWS):
                case = draw_case(world, rng, overlap=kind == "overlap")
                if case is not None and case.kind == kind:
                    picked.append(case)
                    got += 1
                    if got == want[kind]:
                        break
        for _ in range(DRAWS):
            if len(picked) >= per_world:
                break
            case = draw_case(world, rng)
            if case is not None:
                picked.append(case)
        cases += picked
    return cases


def write_spec(tmp: Path, name: str, settings: dict[str, Any]) -> Path:
    """A spec file for a member (sglang kind: its paths are never read)."""
    body = {
        "name": name,
        "target": "t",
        "draft": "d",
        "dump": "u",
        "prompts": "p.jsonl",
        "engine": {"kind": "sglang", "settings": settings},
        "baseline": "measure",
        "criterion": {"metric": "output_tok_s", "ratio": 1.0},
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    load_spec(path)  # refused here rather than inside the bisect
    return path


def true_side(case: Case, cause: frozenset[str]) -> str | None:
    """The side (``bisect/sides.py``) of a breaking set by the noise-free truth: the set applied to
    the good configuration with acceptance pinned to the good configuration's true accept length;
    None when that value lies within :data:`MARGIN` of the limit (no verdict to expect) or there are
    no draft steps."""
    engine = landscape.WorldEngine(case.world)

    def truth(flat: dict[str, Any]) -> tuple[float | None, float, int]:
        plan = engine.plan(settings_from(dict(flat), "bench"))
        value, accept_length, _ = case.world.true_value(plan.effective)
        return value, accept_length, int(plan.effective.get("num_steps") or 0)

    good, good_al, _ = truth(case.good)
    flat = {**case.good, **{n: case.bad[n] for n in cause}}
    _, natural, steps = truth(flat)
    if good is None or steps < 1 or not math.isfinite(good_al):
        return None
    pinned, _, _ = truth(
        {**flat, PINNED: profile_for_accept_length(max(1.0, min(1.0 + steps, good_al)), steps)}
    )
    limit = RATIO * good
    if pinned is None or abs(math.log(pinned / limit)) < MARGIN:
        return None
    return classify(
        ProbeOutcome.GOOD if pinned >= limit else ProbeOutcome.BAD,
        natural=natural,
        good=good_al,
        ratio=RATIO,
    )


def run_case(
    tmp: Path, uri: str, case: Case, *, index: int, noise: float, max_launches: int
) -> dict[str, Any]:
    """One bisect of ``case``; what it found against the truth, and what it cost."""
    engine = landscape.WorldEngine(case.world, noise=noise, seed=index)
    good = write_spec(tmp, f"good-{index}", case.good)
    bad = write_spec(tmp, f"bad-{index}", case.bad)
    report = run_bisect(
        BisectOptions(
            good=str(good),
            bad=str(bad),
            tracking_uri=uri,
            ratio=RATIO,
            max_launches=max_launches,
            log_path=tmp / f"bisect-{index}.log",
        ),
        engine_factory=lambda s: engine,
    )
    found = {frozenset(b) for b in report.breaking}
    truth = set(case.truth)
    sides = [
        (s.get("side", "unknown"), true_side(case, frozenset(s["changes"])))
        for s in report.sets
        if frozenset(s["changes"]) in truth
    ]
    return {
        "index": index,
        "seed": case.world.seed,
        "kind": case.kind,
        "status": report.status.value,
        "exact": report.status.value == "isolated" and found == truth,
        "false": bool(found - truth),
        "missed": len(truth - found),
        "launches": report.launches,
        "probes": len(report.probes),
        "truth": [sorted(s) for s in case.truth],
        "found": [sorted(s) for s in found],
        "probabilities": [s["probability"] for s in report.sets],
        "changes": len(case.changes),
        "sides": [[said, true] for said, true in sides if true is not None],
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON line's figures (module docstring)."""
    launches = [r["launches"] for r in runs]
    # (said, true) for each true set found, truth decided
    sides = [pair for r in runs for pair in r["sides"]]
    per_kind = {
        k: {
            "cases": len(rs),
            "exact": sum(r["exact"] for r in rs) / len(rs),
            "false_culprit": sum(r["false"] for r in rs) / len(rs),
            "launches_median": statistics.median(r["launches"] for r in rs),
        }
        for k in KINDS
        for rs in [[r for r in runs if r["kind"] == k]]
        if rs
    }
    true_probs = [
        p
        for r in runs
        for p, s in zip(r["probabilities"], r["found"], strict=False)
        if s in r["truth"]
    ]
    false_probs = [
        p
        for r in runs
        for p, s in zip(r["probabilities"], r["found"], strict=False)
        if s not in r["truth"]
    ]
    return {
        "bisect_cases": len(runs),
        "bisect_exact_rate": sum(r["exact"] for r in runs) / len(runs),
        "bisect_false_culprit_rate": sum(r["false"] for r in runs) / len(runs),
        "bisect_launches_median": statistics.median(launches),
        "bisect_launches_max": max(launches),
        "bisect_partial_rate": sum(r["status"] == "partial" for r in runs) / len(runs),
        "bisect_probability_true_sets_median": statistics.median(true_probs)
        if true_probs
        else None,
        "bisect_probability_false_sets_max": max(false_probs) if false_probs else None,
        "bisect_side_sets": len(sides),
        "bisect_side_agreement": (sum(said == true for said, true in sides) / len(sides))
        if sides
        else None,
        "bisect_side_unknown_rate": (sum(said == "unknown" for said, _ in sides) / len(sides))
        if sides
        else None,
        "bisect_per_kind": per_kind,
    }


@app.command()
def main(
    noise: float = typer.Option(
        0.02, min=0.0, help="Relative noise of one measurement (before each member's own scale)."
    ),
    per_world: int = typer.Option(6, min=1, help="Cases per member of the family."),
    heldout: bool = typer.Option(
        False, "--heldout", help="The held-out members instead of the reported ones."
    ),
    max_launches: int = typer.Option(
        MAX_LAUNCHES, min=1, help="The bisect's launch budget (--max-launches)."
    ),
    members: int = typer.Option(
        0, min=0, help="At most this many members (0: all of the chosen set)."
    ),
) -> None:
    """Every minimal breaking set, no false culprit, within the launch budget, over the family's
    cases."""
    warnings.simplefilter("ignore")
    logging.getLogger("mlflow").setLevel(logging.ERROR)
    seeds = list(landscape.HELDOUT_SEEDS if heldout else landscape.REPORTED_SEEDS)
    seeds = seeds[:members] if members else seeds
    cases = draw_cases(tuple(seeds), per_world)
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-bisect-") as name:
        tmp = Path(name)
        uri = f"sqlite:///{tmp}/mlflow.db"
        print(
            f"{'case':>4} {'member':>6} {'kind':<8} {'n':>2} {'status':<12} {'launches':>8} "
            f"{'exact':>5}  truth -> found",
            flush=True,
        )
        for i, case in enumerate(cases):
            r = run_case(tmp, uri, case, index=i, noise=noise, max_launches=max_launches)
            runs.append(r)
            shown = (
                f"{' | '.join('+'.join(s) for s in r['truth'])} -> "
                f"{' | '.join('+'.join(s) for s in r['found']) or '-'}"
            )
            print(
                f"{i:>4} {case.world.seed:>6} {case.kind:<8} {r['changes']:>2} {r['status']:<12} "
                f"{r['launches']:>8} {'yes' if r['exact'] else 'NO':>5}  {shown}",
                flush=True,
            )
    out = {
        "noise": noise,
        "margin": MARGIN,
        "ratio": RATIO,
        "max_launches": max_launches,
        "members": list(seeds),
        **summary(runs),
    }
    print(f"\n{'kind':<8} {'cases':>5} {'exact':>6} {'false':>6} {'launches':>8}")
    for k, v in out["bisect_per_kind"].items():
        print(
            f"{k:<8} {v['cases']:>5} {v['exact']:>6.2f} {v['false_culprit']:>6.2f} "
            f"{v['launches_median']:>8.1f}"
        )
    print(json.dumps(out))


if __name__ == "__main__":
    app()
