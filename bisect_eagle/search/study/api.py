"""The two ways into a study: ``run_study`` creates (or resumes) one and runs it all; ``join_study``
adds a worker.

``run_study``: stage 1, the baseline, then the stage-2 loop; the parent run ends FINISHED with the
outcome, KILLED on Ctrl-C or SIGTERM, FAILED on an error. ``join_study`` waits until the study has
its baseline, then shares the budget, the claims and the stop condition; the parent run stays with
the process that created it.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from bisect_eagle.engines import default_log_dir
from bisect_eagle.engines.base import Engine
from bisect_eagle.errors import BadInput
from bisect_eagle.poll import wait_until
from bisect_eagle.search.space import SearchSpace
from bisect_eagle.search.study.binding import bind, check_bound
from bisect_eagle.search.study.claims import Claims
from bisect_eagle.search.study.guide import ModelGuide, cold_prior
from bisect_eagle.search.study.loop import StudyRun
from bisect_eagle.search.study.model_summary import summarize
from bisect_eagle.search.study.outcome import StudyOutcome
from bisect_eagle.search.study.parent import finish_parent_run, start_parent_run
from bisect_eagle.search.study.resume import Liveness, reap_dead_servers, reap_dead_trials
from bisect_eagle.search.study.sampler import live_space, make_sampler, plan_space, space_json
from bisect_eagle.search.study.state import StudyProgress
from bisect_eagle.search.study.storage import latest_study, load_study, open_storage
from bisect_eagle.spec.schema import Spec
from bisect_eagle.tracking.owner import owner_id
from bisect_eagle.tracking.redact import redact_url
from bisect_eagle.tracking.runs import Tracking
from bisect_eagle.tracking.stores import check_stores, check_writable, first_open_lock, store_lock
from bisect_eagle.trials.context import TrialContext
from bisect_eagle.trials.record import settings_of_run
from bisect_eagle.trials.standalone import Scorer

WORKER_WAIT_S = 1800.0  # how long a worker waits for the study's stage 1 and baseline
WORKER_POLL_S = 2.0  # at most this long between two looks at the study while waiting

EngineFactory = Callable[[Spec], Engine]


def _no_progress(p: StudyProgress) -> None:
    return None


@dataclass(kw_only=True)
class Options:
    """Where a study lives and how much this invocation may spend."""

    storage: str  # the Optuna storage URL (storage.resolve_storage)
    tracking_uri: str | None  # None for a worker: the study's own
    study_name: str | None = None
    resume: bool = False
    max_live_trials: int | None = None  # overrides the spec's search.max_live_trials
    max_wall_s: float | None = None  # overrides the spec's search.max_wall_s
    max_launches: int | None = None  # overrides the spec's search.max_launches
    # where the engine records its servers (default engines.default_log_dir(spec))
    log_dir: Path | None = None
    progress: Callable[[StudyProgress], None] = field(default=_no_progress)
    # stage 1's scorer of the spec's wirings (default trials.standalone.Scorer: the draft on the
    # dump); another one scores a simulated deployment's stage 1, as the engine factory runs its
    # live trials
    scorer_factory: Callable[[Spec], Scorer] = field(default=Scorer)


def run_study(spec: Spec, *, options: Options, engine_factory: EngineFactory) -> StudyOutcome:
    """Create (or with ``resume`` continue) a study: stage 1, baseline, stage 2, then close the
    parent run.

    Unreachable stores fail first, within seconds
    (:func:`bisect_eagle.tracking.stores.check_stores`); a local tracking store another measuring
    command holds is :class:`~bisect_eagle.tracking.stores.StoreBusy`
    (:func:`~bisect_eagle.tracking.stores.store_lock`, held until the study ends). The runs that
    dead processes of this host left RUNNING in the spec's experiment are ended KILLED first
    (:meth:`Tracking.end_orphans`). ``resume`` then reaps the recorded servers of dead controllers
    on this host and closes their runs KILLED (:mod:`.resume`), then fails and releases what dead
    processes of this host left running.

    Args:
        spec: the study's spec.
        options: the command's choices (stores, study name, budgets overridden, ``resume``, progress
            callback).
        engine_factory: makes the study's engine from the spec.

    Returns:
        The study's outcome (what ``run --json`` prints).

    Raises:
        ValueError: ``options`` has no tracking URI.
        BadInput: an unreachable or unwritable store, a space the engine refuses whole, a server
            this machine cannot start.
        StoreBusy: another measuring command holds the local tracking store.
    """
    opts = options
    if opts.tracking_uri is None:
        raise ValueError("run_study needs a tracking URI (see tracking.resolve_tracking_uri)")
    check_stores(storage=opts.storage, tracking_uri=opts.tracking_uri)
    check_writable(opts.storage, what="the study store", flag="--storage")
    check_writable(opts.tracking_uri, what="the tracking store", flag="--tracking-uri")
    # before any store is written (the lock's file included): a space the engine refuses whole is
    # bad input, the rest is said; a server this machine cannot start is bad input
    planned = [] if opts.resume else check_refusals(spec, engine_factory)
    check_launchable(spec, engine_factory)
    with store_lock(opts.tracking_uri):
        return _run_study(spec, opts, engine_factory, planned=planned)


def _run_study(
    spec: Spec, opts: Options, engine_factory: EngineFactory, *, planned: list[str]
) -> StudyOutcome:
    """:func:`run_study` once its inputs are checked and its store is held (``planned``: the
    refusals' notes)."""
    storage = open_storage(opts.storage)
    with first_open_lock(opts.tracking_uri):
        tracking = Tracking.open(opts.tracking_uri, spec.name)
    ended = tracking.end_orphans(detail="the process running this was killed (its process is gone)")
    runs = "1 run" if len(ended) == 1 else f"{len(ended)} runs"
    notes = (
        [f"ended {runs} a killed process left RUNNING in this experiment: KILLED now"]
        if ended
        else []
    )
    if opts.resume:
        name = opts.study_name or spec.storage.study_name or latest_study(storage, spec)
        if name is None:
            raise BadInput(
                f"--resume: no study of spec {spec.name!r} in {redact_url(opts.storage)}"
            )
        study = load_study(storage, name)
        check_bound(study, spec, what="--resume")
        parent = study.user_attrs.get("parent_run_id") or _unrecorded_parent(study, tracking)
        if parent is None:  # killed between creating the study and its parent run
            parent = _start_parent(study, tracking, spec=spec, opts=opts)
        else:
            notes += reap_dead_servers(
                opts.log_dir or default_log_dir(spec), tracking=tracking, parent_run_id=parent
            )
            tracking.log(parent, tags={"owner": owner_id()})  # this process's now
            tracking.reopen(parent)
    else:
        name = opts.study_name or spec.storage.study_name
        study = _create_study(
            storage,
            name=name or f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}",
            url=opts.storage,
            named=name is not None,
        )
        bind(study, spec)  # first: a start killed from here on is found and finished by --resume
        # experimental since Optuna 3.2; optuna-dashboard names the objective by it
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([spec.criterion.metric])
        name = study.study_name
        parent = _start_parent(study, tracking, spec=spec, opts=opts)
    # from here on, Ctrl-C or SIGTERM ends the parent run KILLED, its verdict's writing included
    with tracking.run_guard(parent, detail_tag="stop_reason"):
        claims = Claims(opts.storage, name)
        ctx = TrialContext(spec=spec, tracking=tracking, study=name, parent_run_id=parent)
        s = _study_run(spec, study=study, claims=claims, ctx=ctx, opts=opts)
        if opts.resume:
            notes += reap_dead_trials(study, claims=claims, tracking=tracking, parent_run_id=parent)
        for note in planned:
            s.emit("plan", note)
        for note in notes:
            s.emit("resume", note)
        with _liveness(storage, s) as live:
            out = _search(s, engine_factory, stage1=True)
        _show_reaped(s, live)
        finish_parent_run(tracking, out)
    study.set_user_attr(
        "outcome", {"target_reached": out.target_reached, "stop_reason": out.stop_reason}
    )
    return out


