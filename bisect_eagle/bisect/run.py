"""``run_bisect``: endpoints -> the engine's plans -> the changes -> probes -> a report, one MLflow parent run.

The report answers two questions separately (see :mod:`~bisect_eagle.bisect.ddmin`):

- ``breaking_sets``: sets of changes whose *application to the good configuration* breaks it (each
  1-minimal: without any one of its changes it no longer breaks it);
- ``repair_set``: a set of changes whose *removal from the bad configuration* repairs it (1-minimal: put
  any one back and it fails again).

They differ when changes interact: two changes that fail only together are one breaking set of two, and
reverting either one repairs the bad configuration.

A change may be *masked*: inert at one end, hidden by another setting there (a wrong wiring is unused while the
bad configuration says ``speculative_algorithm: EAGLE``; see :mod:`~bisect_eagle.bisect.changes`). The report
says, per change, what masks it, and in one line when a repair needs a masked change and its masker together.
Every answer is verified by a probe before it is reported as ``isolated``: each breaking set applied to the good
configuration judged BAD, the repair set reverted from the bad configuration as it is (its not-changes kept)
judged GOOD (``verification`` in the report, per change and in all). A failed verification is followed (a
not-change that matters becomes a change) or reported as ``interaction``.

Its runs live in their own experiment (``<spec name> / bisect``), apart from the search's trials: a parent run
whose description states the breaking sets, the repair set and the probe table, with a plot of the probes against
the limit; a child per probe, named ``probe NN +changes: OUTCOME``.

Nothing secret is written or printed: change values come from the plans (redacted), ``--set`` values are
redacted, and every text (log, ``result.json``, the report, progress lines) is scrubbed of the secret
values of both configurations and of this process's environment.
"""

from __future__ import annotations

import collections
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_eagle.bisect.changes import Change, Side, explain_no_changes, list_changes, not_changes, with_masks
from bisect_eagle.bisect.ddmin import (
    BisectProgress,
    BisectStatus,
    ChangeSet,
    Culprits,
    ProbeOutcome,
    find_culprits,
)
from bisect_eagle.bisect.endpoints import Endpoint, deployment, load_endpoint
from bisect_eagle.bisect.judge import LIVE_METRICS, STANDALONE_METRIC, Judge
from bisect_eagle.bisect.log import BisectLog, ParsedLog, parse_log
from bisect_eagle.bisect.prober import Prober, make_planner
from bisect_eagle.engines import make_engine
from bisect_eagle.engines.base import Engine
from bisect_eagle.errors import BadInput
from bisect_eagle.report.study import plot_probes
from bisect_eagle.spec.schema import Spec, check_setting_name
from bisect_eagle.stats import deterministic
from bisect_eagle.tracking.redact import REDACTED, Scrubber, redact_mapping
from bisect_eagle.tracking.runs import NOTE, Tracking, resolve_tracking_uri
from bisect_eagle.trials.record import TrialContext, deployment_tags


@dataclass
class BisectOptions:
    """What the command line asks for."""

    good: str | None = None
    bad: str | None = None
    spec: Path | None = None
    metric: str | None = None  # default: the spec's criterion metric
    ratio: float = 0.9
    threshold: float | None = None
    confidence: float = 0.95
    repeats: int | None = None  # first samples of each endpoint; default: max(3, the spec's search.repeats)
    max_samples: int = 12  # sample budget of a probe (an endpoint's is twice that)
    overrides: dict[str, Any] = field(default_factory=dict)  # settings forced in every probe (e.g. fewer prompts)
    tracking_uri: str | None = None
    log_path: Path | None = None
    replay: Path | None = None


