"""``run_bisect``: endpoints -> the engine's plans -> the changes -> probes -> a report, one MLflow
parent run.

The report answers two questions separately (see :mod:`~bisect_eagle.bisect.ddmin`):

- ``breaking_sets``: sets of changes whose *application to the good configuration* breaks it (each
  1-minimal: without any one of its changes it no longer breaks it);
- ``repair_set``: a set of changes whose *removal from the bad configuration* repairs it (1-minimal:
  put any one back and it fails again).

They differ when changes interact: two changes that fail only together are one breaking set of two,
and reverting either one repairs the bad configuration.

A change may be *masked*: inert at one end, hidden by another setting there (a wrong wiring is
unused while the bad configuration says ``speculative_algorithm: EAGLE``; see
:mod:`~bisect_eagle.bisect.changes`). The report says, per change, what masks it, and in one line
when a repair needs a masked change and its masker together. Every answer is verified by a probe
before it is reported as ``isolated``: each breaking set applied to the good configuration judged
BAD, the repair set reverted from the bad configuration as it is (its not-changes kept) judged GOOD
(``verification`` in the report, per change and in all). A failed verification is followed (a
not-change that matters becomes a change) or reported as ``interaction``.

Its runs live in their own experiment (``<spec name> / bisect``), apart from the search's trials: a
parent run whose description states the breaking sets, the repair set and the probe table, with a
plot of the probes against the limit, and whose params hold each change's good and bad value
(``change.<setting>.good`` / ``.bad``); a child per probe, named ``probe NN +changes: OUTCOME``.

Nothing secret is written or printed: change values come from the plans (redacted), ``--set`` values
are redacted, and every text (log, ``result.json``, the report, progress lines) is scrubbed of the
secret values of both configurations and of this process's environment.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_eagle.bisect.changes import (
    Change,
    describe_changes,
    explain_no_changes,
    list_changes,
    not_change_reasons,
    not_changes,
    with_masks,
)
from bisect_eagle.bisect.culprits import expected_probes, find_culprits
from bisect_eagle.bisect.ddmin import BisectProgress, BisectStatus, ChangeSet, ProbeOutcome
from bisect_eagle.bisect.endpoints import Endpoint, deployment, load_endpoint
from bisect_eagle.bisect.judge import LIVE_METRICS, MAX_LAUNCHES, STANDALONE_METRIC, Judge
from bisect_eagle.bisect.log import BisectLog, ParsedLog, change_params, parse_log
from bisect_eagle.bisect.posterior import BASE_PRIOR, change_priors
from bisect_eagle.bisect.prober import Prober, make_planner
from bisect_eagle.bisect.report import (
    BisectReport,
    _report,
    bisect_description,
    name_probes,
    plan_line,
)
from bisect_eagle.bisect.sides import find_sides
from bisect_eagle.engines import make_engine
from bisect_eagle.engines.base import Engine, TrialResult
from bisect_eagle.errors import BadInput
from bisect_eagle.report.study import plot_probes
from bisect_eagle.spec.schema import Spec, check_setting_name, with_overrides
from bisect_eagle.stats import deterministic
from bisect_eagle.tracking.redact import Scrubber, is_hidden, redact_mapping
from bisect_eagle.tracking.runs import NOTE, Tracking
from bisect_eagle.tracking.stores import check_writable, store_lock
from bisect_eagle.tracking.uris import resolve_tracking_uri
from bisect_eagle.trials.context import TrialContext
from bisect_eagle.trials.record import deployment_tags


@dataclass
class BisectOptions:
    """What the command line asks for."""

    good: str | None = None
    bad: str | None = None
    spec: Path | None = None
    metric: str | None = None  # default: the spec's criterion metric
    ratio: float = 0.9
    threshold: float | None = None
    # 1 − the chance of any false verdict (so of any false culprit) in the whole bisect
    confidence: float = 0.95
    # first samples of each endpoint; default: max(3, the spec's search.repeats)
    repeats: int | None = None
    max_samples: int = 8  # sample budget (launches) of a probe (an endpoint's is twice that)
    # bisect.max_launches: the launch budget (and its looks: judge.comparisons)
    max_launches: int = MAX_LAUNCHES
    # probe each breaking set with acceptance pinned: acceptance or cost (bisect/sides.py)
    sides: bool = True
    # settings forced in every probe (e.g. fewer prompts)
    overrides: dict[str, Any] = field(default_factory=dict)
    tracking_uri: str | None = None
    log_path: Path | None = None
    replay: Path | None = None


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
    hidden = [k for k, v in overrides.items() if is_hidden(v)]
    if hidden:
        raise BadInput(
            f"{opts.replay}: the log hides the value of {', '.join(hidden)}; give it again with "
            f"--set {hidden[0]}=VALUE"
        )
    merged = BisectOptions(
        good=parsed.header["good"],
        bad=parsed.header["bad"],
        spec=opts.spec,
        metric=judge.get("metric"),
        ratio=float(judge.get("ratio", opts.ratio)),
        threshold=judge.get("threshold"),
        confidence=float(judge.get("confidence", opts.confidence)),
        repeats=judge.get("repeats"),
        max_samples=int(judge.get("max_samples", opts.max_samples)),
        max_launches=int(judge.get("comparisons", opts.max_launches)),
        overrides=overrides,
        tracking_uri=opts.tracking_uri,
        log_path=opts.log_path,
        replay=opts.replay,
    )
    return merged, parsed


def _judge(opts: BisectOptions, spec: Spec) -> Judge:
    metric = opts.metric or spec.criterion.metric
    if metric not in (*LIVE_METRICS, STANDALONE_METRIC):
        raise BadInput(
            f"--metric {metric!r}: expected one of {', '.join((*LIVE_METRICS, STANDALONE_METRIC))}"
        )
    if opts.ratio <= 0:
        raise BadInput(f"--ratio must be > 0, got {opts.ratio}")
    if not 0 < opts.confidence < 1:
        raise BadInput(f"--confidence must be between 0 and 1, got {opts.confidence}")
    if opts.max_samples < 1:
        raise BadInput(f"--max-samples must be >= 1, got {opts.max_samples}")
    if opts.max_launches < 1:
        raise BadInput(f"--max-launches must be >= 1, got {opts.max_launches}")
    repeats = opts.repeats if opts.repeats is not None else max(3, spec.search.repeats)
    if repeats < 1:
        raise BadInput(f"--repeats must be >= 1, got {repeats}")
    if metric == STANDALONE_METRIC:  # deterministic: one sample each, the limit alone decides
        return Judge(
            metric,
            opts.ratio,
            opts.threshold,
            opts.confidence,
            1,
            1,
            1,
            comparisons=opts.max_launches,
        )
    return Judge(
        metric,
        opts.ratio,
        opts.threshold,
        opts.confidence,
        repeats,
        opts.max_samples,
        max(repeats, 2 * opts.max_samples),
        comparisons=opts.max_launches,
    )


def _deterministic_judge(judge: Judge, engine: Engine | None) -> str | None:
    """One sample per endpoint and per probe when ``engine`` declares the judge's metric
    deterministic (there is no noise to estimate: the limit alone decides); why, for the progress
    output and the report, else None."""
    if (
        engine is None
        or judge.metric == STANDALONE_METRIC
        or not deterministic(engine, judge.metric)
    ):
        return None
    judge.repeats = judge.max_samples = judge.endpoint_samples = 1
    return (
        f"{judge.metric} is deterministic on the {engine.name} engine (greedy decoding): one "
        "sample per endpoint and per probe, no noise estimate"
    )


def _probe_spec(spec: Spec, judge: Judge) -> Spec:
    """The deployment spec with the judge's metric and one run per trial (the prober takes more
    samples)."""
    if judge.metric == STANDALONE_METRIC:
        return spec
    return spec.model_copy(
        update={
            "criterion": spec.criterion.model_copy(update={"metric": judge.metric}),
            "search": spec.search.model_copy(update={"repeats": 1, "prune_below": None}),
        }
    )


def _no_changes(good: Endpoint, bad: Endpoint, ignored: list[str], engine: str) -> BadInput:
    if not ignored:
        return BadInput(
            f"{good.label} and {bad.label} have the same settings (after --set); nothing to bisect"
        )
    return BadInput(
        f"{good.label} and {bad.label} plan the same trial on the {engine} engine: "
        f"{', '.join(ignored)} differ as requested, but the engine ignores them or they equal its "
        "defaults; nothing to bisect"
    )


def run_bisect(
    opts: BisectOptions,
    *,
    engine_factory: Callable[[Spec], Engine] = make_engine,
    progress: BisectProgress | None = None,
) -> BisectReport:
    """Breaking sets and a repair set between the good and bad configuration; a parent run, a child
    per probe.

    Once the inputs are checked, the tracking store is held until the bisect ends
    (:func:`~bisect_eagle.tracking.stores.store_lock`: a local store another measuring command
    holds is :class:`~bisect_eagle.tracking.stores.StoreBusy`), and the runs that dead processes of
    this host left RUNNING in the bisect experiment are ended KILLED (:meth:`Tracking.end_orphans`).

    Args:
        opts: what the command line asks for: the endpoints (spec files or MLflow run ids) or a log
            to replay, the judge's metric, ratio, confidence and sample budgets, the launch budget,
            ``--set`` overrides, the store and the log path.
        engine_factory: builds the engine of the deployment spec (tests pass a stand-in); not called
            for the standalone metric.
        progress: called with each progress line (secret values scrubbed); None: silent.

    Returns:
        The report: status, changes, breaking and repair sets with their verification, every probe,
        the cost in launches, the parent run and the log's path.

    Raises:
        BadInput: bad options (no endpoints, a metric or budget out of range, an unknown ``--set``
            name), endpoints that cannot be read, or endpoints that plan the same trial.
        StoreBusy: another measuring command holds the local store.
    """
    with contextlib.ExitStack() as held:
        return _run_bisect(opts, engine_factory=engine_factory, progress=progress, held=held)


def _run_bisect(
    opts: BisectOptions,
    *,
    engine_factory: Callable[[Spec], Engine],
    progress: BisectProgress | None,
    held: contextlib.ExitStack,
) -> BisectReport:
    """:func:`run_bisect`, its store lock entered on ``held``."""
    opts, parsed = _replay_options(opts)
    uri = resolve_tracking_uri(opts.tracking_uri)
    # before anything starts or is written
    check_writable(uri, what="the tracking store", flag="--tracking-uri")
    good = load_endpoint(opts.good, flag="--good", tracking_uri=uri)
    bad = load_endpoint(opts.bad, flag="--bad", tracking_uri=uri)
    spec = deployment(good, bad, spec_path=opts.spec)
    judge = _judge(opts, spec)
    for name in opts.overrides:
        check_setting_name(name, "--set")
    # either spelling of adaptive replaces the other
    base = with_overrides(good.settings, opts.overrides)
    bad_values = with_overrides(bad.settings, opts.overrides)
    scrub = Scrubber(base, bad_values)
    say = (lambda m: progress(scrub(m))) if progress else None
    groups = [*(good.spec.groups if good.spec else []), *(bad.spec.groups if bad.spec else [])]
    standalone = judge.metric == STANDALONE_METRIC
    with nullcontext() if standalone else engine_factory(spec) as engine:
        exact = _deterministic_judge(judge, engine)
        if exact and say:
            say(exact)
        planner = make_planner(spec, None if engine is None else engine.plan)
        changes = list_changes(base, bad_values, plan=planner, groups=groups)
        ignored = explain_no_changes(base, bad_values, changes=changes)
        if not changes:
            raise _no_changes(good, bad, ignored, "standalone" if engine is None else engine.name)
        log_path = (
            opts.log_path
            or Path("mlruns") / "bisect" / f"bisect-{time.strftime('%Y%m%d-%H%M%S')}.log"
        )
        inert = not_changes(base, bad_values, changes=changes)
        if say:  # what it will bisect, and what not and why, before the first probe
            for line in describe_changes(
                changes, not_change_reasons(base, bad_values, changes=changes, plan=planner)
            ):
                say(line)
        log = BisectLog(
            _log_ref(opts.good),
            _log_ref(opts.bad),
            judge.settings(),
            dict(opts.overrides),
            changes,
            [c.name for c in inert],
            scrub=scrub,
        )
        replayed: dict[ChangeSet, tuple[ProbeOutcome, str]] = {}
        if parsed is not None:
            replayed = _check_replay(parsed, changes, opts.replay, inert=inert)
            judge.restore(
                parsed.header.get("reference"), None if exact else parsed.header.get("noise")
            )
        held.enter_context(store_lock(uri))
        tracking = Tracking.open(
            uri,
            bisect_experiment(spec.name),
            description=(
                f"bisect-eagle bisects of spec {spec.name!r}: which settings, changed from a good "
                "to a bad configuration, break it. The search's trials are in the experiment "
                f"{spec.name!r}."
            ),
        )
        ended = tracking.end_orphans(
            detail="the bisect running this was killed (its process is gone)"
        )
        if ended and say:
            runs = "1 run" if len(ended) == 1 else f"{len(ended)} runs"
            say(f"ended {runs} a killed bisect left RUNNING in this experiment: KILLED now")
        parent = tracking.start_run(
            f"bisect {Path(good.label).stem} vs {Path(bad.label).stem}",
            tags={
                "role": "bisect",
                **deployment_tags(spec),
                NOTE: f"**Bisect running:** {good.label} (good) vs {bad.label} (bad)",
            },
            params={
                "good": good.label,
                "bad": bad.label,
                **{f"judge.{k}": str(v) for k, v in judge.settings().items()},
                "changes": json.dumps([c.name for c in changes])[:6000],
                "set": json.dumps(redact_mapping(opts.overrides))[:6000],
                **({"replay": str(opts.replay)} if opts.replay else {}),
            },
        )
        with tracking.run_guard(parent, detail_tag="error"):
            _log_change_values(tracking, parent, changes, scrub)
            announced = None if engine is None else Announced(engine, say)
            ctx = TrialContext(
                spec=_probe_spec(spec, judge),
                tracking=tracking,
                study=f"bisect-{parent[:8]}",
                parent_run_id=parent,
                engine=announced,
            )
            prober = Prober(
                ctx=ctx,
                base=base,
                changes=changes,
                judge=judge,
                planner=planner,
                log=log,
                log_path=log_path,
                replayed=replayed,
                scrub=scrub,
                progress=say,
                inert=inert,
                max_launches=None if standalone else opts.max_launches,
            )
            flagged, doctor_note = _flagged(bad, changes)
            priors = change_priors(
                [c.name for c in [*changes, *inert]],
                [*flagged, *(c.name for c in changes if c.masked_by)],
            )
            expected = (
                0
                if standalone
                else (
                    expected_probes(len(changes), sum(p > BASE_PRIOR for p in priors.values()))
                    + 2 * (judge.repeats - 1)
                )
            )  # the endpoints' repeats; each probe about one launch
            tracking.log(
                parent,
                params={"bisect.max_launches": str(opts.max_launches)},
                metrics={"expected_launches": float(expected)},
            )
            if say:
                say(
                    plan_line(
                        judge,
                        expected=expected,
                        max_launches=opts.max_launches,
                        standalone=standalone,
                    )
                )
            result = find_culprits(
                [c.name for c in changes],
                prober,
                inert=[c.name for c in inert],
                progress=say,
                masked={c.name: c.masked_by["bad"] for c in changes if "bad" in c.masked_by},
                spent=prober.spent,
            )
            sides = (
                find_sides(prober, result.breaking)
                if opts.sides
                and judge.metric in LIVE_METRICS
                and result.status in (BisectStatus.ISOLATED, BisectStatus.PARTIAL)
                else []
            )
            promoted = [
                with_masks(base, bad_values, c, plan=planner, changes=[*changes, *inert])
                for c in inert
                if c.name in result.promoted
            ]
            changes = [*changes, *promoted]
            _log_change_values(tracking, parent, promoted, scrub)
            ignored = [n for n in ignored if n not in result.promoted]
            report = _report(
                result,
                prober,
                changes=changes,
                good=good,
                bad=bad,
                parent=parent,
                log_path=log_path,
                priors=priors,
                expected=expected,
                max_launches=opts.max_launches,
                sides=sides,
            )
            report.not_changes, report.scrub = ignored, scrub
            report.experiment, report.tracking_uri = bisect_experiment(spec.name), uri
            report.notes += [n for n in (doctor_note,) if n]
            if exact:
                report.notes.append(exact)
            if ignored:
                report.notes.append(
                    "not changes (the engine runs both sides the same way, or they follow from "
                    f"the other changes): {', '.join(ignored)}"
                )
            body = report.to_json()
            tracking.log_texts(
                parent, {"bisect.log": log.text(), "result.json": json.dumps(body, indent=2)}
            )
            name_probes(tracking, report)
            with tempfile.TemporaryDirectory(prefix="bisect-eagle-") as tmp:
                plot_probes(body["probes"], judge=body["judge"], out=Path(tmp) / "probes.png")
                tracking.log_files(parent, Path(tmp))
            tracking.log(
                parent,
                metrics={
                    "probes": float(len(report.probes)),
                    "live_trials": float(report.live_trials),
                    "samples": float(report.samples),
                    "probe_bound": float(report.probe_bound),
                    "launches": float(report.launches),
                    "looks": float(judge.looks),
                    "level_per_look": judge.level,
                    "familywise_error": 1 - judge.confidence,
                    **{
                        f"breaking_set_{i}_probability": s["probability"]
                        for i, s in enumerate(body["sets"], 1)
                    },
                },
                tags={
                    "outcome": report.status.value,
                    NOTE: bisect_description(body, tracking.experiment_id),
                    **{
                        f"breaking_set_{i}": " + ".join(s["changes"])
                        for i, s in enumerate(body["sets"], 1)
                    },
                    **{
                        f"breaking_set_{i}_side": s["side"]
                        for i, s in enumerate(body["sets"], 1)
                        if "side" in s
                    },
                    "culprits": ",".join(c.name for c in report.culprits),
                    "repair_set": ",".join(report.repair or []),
                    "verified": str(report.verified).lower(),
                    "masked": ",".join(
                        f"{c.name}<{side}:{'+'.join(by)}"
                        for c in report.changes
                        for side, by in c.masked_by.items()
                    ),
                    **(
                        {"interactions": " | ".join(body["interactions"])}
                        if body["interactions"]
                        else {}
                    ),
                },
            )
            tracking.finish(parent, "FINISHED")
    return report


def _flagged(bad: Endpoint, changes: list[Change]) -> tuple[list[str], str]:
    """The changes whose settings ``doctor`` flags in the bad spec (their prior goes up), and a note
    when the doctor could not read the spec (a run id has no spec: nothing flagged, no note)."""
    if bad.spec is None:
        return [], ""
    from bisect_eagle.doctor import diagnose

    try:
        findings = diagnose(bad.spec)
    except (BadInput, OSError, ValueError) as e:
        return (
            [],
            f"doctor could not check {bad.label} "
            f"({str(e).splitlines()[0] if str(e) else type(e).__name__}): every change has the "
            "same prior",
        )
    where = [f.where for f in findings if f.severity in ("error", "warning")]
    return [
        c.name
        for c in changes
        if any(w.endswith(f"engine.settings.{n}") for n in c.good for w in where)
    ], ""


def _log_change_values(
    tracking: Tracking, run_id: str, changes: list[Change], scrub: Scrubber
) -> None:
    """The changes' good and bad values as params of the bisect's run, in batches MLflow takes."""
    from mlflow.utils.validation import MAX_PARAMS_TAGS_PER_BATCH as BATCH

    params = change_params(changes, scrub)
    keys = list(params)
    for i in range(0, len(keys), BATCH):
        tracking.log(run_id, params={k: params[k] for k in keys[i : i + BATCH]})


def _log_ref(text: str) -> str:
    """A spec as an absolute path (a log replays from any directory), a run id as it is."""
    return str(Path(text).resolve()) if Path(text).is_file() else text


def _check_replay(
    parsed: ParsedLog, changes: list[Change], path: Path, *, inert: list[Change]
) -> dict[ChangeSet, tuple[ProbeOutcome, str]]:
    names = {c.name for c in changes}
    logged = parsed.header.get("changes")
    if logged is not None and sorted(logged) != sorted(names):
        raise BadInput(
            f"{path}: header 'changes' lists {logged}, but the configurations now differ in "
            f"{sorted(names)}; the specs changed since the log was written"
        )
    known = names | {c.name for c in inert}  # a verification applies the not-changes too
    for _, applied, _ in parsed.marks:
        unknown = [a for a in applied if a not in known]
        if unknown:
            raise BadInput(
                f"{path}: a mark applies {unknown}, which is not one of the changes {sorted(names)}"
                + (
                    f" nor of the other differences {sorted(known - names)}"
                    if known != names
                    else ""
                )
            )
    return {frozenset(applied): (outcome, note) for outcome, applied, note in parsed.marks}


def bisect_experiment(spec_name: str) -> str:
    """The experiment of a spec's bisects (apart from its search's trials)."""
    return f"{spec_name} / bisect"


class Announced:
    """An engine that says when each launch starts and how long it took (a probe runs for minutes),
    and keeps the last result (the prober reads its rounds and per-request throughput)."""

    def __init__(self, engine: Engine, say: Callable[[str], None] | None):
        self.engine, self.say, self.name = engine, say, engine.name
        self.deterministic_metrics = tuple(getattr(engine, "deterministic_metrics", ()))
        self.rounds_share_launch = bool(getattr(engine, "rounds_share_launch", False))
        self.runs = 0
        self.last: TrialResult | None = None

    def plan(self, settings):
        """The wrapped engine's plan (:meth:`Engine.plan <bisect_eagle.engines.base.Engine.plan>`).

        Args:
            settings: the probe's live settings.

        Returns:
            The wrapped engine's trial plan.
        """
        return self.engine.plan(settings)

    def run(self, plan):
        """One launch of one benchmark round, announced (:meth:`run_rounds` with ``rounds=1``).

        Args:
            plan: a plan of :meth:`plan`.

        Returns:
            The wrapped engine's trial result, also kept as :attr:`last`.
        """
        return self.run_rounds(plan, rounds=1)

    def run_rounds(self, plan, *, rounds: int):
        """One launch of ``rounds`` benchmark rounds, announced before and timed after.

        Args:
            plan: a plan of :meth:`plan`.
            rounds: benchmark rounds on the one launch (1: the wrapped engine's ``run``).

        Returns:
            The wrapped engine's trial result, also kept as :attr:`last`.
        """
        self.runs += 1
        if self.say:
            each = f", {rounds} benchmark rounds" if rounds > 1 else ""
            self.say(f"  measuring (launch {self.runs} of the bisect{each}) ...")
        t0 = time.monotonic()
        result = (
            self.engine.run(plan) if rounds == 1 else self.engine.run_rounds(plan, rounds=rounds)
        )
        if self.say:
            self.say(
                f"  ... {'done' if result.ok else result.failure_class} in "
                f"{time.monotonic() - t0:.0f} s"
            )
        self.last = result
        return result