def check_refusals(spec: Spec, engine_factory: EngineFactory) -> list[str]:
    """The configs of the spec's space (its layer-id choices included; stage 1's wirings aside: the
    gate picks them) that the engine refuses, said before anything runs: one note per reason, of the
    whole space or of a seeded sample of a space too large to list (the note says which); every
    config of a listed space refused is :class:`BadInput`."""
    space = SearchSpace(dict(spec.space), spec.engine.settings, str(spec.source))
    with engine_factory(spec) as engine:
        found = plan_space(space, plan=engine.plan)
    found.check(engine.name, spec.source)
    return [
        f"the {engine.name} engine refuses {count} of {found.whole()}: {reason}"
        for reason, count in found.refused.items()
    ]


def check_launchable(spec: Spec, engine_factory: EngineFactory) -> None:
    """:class:`BadInput` naming the spec, its key and the fix when this machine cannot start the
    engine's trials (:meth:`~bisect_eagle.engines.base.Engine.check_launchable`), before anything is
    created."""
    with engine_factory(spec) as engine:
        try:
            engine.check_launchable()
        except BadInput as e:
            raise BadInput(f"{spec.source}: {e}") from None


def _unrecorded_parent(study: optuna.Study, tracking: Tracking) -> str | None:
    """The parent run of a start killed before the study recorded it (found by its tags), recorded
    now."""
    found = tracking.client.search_runs(
        [tracking.experiment_id],
        f"tags.role = 'study' AND tags.study = '{study.study_name}'",
        max_results=1,
    )
    if not found:
        return None
    parent = found[0].info.run_id
    for key, value in {
        "parent_run_id": parent,
        "tracking_uri": redact_url(tracking.uri),
        "experiment_id": tracking.experiment_id,
    }.items():
        study.set_user_attr(key, value)
    return parent