@dataclass
class BisectReport:
    """The result of a bisect, as printed and logged (the module docstring says what each set means)."""

    status: BisectStatus
    good: str
    bad: str
    judge: dict[str, Any]
    changes: list[Change]
    breaking: list[list[str]]  # each, applied to the good configuration, breaks it
    repair: list[str] | None  # removed from the bad configuration, repairs it (None: not established)
    culprits: list[Change]  # the changes of all breaking sets
    probes: list[dict[str, Any]]
    unresolved: list[list[str]]
    live_trials: int  # distinct plans measured
    samples: int  # engine runs
    probe_bound: int
    notes: list[str]
    parent_run_id: str
    log: str
    not_changes: list[str] = field(default_factory=list)  # requested differences the plans do not tell apart
    verification: list[dict[str, Any]] = field(default_factory=list)  # each answer's checking probe
    verified: bool = False  # every answer checked and held (the repair set measured GOOD on the bad config)
    interactions: list[str] = field(default_factory=list)  # one line per repair that needs a masked pair
    promoted: list[str] = field(default_factory=list)  # not-changes alone that verification showed to matter
    scrub: Callable[[str], str] = field(default=lambda text: text, repr=False)

    def checks_of(self, name: str) -> list[dict[str, Any]]:
        """The verification probes whose checked set holds the change ``name``."""
        return [v for v in self.verification if name in v["changes"]]

    def to_json(self) -> dict[str, Any]:
        def change(c: Change) -> dict[str, Any]:
            return {**c.to_json(), "verification": self.checks_of(c.name)}

        body = {
            "status": self.status.value, "good": self.good, "bad": self.bad, "judge": self.judge,
            "changes": [change(c) for c in self.changes], "not_changes": self.not_changes,
            "breaking_sets": self.breaking, "repair_set": self.repair,
            "culprits": [change(c) for c in self.culprits], "verified": self.verified,
            "verification": self.verification, "interactions": self.interactions, "promoted": self.promoted,
            "probes": self.probes, "unresolved": self.unresolved, "probes_used": len(self.probes),
            "verification_probes": sum(bool(p.get("verifies")) for p in self.probes),
            "probe_bound": self.probe_bound, "live_trials": self.live_trials, "samples": self.samples,
            "notes": self.notes, "parent_run_id": self.parent_run_id, "log": self.log,
        }
        return _scrubbed(json.loads(json.dumps(body, default=str)), self.scrub)


def _scrubbed(value: Any, scrub: Callable[[str], str]) -> Any:
    """``value`` (JSON data) with every string scrubbed."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        return [_scrubbed(v, scrub) for v in value]
    if isinstance(value, dict):
        return {k: _scrubbed(v, scrub) for k, v in value.items()}
    return value


def _replay_options(opts: BisectOptions) -> tuple[BisectOptions, ParsedLog | None]:
    """Options with good, bad, judge and overrides taken from a replayed log."""
    if opts.replay is None:
        if not opts.good or not opts.bad:
            raise BadInput("give --good and --bad (spec files or MLflow run ids), or --replay LOG")
        return opts, None
    if opts.good or opts.bad:
        raise BadInput("--replay takes good and bad from the log; do not give --good/--bad with it")
    parsed = parse_log(opts.replay)
    judge = parsed.header["judge"]
    if not isinstance(judge, dict):
        raise BadInput(f"{opts.replay}: header 'judge' must be a JSON object")
    overrides = {**parsed.header.get("set", {}), **opts.overrides}
    hidden = [k for k, v in overrides.items() if v == REDACTED]
    if hidden:
        raise BadInput(f"{opts.replay}: the log hides the value of {', '.join(hidden)}; give it again with "
                       f"--set {hidden[0]}=VALUE")
    merged = BisectOptions(
        good=parsed.header["good"], bad=parsed.header["bad"], spec=opts.spec, metric=judge.get("metric"),
        ratio=float(judge.get("ratio", opts.ratio)), threshold=judge.get("threshold"),
        confidence=float(judge.get("confidence", opts.confidence)), repeats=judge.get("repeats"),
        max_samples=int(judge.get("max_samples", opts.max_samples)), overrides=overrides,
        tracking_uri=opts.tracking_uri, log_path=opts.log_path, replay=opts.replay)
    return merged, parsed


def _judge(opts: BisectOptions, spec: Spec) -> Judge:
    metric = opts.metric or spec.criterion.metric
    if metric not in (*LIVE_METRICS, STANDALONE_METRIC):
        raise BadInput(f"--metric {metric!r}: expected one of {', '.join((*LIVE_METRICS, STANDALONE_METRIC))}")
    if opts.ratio <= 0:
        raise BadInput(f"--ratio must be > 0, got {opts.ratio}")
    if not 0 < opts.confidence < 1:
        raise BadInput(f"--confidence must be between 0 and 1, got {opts.confidence}")
    if opts.max_samples < 1:
        raise BadInput(f"--max-samples must be >= 1, got {opts.max_samples}")
    repeats = opts.repeats if opts.repeats is not None else max(3, spec.search.repeats)
    if repeats < 1:
        raise BadInput(f"--repeats must be >= 1, got {repeats}")
    if metric == STANDALONE_METRIC:  # deterministic: one sample each, the limit alone decides
        return Judge(metric, opts.ratio, opts.threshold, opts.confidence, 1, 1, 1)
    return Judge(metric, opts.ratio, opts.threshold, opts.confidence, repeats, opts.max_samples,
                 max(repeats, 2 * opts.max_samples))


def _deterministic_judge(judge: Judge, engine: Engine | None) -> str | None:
    """One sample per endpoint and per probe when ``engine`` declares the judge's metric deterministic (there is
    no noise to estimate: the limit alone decides); why, for the progress output and the report, else None."""
    if engine is None or judge.metric == STANDALONE_METRIC or not deterministic(engine, judge.metric):
        return None
    judge.repeats = judge.max_samples = judge.endpoint_samples = 1
    return (f"{judge.metric} is deterministic on the {engine.name} engine (greedy decoding): one sample per "
            "endpoint and per probe, no noise estimate")


def _probe_spec(spec: Spec, judge: Judge) -> Spec:
    """The deployment spec with the judge's metric and one run per trial (the prober takes more samples)."""
    if judge.metric == STANDALONE_METRIC:
        return spec
    return spec.model_copy(update={
        "criterion": spec.criterion.model_copy(update={"metric": judge.metric}),
        "search": spec.search.model_copy(update={"repeats": 1, "prune_below": None}),
    })