def _start_parent(study: optuna.Study, tracking: Tracking, *, spec: Spec, opts: Options) -> str:
    """The study's parent run, recorded on the study at once (with where its runs are)."""
    parent = start_parent_run(tracking, spec=spec, study=study.study_name, storage=opts.storage)
    for key, value in {
        "parent_run_id": parent,
        "tracking_uri": redact_url(opts.tracking_uri),
        "experiment_id": tracking.experiment_id,
    }.items():
        study.set_user_attr(key, value)
    return parent


def _create_study(
    storage: optuna.storages.RDBStorage, *, name: str, url: str, named: bool
) -> optuna.Study:
    """A new study ``name``; a default name taken by a concurrent ``run`` of the same spec gets a
    suffix."""
    for n in range(1, 100):
        candidate = name if n == 1 else f"{name}-{n}"
        taken = f"study {candidate!r} already exists in {redact_url(url)}"
        if candidate in optuna.get_all_study_names(storage):
            if named:
                raise BadInput(f"{taken}; continue it with --resume, or give another --study-name")
            continue
        try:
            return optuna.create_study(storage=storage, study_name=candidate, direction="maximize")
        except optuna.exceptions.DuplicatedStudyError:
            if named:
                raise BadInput(
                    f"{taken}: another `run` created it a moment ago; join it with `bisect-eagle "
                    f"worker --study-name {candidate}`, or give another --study-name"
                ) from None
    raise BadInput(
        f"study names {name!r} to {name}-99 are all taken in {redact_url(url)}; give --study-name"
    )


def _liveness(storage: optuna.storages.RDBStorage, s: StudyRun) -> Liveness:
    """The heartbeats of ``s``'s trials; each trial's first beat is recorded as it is asked."""
    live = Liveness(
        storage,
        study_name=s.name,
        owner=s.ctx.owner,
        claims=s.claims,
        tracking=s.ctx.tracking,
        parent_run_id=s.ctx.parent_run_id,
    )
    s.first_beat = live.beat_trial
    return live