def _no_changes(good: Endpoint, bad: Endpoint, ignored: list[str], engine: str) -> BadInput:
    if not ignored:
        return BadInput(f"{good.label} and {bad.label} have the same settings (after --set); nothing to bisect")
    return BadInput(f"{good.label} and {bad.label} plan the same trial on the {engine} engine: "
                    f"{', '.join(ignored)} differ as requested, but the engine ignores them or they equal its "
                    "defaults; nothing to bisect")


def run_bisect(opts: BisectOptions, *, engine_factory: Callable[[Spec], Engine] = make_engine,
               progress: BisectProgress | None = None) -> BisectReport:
    """Breaking sets and a repair set between the good and bad configuration; a parent run, a child per probe."""
    opts, parsed = _replay_options(opts)
    uri = resolve_tracking_uri(opts.tracking_uri)
    good = load_endpoint(opts.good, flag="--good", tracking_uri=uri)
    bad = load_endpoint(opts.bad, flag="--bad", tracking_uri=uri)
    spec = deployment(good, bad, spec_path=opts.spec)
    judge = _judge(opts, spec)
    for name in opts.overrides:
        check_setting_name(name, "--set")
    base = {**good.settings, **opts.overrides}
    bad_values = {**bad.settings, **opts.overrides}
    scrub = Scrubber(base, bad_values)
    say = (lambda m: progress(scrub(m))) if progress else None
    groups = [*(good.spec.groups if good.spec else []), *(bad.spec.groups if bad.spec else [])]
    standalone = judge.metric == STANDALONE_METRIC
    with (nullcontext() if standalone else engine_factory(spec)) as engine:
        exact = _deterministic_judge(judge, engine)
        if exact and say:
            say(exact)
        planner = make_planner(spec, None if engine is None else engine.plan)
        changes = list_changes(base, bad_values, plan=planner, groups=groups)
        ignored = explain_no_changes(base, bad_values, changes=changes)
        if not changes:
            raise _no_changes(good, bad, ignored, "standalone" if engine is None else engine.name)
        log_path = opts.log_path or Path("mlruns") / "bisect" / f"bisect-{time.strftime('%Y%m%d-%H%M%S')}.log"
        inert = not_changes(base, bad_values, changes=changes)
        log = BisectLog(_log_ref(opts.good), _log_ref(opts.bad), judge.settings(), dict(opts.overrides), changes,
                        [c.name for c in inert], scrub=scrub)
        replayed: dict[ChangeSet, tuple[ProbeOutcome, str]] = {}
        if parsed is not None:
            replayed = _check_replay(parsed, changes, opts.replay, inert=inert)
            judge.restore(parsed.header.get("reference"), None if exact else parsed.header.get("noise"))
        tracking = Tracking.open(uri, bisect_experiment(spec.name), description=(
            f"bisect-eagle bisects of spec {spec.name!r}: which settings, changed from a good to a bad "
            "configuration, break it. The search's trials are in the experiment "
            f"{spec.name!r}."))
        parent = tracking.start_run(
            f"bisect {Path(good.label).stem} vs {Path(bad.label).stem}",
            tags={"role": "bisect", **deployment_tags(spec),
             NOTE: f"**Bisect running:** {good.label} (good) vs {bad.label} (bad)"},
            params={"good": good.label, "bad": bad.label, **{f"judge.{k}": str(v) for k, v in judge.settings().items()},
             "changes": json.dumps([c.name for c in changes])[:6000],
             "set": json.dumps(redact_mapping(opts.overrides))[:6000],
             **({"replay": str(opts.replay)} if opts.replay else {})})
        with tracking.ended_on_error(parent, "error"):
            announced = None if engine is None else Announced(engine, say)
            ctx = TrialContext(spec=_probe_spec(spec, judge), tracking=tracking, study=f"bisect-{parent[:8]}",
                               parent_run_id=parent, engine=announced)
            prober = Prober(ctx=ctx, base=base, changes=changes, judge=judge, planner=planner, log=log,
                            log_path=log_path, replayed=replayed, scrub=scrub, progress=say, inert=inert)
            result = find_culprits([c.name for c in changes], prober, inert=[c.name for c in inert], progress=say)
            promoted = [with_masks(base, bad_values, c, plan=planner, changes=[*changes, *inert])
                        for c in inert if c.name in result.promoted]
            changes = [*changes, *promoted]
            ignored = [n for n in ignored if n not in result.promoted]
            report = _report(result, prober, changes=changes, good=good, bad=bad, parent=parent, log_path=log_path)
            report.not_changes, report.scrub = ignored, scrub
            if exact:
                report.notes.append(exact)
            if ignored:
                report.notes.append(f"not changes (the engine runs both sides the same way, or they follow from the "
                                    f"other changes): {', '.join(ignored)}")
            body = report.to_json()
            tracking.log_texts(parent, {"bisect.log": log.text(), "result.json": json.dumps(body, indent=2)})
            name_probes(tracking, report)
            with tempfile.TemporaryDirectory(prefix="bisect-eagle-") as tmp:
                plot_probes(body["probes"], judge=body["judge"], out=Path(tmp) / "probes.png")
                tracking.log_files(parent, Path(tmp))
            tracking.log(parent, metrics={"probes": float(len(report.probes)), "live_trials": float(report.live_trials),
                                          "samples": float(report.samples), "probe_bound": float(report.probe_bound)},
                         tags={"outcome": report.status.value, NOTE: bisect_description(body, tracking.experiment_id),
                               "culprits": ",".join(c.name for c in report.culprits),
                               "repair_set": ",".join(report.repair or []),
                               "verified": str(report.verified).lower(),
                               "masked": ",".join(f"{c.name}<{side}:{'+'.join(by)}" for c in report.changes
                                                  for side, by in c.masked_by.items()),
                               **({"interactions": " | ".join(body["interactions"])}
                                  if body["interactions"] else {})})
            tracking.finish(parent, "FINISHED")
    return report


def _log_ref(text: str) -> str:
    """A spec as an absolute path (a log replays from any directory), a run id as it is."""
    return str(Path(text).resolve()) if Path(text).is_file() else text


def _check_replay(parsed: ParsedLog, changes: list[Change], path: Path, *,
                  inert: list[Change]) -> dict[ChangeSet, tuple[ProbeOutcome, str]]:
    names = {c.name for c in changes}
    logged = parsed.header.get("changes")
    if logged is not None and sorted(logged) != sorted(names):
        raise BadInput(f"{path}: header 'changes' lists {logged}, but the configurations now differ in "
                       f"{sorted(names)}; the specs changed since the log was written")
    known = names | {c.name for c in inert}  # a verification applies the not-changes too
    for _, applied, _ in parsed.marks:
        unknown = [a for a in applied if a not in known]
        if unknown:
            raise BadInput(f"{path}: a mark applies {unknown}, which is not one of the changes {sorted(names)}"
                           + (f" nor of the other differences {sorted(known - names)}" if known != names else ""))
    return {frozenset(applied): (outcome, note) for outcome, applied, note in parsed.marks}


def _report(result: Culprits, prober: Prober, *, changes: list[Change], good: Endpoint, bad: Endpoint, parent: str,
            log_path: Path) -> BisectReport:
    by_name = {c.name: c for c in changes}
    probes = []
    asked: collections.Counter[ChangeSet] = collections.Counter()
    for p in result.probes:
        config = frozenset(p.applied)
        rec = prober.record(config, asked[config])
        asked[config] += 1
        probes.append({"applied": list(p.applied), "outcome": p.outcome.name, "detail": prober.scrub(p.detail),
                       "cached": p.cached, "verifies": p.verifies, **rec.to_json()})
    culprits = [by_name[n] for n in result.culprits]
    judge = prober.judge
    verification = [{"check": v.check, "changes": list(v.changes), "applied": list(v.applied),
                     "expected": v.expected.name, "outcome": v.outcome.name, "ok": v.ok, "probe": v.probe,
                     "median": probes[v.probe - 1].get("median"), "detail": prober.scrub(v.detail)}
                    for v in result.verifications]
    status, notes = result.status, [prober.scrub(n) for n in result.notes]
    if status is BisectStatus.ISOLATED and result.repair is not None and not result.verified:  # never unverified
        status = BisectStatus.INTERACTION
        notes.append("the repair set was not measured GOOD on the bad configuration; the answer is not isolated")
    repair = None if result.repair is None else list(result.repair)
    return BisectReport(
        status=status, good=good.label, bad=bad.label,
        judge={**judge.settings(), "limit": judge.limit, "noise": judge.noise.to_json()},
        changes=changes, breaking=[list(c) for c in result.breaking], repair=repair, culprits=culprits,
        probes=probes, unresolved=[list(u) for u in result.unresolved], live_trials=prober.measured,
        samples=prober.samples, probe_bound=result.probe_bound, notes=notes, parent_run_id=parent,
        log=str(log_path), verification=verification, verified=result.verified,
        interactions=[prober.scrub(line) for line in interactions(changes, breaking=result.breaking,
                                                                  repair=result.repair, probes=probes)],
        promoted=list(result.promoted))