def _show_reaped(s: StudyRun, live: Liveness) -> None:
    for note in live.notes:
        s.emit("resume", note)


def join_study(
    spec: Spec, *, options: Options, engine_factory: EngineFactory, wait_s: float = WORKER_WAIT_S
) -> StudyOutcome:
    """A worker: join a study another process created, wait for its stage 1 and baseline, then
    search.

    Args:
        spec: the study's spec (the same as its creator's).
        options: the command's choices (the creator's stores; ``study_name``, else the spec's, else
            the spec's latest study).
        engine_factory: makes this worker's engine from the spec.
        wait_s: how long to wait for the study to appear and for its baseline.

    Returns:
        The study's outcome as this worker ends it.

    Raises:
        BadInput: no such study in the store, or it did not appear or reach its baseline within
            ``wait_s``.
    """
    opts = options
    check_stores(storage=opts.storage, tracking_uri=opts.tracking_uri)
    storage = open_storage(opts.storage)
    name = opts.study_name or spec.storage.study_name or latest_study(storage, spec)
    if name is None:
        raise BadInput(
            f"worker: no study of spec {spec.name!r} in {redact_url(opts.storage)}; start one with "
            "`bisect-eagle run` first"
        )

    def recorded(study_name: str = name) -> bool:  # its `run` may be starting right now
        return (
            study_name in optuna.get_all_study_names(storage)
            and "parent_run_id" in load_study(storage, study_name).user_attrs
        )

    if not recorded() and not wait_until(
        recorded, timeout_s=wait_s, max_interval_s=WORKER_POLL_S, what=f"study {name!r}"
    ):
        raise BadInput(
            f"worker: no study {name!r} in {redact_url(opts.storage)} after {wait_s:g} s; start it "
            "with `bisect-eagle run` first"
        )
    study = load_study(storage, name)
    check_bound(study, spec, what="worker")
    attrs = study.user_attrs
    uri = opts.tracking_uri or attrs["tracking_uri"]
    if "***" in uri:
        raise BadInput(
            f"worker: study {name!r} logs to {uri}; give the full URI with --tracking-uri"
        )
    if opts.tracking_uri is None:
        check_stores(storage=None, tracking_uri=uri)
    with first_open_lock(uri):
        tracking = Tracking.open(uri, spec.name)
    ctx = TrialContext(
        spec=spec, tracking=tracking, study=name, parent_run_id=attrs["parent_run_id"]
    )
    # workers sample differently
    seed_offset = 1 + int(hashlib.sha256(ctx.owner.encode()).hexdigest()[:6], 16)
    s = _study_run(
        spec,
        study=study,
        claims=Claims(opts.storage, name),
        ctx=ctx,
        opts=opts,
        seed_offset=seed_offset,
    )
    if s.attr("target") is None:
        s.emit("waiting", "waiting for the study's stage 1 and baseline")

        def has_baseline() -> bool:
            s.study = load_study(storage, name)
            return s.attr("target") is not None

        if not wait_until(
            has_baseline,
            timeout_s=wait_s,
            max_interval_s=WORKER_POLL_S,
            what=f"the baseline of study {name!r}",
        ):
            raise BadInput(
                f"worker: study {name!r} has no baseline after {wait_s:g} s; is its `run` alive?"
            )
    with _liveness(storage, s) as live:
        out = _search(s, engine_factory, stage1=False)
    _show_reaped(s, live)
    return out


def _study_run(
    spec: Spec,
    *,
    study: optuna.Study,
    claims: Claims,
    ctx: TrialContext,
    opts: Options,
    seed_offset: int = 0,
) -> StudyRun:
    return StudyRun(
        spec=spec,
        study=study,
        claims=claims,
        ctx=ctx,
        storage_url=opts.storage,
        max_live_trials=opts.max_live_trials or spec.search.max_live_trials,
        max_wall_s=opts.max_wall_s or spec.search.max_wall_s,
        progress=opts.progress,
        max_launches=opts.max_launches or spec.search.max_launches,
        seed=spec.search.seed + seed_offset,
        scorer_factory=opts.scorer_factory,
    )


def _search(s: StudyRun, engine_factory: EngineFactory, *, stage1: bool) -> StudyOutcome:
    """Stage 1 (or the study's stored gate), the live space and sampler, the baseline, the loop; the
    outcome."""
    gate = s.stage1() if stage1 else s.attr("gate")
    s.ctx.wiring_accuracy = {tuple(sorted(v["layer_ids"])): v["accuracy"] for v in gate}
    if s.spec.standalone.wirings and not any(v["passed"] for v in gate):
        return s.outcome("no wiring passed the standalone gate", None)
    space = live_space(s.spec, gate)
    s.study.sampler = make_sampler(s.spec, space=space, seed=s.seed)
    if stage1:
        s.ctx.tracking.log_texts(s.ctx.parent_run_id, {"search_space.json": space_json(space)})
    with engine_factory(s.spec) as engine:
        s.ctx.engine = engine
        if s.spec.search.model.enabled:
            s.guide = ModelGuide(
                engine=engine,
                metric=s.spec.criterion.metric,
                optimism=s.spec.search.model.optimism,
                standalone_metric=s.spec.standalone.metric,
                prior=cold_prior(s.spec),
            )
            s.guide.learn_gate(gate)
        if stage1:
            s.baseline()
        else:
            s.load_baseline()
        s.emit("live", f"searching {len(space.params)} parameters with {s.spec.search.sampler}")
        reason = s.loop(space)
    out = s.outcome(reason, space)
    if stage1 and s.guide is not None:
        _log_model(s, out, space)
    s.emit("done", reason)
    return out


def _log_model(s: StudyRun, out: StudyOutcome, space: SearchSpace) -> None:
    """The model's error, skipped configs, adaptive reference and per-concurrency bests, on the
    parent run.

    A failure here never fails the finished search: it is reported as a progress line and a
    parent-run tag.
    """
    try:
        skipped = {
            t.user_attrs["fingerprint"]: {
                "params": space.decode(t.params),
                **t.user_attrs.get("predicted", {}),
            }
            for t in s.study.get_trials(deepcopy=False)
            if "skipped" in t.user_attrs
        }
        metrics, summary = summarize(
            s.guide,
            tracking=s.ctx.tracking,
            parent_run_id=s.ctx.parent_run_id,
            skipped=list(skipped.values()),
            listed=s.listed,
            best=out.best,
            adaptive=_adaptive_plan(s, out.best),
        )
        s.ctx.tracking.log(s.ctx.parent_run_id, metrics=metrics)
        s.ctx.tracking.log_texts(
            s.ctx.parent_run_id, {"model.json": json.dumps(summary, indent=2, default=str)}
        )
    except Exception as e:  # the search's answer stands without its model summary
        detail = " ".join(str(e).split())[:300] or type(e).__name__
        s.emit("done", f"model summary not logged: {detail}")
        s.ctx.tracking.log(s.ctx.parent_run_id, tags={"model_summary_error": detail})


def _adaptive_plan(s: StudyRun, best: dict | None) -> dict | None:
    """The engine's effective settings of the best config with SGLang's adaptive speculation, or
    None when the engine refuses it or SGLang turns it off (then there is no reference to draw)."""
    if not best or int(best["params"].get("num_steps") or 0) == 0:
        return None
    try:
        settings = settings_of_run(s.ctx.tracking, s.ctx.tracking.get_run(best["run_id"]))[0]
        plan = s.ctx.plan(settings.model_copy(update={"speculative_adaptive": True, "topk": 1}))
    except (BadInput, ValueError):
        return None
    return (
        plan.effective
        if plan.refusal is None and plan.effective.get("speculative_adaptive")
        else None
    )