def interactions(changes: list[Change], *, breaking: list[tuple[str, ...]], repair: tuple[str, ...] | None,
                 probes: list[dict[str, Any]]) -> list[str]:
    """One line per answer that needs a masked change together with what masks it.

    Args:
        changes: the changes, with what masks each.
        breaking: the breaking sets.
        repair: the repair set (None: not established).
        probes: the probes as reported (to quote the measured value of reverting the masker alone).
    """
    by_name = {c.name: c for c in changes}
    searched = {c.name for c in changes}
    out = []

    def named(names: Sequence[str], side: Side) -> str:
        return ", ".join(f"{n}={by_name[n].values(side)}" for n in names)

    for c in changes:
        hiders = [m for m in c.masked_by.get("bad", ()) if repair is not None and m in repair]
        if hiders and repair is not None and c.name in repair:
            line = f"{named(hiders, 'bad')} hides {c.name} in the bad configuration: revert both"
            if len(hiders) > 1:
                line = line.replace("revert both", "revert all of them")
            alone = next((p for p in probes if set(p["applied"]) >= searched - set(hiders)
                          and not set(p["applied"]) & set(hiders) and p["outcome"] != "UNRESOLVED"), None)
            if alone is not None:
                value = "" if alone.get("median") is None else f", median {alone['median']:.4g}"
                line += f" (reverting {', '.join(hiders)} alone: {alone['outcome']}{value})"
            out.append(line)
        for cause in breaking:
            hidden_by = [m for m in c.masked_by.get("good", ()) if m in cause]
            if hidden_by and c.name in cause:
                out.append(f"{c.name} breaks the good configuration only together with {', '.join(hidden_by)} "
                           f"({named(hidden_by, 'good')} hides it there)")
    return out


def bisect_experiment(spec_name: str) -> str:
    """The experiment of a spec's bisects (apart from its search's trials)."""
    return f"{spec_name} / bisect"


class Announced:
    """An engine that says when each measurement starts and how long it took (a probe runs for minutes)."""

    def __init__(self, engine: Engine, say: Callable[[str], None] | None):
        self.engine, self.say, self.name = engine, say, engine.name
        self.deterministic_metrics = tuple(getattr(engine, "deterministic_metrics", ()))
        self.runs = 0

    def plan(self, settings):
        return self.engine.plan(settings)

    def run(self, plan):
        self.runs += 1
        if self.say:
            self.say(f"  measuring (run {self.runs} of the bisect) ...")
        t0 = time.monotonic()
        result = self.engine.run(plan)
        if self.say:
            self.say(f"  ... {'done' if result.ok else result.failure_class} in {time.monotonic() - t0:.0f} s")
        return result


def name_probes(tracking: Tracking, report: BisectReport) -> None:
    """Name each probe's run after its number, the changes it applied and its outcome."""
    for i, p in enumerate(report.probes, 1):
        if p.get("child_run_id"):
            applied = "+" + ",".join(p["applied"]) if p["applied"] else "good config"
            tracking.rename(p["child_run_id"], f"probe {i:02d} {applied}: {p['outcome']}")
            tracking.log(p["child_run_id"], tags={"role": "bisect-probe", "probe": str(i)})


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value).replace("|", "/")


def bisect_description(body: dict[str, Any], experiment_id: str) -> str:
    """The bisect parent run's markdown: the culprits, the judge, and the probes as evidence (with run links)."""
    j = body["judge"]
    lines = [f"## Bisect: {body['status']}", "", f"Good: `{body['good']}`; bad: `{body['bad']}`.", ""]
    if body["breaking_sets"]:
        lines.append("**Breaking sets** (each, applied to the good configuration, breaks it):")
        lines += [f"- {' + '.join(f'`{n}`' for n in b)}" for b in body["breaking_sets"]]
    else:
        lines.append("No breaking set found.")
    if body["repair_set"] is not None:
        lines += ["", "**Repair set** (reverted from the bad configuration, repairs it): "
                  + (" + ".join(f"`{n}`" for n in body["repair_set"]) or "none")]
    masked = [(c["name"], side, by) for c in body["changes"] for side, by in c.get("masked_by", {}).items()]
    if masked:
        lines += ["", "**Masked changes** (inert alone at one end, hidden there by other settings):"]
        lines += [f"- `{n}`: hidden in the {side} configuration by "
                  + (" + ".join(f"`{b}`" for b in by) or "a combination") for n, side, by in masked]
    for line in body.get("interactions", []):
        lines += ["", f"**Interaction:** {line}"]
    if body.get("verification"):
        lines += ["", "**Verification** (" + ("every answer held" if body.get("verified") else "NOT verified") + "):"]
        for v in body["verification"]:
            what = ("applied to the good configuration" if v["check"] == "breaking"
                    else "reverted from the bad configuration")
            lines.append(f"- {v['check']} set {' + '.join(f'`{n}`' for n in v['changes']) or 'none'} {what}: "
                         f"{v['outcome']} (expected {v['expected']}; probe {v['probe']}, median {_cell(v['median'])})")
    limit = "-" if j.get("limit") is None else f"{j['limit']:.4g}"
    lines += ["", f"Judged by `{j['metric']}` against the limit {limit} (confidence {j['confidence']:g}).", "",
              "| probe | changes applied | outcome | median | samples | run |", "|---|---|---|---|---|---|"]
    for i, p in enumerate(body["probes"], 1):
        run = p.get("child_run_id") or p.get("run_id")
        link = f"[{run[:8]}](#/experiments/{experiment_id}/runs/{run})" if run else "-"
        verifies = f" (verifies the {p['verifies']} set)" if p.get("verifies") else ""
        lines.append(f"| {i}{verifies} | {', '.join(p['applied']) or '(good config)'} | {p['outcome']} | "
                     f"{_cell(p.get('median'))} | {len(p.get('samples') or [])} | {link} |")
    for note in body["notes"]:
        lines += ["", f"Note: {note}"]
    return "\n".join(lines)
