"""The staged search of one study: stage 1 gates wirings, stage 2 runs live trials with Optuna, with resume.

Storage: the Optuna study lives at a SQLAlchemy URL (default ``sqlite:///mlruns/optuna.db``; PostgreSQL for
several nodes). The same database holds a claims table: before a live trial runs, its fingerprint is
inserted under a unique constraint, so two workers never measure the same effective config; the loser of
the race waits for the winner's result and tells Optuna that value without running anything. Crashed
configs are told as PRUNED with an infeasibility constraint (TPE ignores FAIL trials and would propose them
again); interrupted trials are told FAIL and are measured again after ``--resume``.

Several nodes, one study (PostgreSQL): ``bisect-eagle run spec.yaml --storage postgresql://user@db/optuna
--tracking-uri http://mlflow-host:5000`` on one node creates the study, runs stage 1 and the baseline and
starts searching; ``bisect-eagle worker spec.yaml --storage <same URL>`` on any other node joins it (it
waits for stage 1, then shares the budget, the claims and the stop condition). Log to one ``mlflow server``
over HTTP from several nodes: a SQLite MLflow store is for one machine.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import sqlite3
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from bisect_eagle.engines.base import Engine
from bisect_eagle.errors import BadInput
from bisect_eagle.search.gate import Scorer, Verdict, apply_gate
from bisect_eagle.search.space import SearchSpace, encode
from bisect_eagle.spec import WIRING_SETTING, Param, Spec
from bisect_eagle.tracking import Tracking, environment_info, owner_alive, redact
from bisect_eagle.trials import (
    TrialContext,
    TrialRecord,
    effective_of,
    find_cached,
    run_live_trial,
    run_standalone_trial,
)

DUPLICATE_LIMIT = 200  # consecutive proposals of measured configs before the search gives up
WORKER_WAIT_S = 1800.0


def default_storage(cwd: Path | None = None) -> str:
    return f"sqlite:///{((cwd or Path.cwd()) / 'mlruns' / 'optuna.db').resolve()}"


def resolve_storage(flag: str | None, spec: Spec) -> str:
    """--storage, else the spec's storage.optuna, else ``sqlite:///<cwd>/mlruns/optuna.db``."""
    return flag or spec.storage.optuna or default_storage()


def engine_kwargs(url: str) -> dict[str, Any]:
    """SQLAlchemy engine options: a SQLite file gets its folder, WAL journaling and a 60 s lock wait."""
    if not url.startswith("sqlite:///"):
        return {}
    path = Path(url[len("sqlite:///"):])
    path.parent.mkdir(parents=True, exist_ok=True)

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(str(path), timeout=60, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer; one fsync per commit
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    return {"creator": connect}


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage at ``url``."""
    kwargs = engine_kwargs(url)
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except Exception as e:  # SQLAlchemy raises many types for a bad URL or an unreachable server
        raise BadInput(f"--storage {redact(url)}: cannot open the Optuna storage ({str(e).splitlines()[0]})") from None


# ---------------------------------------------------------------------------------------------------
# claims: one row per measured fingerprint, inserted atomically


@dataclass
class Claim:
    id: int
    fingerprint: str
    trial: int
    owner: str
    state: str  # running | ok | failed | pruned
    value: float | None
    run_id: str | None


class Claims:
    """Fingerprints measured (or being measured) in each study, in the study's own database."""

    def __init__(self, url: str):
        import sqlalchemy as sa

        self.sa = sa
        self.engine = sa.create_engine(url, **engine_kwargs(url))
        meta = sa.MetaData()
        self.table = sa.Table(
            "bisect_eagle_claims", meta,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("study", sa.String(512), nullable=False),
            sa.Column("fingerprint", sa.String(64), nullable=False),
            sa.Column("trial", sa.Integer, nullable=False),
            sa.Column("owner", sa.String(256), nullable=False),
            sa.Column("state", sa.String(16), nullable=False),
            sa.Column("value", sa.Float, nullable=True),
            sa.Column("run_id", sa.String(64), nullable=True),
            sa.UniqueConstraint("study", "fingerprint", name="uq_bisect_eagle_claim"),
        )
        with contextlib.suppress(sa.exc.OperationalError):  # another process created it first
            meta.create_all(self.engine, checkfirst=True)

    def _row(self, r) -> Claim:
        return Claim(r.id, r.fingerprint, r.trial, r.owner, r.state, r.value, r.run_id)

    def get(self, study: str, fingerprint: str) -> Claim | None:
        t = self.table
        with self.engine.connect() as c:
            r = c.execute(self.sa.select(t).where(t.c.study == study, t.c.fingerprint == fingerprint)).first()
        return self._row(r) if r else None

    def claim(self, study: str, fingerprint: str, trial: int, owner: str) -> tuple[bool, Claim | None]:
        """(True, None) when this process now owns the fingerprint, else (False, the existing claim).

        A running claim whose owner died on this host is taken over.
        """
        t = self.table
        try:
            with self.engine.begin() as c:
                c.execute(t.insert().values(study=study, fingerprint=fingerprint, trial=trial, owner=owner,
                                            state="running"))
            return True, None
        except self.sa.exc.IntegrityError:
            pass
        other = self.get(study, fingerprint)
        if other is None:  # released between our insert and read
            return self.claim(study, fingerprint, trial, owner)
        if other.state == "running" and owner_alive(other.owner) is False:
            with self.engine.begin() as c:
                res = c.execute(t.update().where(t.c.id == other.id, t.c.owner == other.owner, t.c.state == "running")
                                .values(owner=owner, trial=trial))
            if res.rowcount == 1:
                return True, None
        return False, other

    def position(self, study: str, fingerprint: str) -> int:
        """1-based order of this fingerprint's claim among the study's claims (the live-trial budget)."""
        t = self.table
        mine = self.get(study, fingerprint)
        with self.engine.connect() as c:
            return int(c.execute(self.sa.select(self.sa.func.count()).select_from(t)
                                 .where(t.c.study == study, t.c.id <= mine.id)).scalar_one())

    def finish(self, study: str, fingerprint: str, state: str, value: float | None, run_id: str | None) -> None:
        t = self.table
        with self.engine.begin() as c:
            c.execute(t.update().where(t.c.study == study, t.c.fingerprint == fingerprint)
                      .values(state=state, value=value, run_id=run_id))

    def release(self, study: str, fingerprint: str) -> None:
        """Forget a claim whose trial did not finish (it may be measured again)."""
        t = self.table
        with self.engine.begin() as c:
            c.execute(t.delete().where(t.c.study == study, t.c.fingerprint == fingerprint, t.c.state == "running"))

    def all(self, study: str) -> list[Claim]:
        t = self.table
        with self.engine.connect() as c:
            return [self._row(r) for r in c.execute(self.sa.select(t).where(t.c.study == study).order_by(t.c.id))]

    def wait_done(self, study: str, fingerprint: str, timeout_s: float, poll_s: float = 1.0) -> Claim | None:
        """Wait until another worker's claim is finished; None if it was released or the wait timed out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            c = self.get(study, fingerprint)
            if c is None or c.state != "running":
                return c
            if owner_alive(c.owner) is False:
                return None
            time.sleep(poll_s)
        return None


# ---------------------------------------------------------------------------------------------------
# progress and outcome


@dataclass
class Progress:
    """One progress event for a display."""

    stage: str  # standalone | baseline | live | done
    message: str
    done: int = 0  # live trials measured (all workers)
    total: int = 0  # max live trials
    best: float | None = None
    target: float | None = None
    elapsed_s: float = 0.0
    max_wall_s: float = 0.0


@dataclass
class Outcome:
    """What a run (or a worker) ends with; ``to_json`` is what ``--json`` prints."""

    target_reached: bool
    stop_reason: str
    study: str
    storage: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    metric: str
    baseline: float | None
    target: float | None
    baseline_output_tok_s: float | None
    best: dict[str, Any] | None
    gate: list[dict[str, Any]]
    trials: list[dict[str, Any]]
    counts: dict[str, int]
    elapsed_s: float
    tool_overhead_s_per_trial: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------
# study setup


class AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler for ask-and-tell: it calls ``study.stop()``, which only works inside ``optimize``;
    the search loop stops by itself once every distinct config of the space is measured."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


def make_sampler(spec: Spec, space: SearchSpace, seed: int) -> optuna.samplers.BaseSampler:
    """TPE (multivariate, constant liar; grouped when parameters are conditional), grid or random."""
    s = spec.search
    if s.sampler == "grid":
        return AskTellGridSampler(space.grid(), seed=seed)
    if s.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    conditional = any(p.when for p in space.params.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(n_startup_trials=s.startup_trials, multivariate=True, constant_liar=True,
                                          group=conditional, seed=seed)


def live_space(spec: Spec, gate: list[dict[str, Any]]) -> SearchSpace:
    """The spec's space with the wirings that passed the gate as a categorical of layer-id lists."""
    params: dict[str, Param] = {}
    if spec.standalone.wirings:
        passed = [v["layer_ids"] for v in gate if v["passed"]]
        params[WIRING_SETTING] = Param(type="categorical", choices=passed)
    params.update(spec.space)
    return SearchSpace(params, spec.engine.settings, str(spec.source))


def latest_study(storage: optuna.storages.RDBStorage, spec: Spec) -> str | None:
    """The newest study created for this spec's name."""
    mine = [s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
            if s.user_attrs.get("spec_name") == spec.name]
    return max(mine, key=lambda s: s._study_id).study_name if mine else None


def _spec_text(spec: Spec) -> str:
    from bisect_eagle.secrets import Scrubber

    fixed = spec.fixed_settings()
    return Scrubber(fixed.env, fixed.server_args)(Path(spec.source).read_text())


def _resolved_spec(spec: Spec) -> dict[str, Any]:
    from bisect_eagle.secrets import redact_mapping

    d = spec.model_dump(mode="json")
    d["source"] = str(Path(spec.source).resolve())
    d["engine"]["settings"] = redact_mapping(d["engine"]["settings"])
    return d


def _start_parent(tracking: Tracking, spec: Spec, study: str, storage: str) -> str:
    """The study's parent run: the spec (as written and resolved), environment, versions and search budget."""
    import json

    s = spec.search
    params = {**environment_info(), "spec": str(Path(spec.source).resolve()), "engine": spec.engine.kind,
              "sampler": s.sampler, "seed": str(s.seed), "max_live_trials": str(s.max_live_trials),
              "max_wall_s": str(s.max_wall_s), "repeats": str(s.repeats), "criterion.metric": spec.criterion.metric,
              "criterion.ratio": str(spec.criterion.ratio), "baseline": str(spec.baseline),
              "gate.margin": str(spec.standalone.margin), "gate.reference": spec.standalone.reference}
    run_id = tracking.start_run(study, {"role": "study", "study": study, "storage": redact(storage),
                                        "mlflow.note.content": spec.description or f"bisect-eagle study {study}"},
                                params)
    tracking.log_texts(run_id, {"spec.yaml": _spec_text(spec),
                                "spec.resolved.json": json.dumps(_resolved_spec(spec), indent=2)})
    return run_id


def _reap(study: optuna.Study, claims: Claims, tracking: Tracking, parent_run_id: str) -> list[str]:
    """Mark what dead processes of this host left running: Optuna FAIL, MLflow FAILED, claims released."""
    notes = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.user_attrs.get("owner")
        if owner is None:  # killed between ask() and naming its owner
            age = datetime.datetime.now() - (t.datetime_start or datetime.datetime.now())
            alive = None if age < datetime.timedelta(minutes=1) else False
        else:
            alive = owner_alive(owner)
        if alive is False:
            study.tell(t.number, state=TrialState.FAIL)
            if "fingerprint" in t.user_attrs:
                claims.release(study.study_name, t.user_attrs["fingerprint"])
            notes.append(f"trial {t.number} was interrupted; marked FAIL (it will be measured again)")
        elif alive is None:
            notes.append(f"trial {t.number} is RUNNING on another host ({t.user_attrs.get('owner')}); left as is")
    for run in tracking.child_runs(parent_run_id):
        if run.info.status == "RUNNING" and owner_alive(run.data.tags.get("owner", "")) is False:
            tracking.log(run.info.run_id, tags={"outcome": "interrupted",
                                                "failure_detail": "the process running this trial was killed"})
            tracking.finish(run.info.run_id, "FAILED")
    for c in claims.all(study.study_name):
        if c.state == "running" and owner_alive(c.owner) is False:
            claims.release(study.study_name, c.fingerprint)
    return notes


# ---------------------------------------------------------------------------------------------------
# the search itself


@dataclass
class StudyRun:
    """One process's part of a study: stage 1, the baseline and the stage-2 loop."""

    spec: Spec
    study: optuna.Study
    claims: Claims
    ctx: TrialContext
    storage_url: str
    max_live_trials: int
    max_wall_s: float
    progress: Callable[[Progress], None]
    seed: int = 0
    started: float = field(default_factory=time.monotonic)
    overhead_s: float = 0.0
    measured_here: int = 0

    @property
    def name(self) -> str:
        return self.study.study_name

    def attr(self, key: str) -> Any:
        return self.study.user_attrs.get(key)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def emit(self, stage: str, message: str) -> None:
        done = self.claims.all(self.name)
        best = max((c.value for c in done if c.state == "ok" and c.value is not None), default=None)
        self.progress(Progress(stage, message, len(done), self.max_live_trials, best, self.ctx.target,
                               self.elapsed(), self.max_wall_s))

    # -- stage 1 ---------------------------------------------------------------------------------------

    def stage1(self) -> list[dict[str, Any]]:
        """Standalone verdicts of every candidate wiring, gated; stored on the study (done once)."""
        if self.attr("gate") is not None:
            return self.attr("gate")
        st = self.spec.standalone
        if not st.wirings:
            self.study.set_user_attr("gate", [])
            return []
        scorer = Scorer(self.spec)
        cands = scorer.candidates()
        verdicts: list[Verdict] = []
        for i, c in enumerate(cands):
            self.emit("standalone", f"standalone {i + 1}/{len(cands)}: {c.label}")
            verdicts.append(run_standalone_trial(self.ctx, scorer, c))
        reference = self.spec.training_accuracy if st.reference == "training" else None
        ref = apply_gate(verdicts, st.margin, reference)
        for v in verdicts:
            self.ctx.tracking.log(v.run_id, metrics={"gate_reference": ref}, tags={"gate": "pass" if v.passed else
                                                                                    "reject"})
        gate = [v.to_json() for v in verdicts]
        self.study.set_user_attr("gate_reference", ref)
        self.study.set_user_attr("gate", gate)
        passed = [v.label for v in verdicts if v.passed]
        self.emit("standalone", f"gate (reference {ref:.3f}, margin {st.margin}): {len(passed)} of "
                                f"{len(verdicts)} wirings go live: {', '.join(passed) or 'none'}")
        return gate

    # -- baseline --------------------------------------------------------------------------------------

    def baseline(self) -> None:
        """The criterion's baseline (measured once without speculation, or the spec's number) and target."""
        if self.attr("target") is not None:
            self.load_baseline()
            return
        spec = self.spec
        if spec.baseline == "measure":
            settings = spec.fixed_settings().model_copy(update={"speculative_algorithm": "none"})
            plan = self.ctx.plan(settings)
            record = find_cached(self.ctx.tracking, plan.fingerprint, self.ctx.parent_run_id)
            if record is None:
                self.emit("baseline", "baseline trial (no speculation)")
                record = run_live_trial(self.ctx, plan, stage="baseline", parent_run_id=self.ctx.parent_run_id)
            if record.status != "ok":
                raise RuntimeError(f"the baseline trial failed ({record.failure_class}): {record.failure_detail}; "
                                   f"see run {record.run_id}")
            value, run_id, tok_s = record.value, record.run_id, record.metrics["output_tok_s"]
        else:
            value, run_id = float(spec.baseline), None
            tok_s = value if spec.criterion.metric == "output_tok_s" else None
        target = spec.criterion.ratio * value
        self.study.set_user_attr("baseline_run_id", run_id)
        self.study.set_user_attr("baseline_output_tok_s", tok_s)
        self.study.set_user_attr("baseline", value)
        self.study.set_user_attr("target", target)
        self.load_baseline()
        self.ctx.tracking.log(self.ctx.parent_run_id, metrics={"baseline": value, "target": target,
                                                               "baseline_output_tok_s": tok_s})

    def load_baseline(self) -> None:
        """The study's baseline and target into the trial context."""
        self.ctx.baseline, self.ctx.target = self.attr("baseline"), self.attr("target")
        self.ctx.baseline_tok_s = self.attr("baseline_output_tok_s")

    # -- stage 2 ---------------------------------------------------------------------------------------

    def space_fingerprints(self, space: SearchSpace) -> set[str] | None:
        """Fingerprints of every distinct runnable config in the space, or None when it cannot be listed."""
        combos = space.enumerate()
        if combos is None:
            return None
        out = set()
        for sampled in combos:
            try:
                plan = self.ctx.plan(space.settings(sampled))
            except BadInput:
                continue
            if plan.refusal is None:
                out.add(plan.fingerprint)
        return out

    def stop_reason(self, all_fps: set[str] | None, duplicates_in_row: int) -> str | None:
        claims = self.claims.all(self.name)
        target = self.ctx.target
        best = max((c.value for c in claims if c.state == "ok" and c.value is not None), default=None)
        if target is not None and best is not None and best >= target:
            return "target reached"
        if all_fps is not None and all_fps <= {c.fingerprint for c in claims} | self._cached_outside(all_fps):
            return f"search space exhausted (all {len(all_fps)} distinct configs measured)"
        if len(claims) >= self.max_live_trials:
            return f"budget: max_live_trials ({self.max_live_trials}) used"
        if self.elapsed() >= self.max_wall_s:
            return f"budget: max_wall_s ({self.max_wall_s:g} s) used"
        if duplicates_in_row >= DUPLICATE_LIMIT:
            return f"the sampler proposed only measured configs {DUPLICATE_LIMIT} times in a row"
        return None

    def _cached_outside(self, fps: set[str]) -> set[str]:
        """Space fingerprints measured outside stage 2 (the baseline config, if the space holds it)."""
        baseline_run = self.attr("baseline_run_id")
        if not baseline_run:
            return set()
        fp = self.ctx.tracking.get_run(baseline_run).data.tags.get("fingerprint")
        return {fp} & fps

    def loop(self, space: SearchSpace) -> str:
        """Ask, deduplicate, claim, measure, tell, until a stop reason; returns it."""
        all_fps = self.space_fingerprints(space)
        duplicates_in_row = 0
        while True:
            reason = self.stop_reason(all_fps, duplicates_in_row)
            if reason:
                return reason
            t0 = time.perf_counter()
            kind, record = self.one_trial(space)
            if kind == "budget":
                continue
            duplicates_in_row = duplicates_in_row + 1 if kind in ("duplicate", "invalid") else 0
            if kind == "measured" and record is not None:
                self.measured_here += 1
                self.overhead_s += time.perf_counter() - t0 - record.engine_s
                shown = f"{record.value:.2f}" if record.value is not None else record.failure_class
                self.emit("live", f"trial {record.run_id[:8]}: {shown} ({record.status})")

    def one_trial(self, space: SearchSpace) -> tuple[str, TrialRecord | None]:
        """One Optuna trial: ('measured' | 'duplicate' | 'invalid' | 'budget', the record when measured)."""
        trial = self.study.ask()
        trial.set_user_attr("owner", self.ctx.owner)
        sampled = space.suggest(trial)
        try:
            plan = self.ctx.plan(space.settings(sampled))
            if plan.refusal is not None:
                raise BadInput(plan.refusal)
        except BadInput as e:  # a combination the engine refuses (e.g. topk > 1 without num_draft_tokens)
            fp = None
            trial.set_user_attr("invalid", str(e))
            trial.set_constraint("invalid", 1.0)
            self.study.tell(trial, state=TrialState.PRUNED)
            return "invalid", None
        fp = plan.fingerprint
        trial.set_user_attr("fingerprint", fp)
        won, other = self.claims.claim(self.name, fp, trial.number, self.ctx.owner)
        if not won:
            done = other if other.state != "running" else self.claims.wait_done(self.name, fp, self._time_left())
            if done is None:
                self.study.tell(trial, state=TrialState.FAIL)
                return "duplicate", None
            self._tell_known(trial, done.state, done.value, done.run_id, duplicate=True)
            return "duplicate", None
        if self.claims.position(self.name, fp) > self.max_live_trials:
            self.claims.release(self.name, fp)
            trial.set_user_attr("not_run", "the live-trial budget was used up by other workers")
            self.study.tell(trial, state=TrialState.FAIL)
            return "budget", None
        cached = find_cached(self.ctx.tracking, fp, self.ctx.parent_run_id)
        if cached is not None:  # measured outside stage 2 (the baseline config) or before a lost claim
            self.claims.finish(self.name, fp, cached.status, cached.value, cached.run_id)
            self._tell_known(trial, cached.status, cached.value, cached.run_id, duplicate=True)
            return "duplicate", None
        try:
            record = run_live_trial(self.ctx, plan, stage="live", parent_run_id=self.ctx.parent_run_id,
                                    number=trial.number,
                                    tags={"trial_number": str(trial.number)},
                                    on_start=lambda run_id: trial.set_user_attr("mlflow_run_id", run_id))
        except BaseException:
            self.claims.release(self.name, fp)
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        self.claims.finish(self.name, fp, record.status, record.value, record.run_id)
        if record.failure_class:
            trial.set_user_attr("failure_class", record.failure_class)
        self._tell_known(trial, record.status, record.value, record.run_id, duplicate=False)
        return "measured", record

    def _tell_known(self, trial, state: str, value: float | None, run_id: str | None, duplicate: bool) -> None:
        """Tell Optuna a measured outcome: ok -> value; pruned -> PRUNED; failed -> PRUNED and infeasible."""
        if duplicate:
            trial.set_user_attr("duplicate_of", run_id)
        if state == "ok":
            self.study.tell(trial, value)
        elif state == "pruned":
            trial.report(value, 0)
            self.study.tell(trial, state=TrialState.PRUNED)
        else:  # crashed: infeasible, so TPE steers away, and never measured again (the claim stays)
            trial.set_constraint("crashed", 1.0)
            self.study.tell(trial, state=TrialState.PRUNED)

    def _time_left(self) -> float:
        return max(1.0, self.max_wall_s - self.elapsed())

    # -- outcome ---------------------------------------------------------------------------------------

    def outcome(self, reason: str, space: SearchSpace | None) -> Outcome:
        claims = self.claims.all(self.name)
        ok = [c for c in claims if c.state == "ok" and c.value is not None]
        best_claim = max(ok, key=lambda c: c.value, default=None)
        best = None
        if best_claim is not None:
            run = self.ctx.tracking.get_run(best_claim.run_id)
            best = {"run_id": best_claim.run_id, "fingerprint": best_claim.fingerprint, "value": best_claim.value,
                    "params": effective_of(self.ctx.tracking, run), "metrics": dict(run.data.metrics)}
        trials = [_trial_summary(t, space) for t in self.study.get_trials(deepcopy=False)]
        counts = {
            "live_measured": len(claims),
            "failed": sum(c.state == "failed" for c in claims),
            "duplicates": sum("duplicate_of" in t["user_attrs"] for t in trials),
            "optuna_trials": len(trials),
            "standalone": len(self.attr("gate") or []),
        }
        for t in trials:
            del t["user_attrs"]
        target = self.ctx.target
        return Outcome(
            target_reached=target is not None and best is not None and best["value"] >= target,
            stop_reason=reason, study=self.name, storage=redact(self.storage_url),
            tracking_uri=redact(self.ctx.tracking.uri), experiment_id=self.ctx.tracking.experiment_id,
            parent_run_id=self.ctx.parent_run_id, metric=self.spec.criterion.metric, baseline=self.ctx.baseline,
            target=target, baseline_output_tok_s=self.ctx.baseline_tok_s, best=best, gate=self.attr("gate") or [],
            trials=trials, counts=counts, elapsed_s=self.elapsed(),
            tool_overhead_s_per_trial=self.overhead_s / self.measured_here if self.measured_here else None,
        )


def _trial_summary(t: optuna.trial.FrozenTrial, space: SearchSpace | None) -> dict[str, Any]:
    params = space.decode(t.params) if space is not None else dict(t.params)
    return {"number": t.number, "state": t.state.name, "value": t.value, "params": params,
            "fingerprint": t.user_attrs.get("fingerprint"),
            "run_id": t.user_attrs.get("mlflow_run_id") or t.user_attrs.get("duplicate_of"),
            "duplicate": "duplicate_of" in t.user_attrs, "failure_class": t.user_attrs.get("failure_class"),
            "user_attrs": t.user_attrs}


# ---------------------------------------------------------------------------------------------------
# entry points


@dataclass
class Options:
    """Where a study lives and how much this invocation may spend."""

    storage: str
    tracking_uri: str | None  # None for a worker: the study's own
    study_name: str | None = None
    resume: bool = False
    max_live_trials: int | None = None
    max_wall_s: float | None = None
    progress: Callable[[Progress], None] = field(default=lambda p: None)


def _finish_parent(s: StudyRun, out: Outcome) -> None:
    tracking, pid = s.ctx.tracking, s.ctx.parent_run_id
    metrics = {"live_trials": float(out.counts["live_measured"]), "duplicates": float(out.counts["duplicates"]),
               "failed_trials": float(out.counts["failed"]), "elapsed_s": out.elapsed_s}
    if out.tool_overhead_s_per_trial is not None:
        metrics["tool_overhead_s_per_trial"] = out.tool_overhead_s_per_trial
    if out.best:
        metrics["best"] = out.best["value"]
        if out.baseline:
            metrics["best_ratio_to_baseline"] = out.best["value"] / out.baseline
    verdict = "target reached" if out.target_reached else "target not reached"
    tags = {"outcome": verdict, "stop_reason": out.stop_reason}
    if out.best:
        tags["best_run_id"] = out.best["run_id"]
    tracking.log(pid, metrics=metrics, tags=tags)
    tracking.finish(pid, "FINISHED")


def run_study(spec: Spec, opts: Options, engine_factory: Callable[[Spec], Engine]) -> Outcome:
    """Create (or with ``resume`` continue) a study: stage 1, baseline, stage 2, then close the parent run."""
    if opts.tracking_uri is None:
        raise ValueError("run_study needs a tracking URI (see tracking.resolve_tracking_uri)")
    storage = open_storage(opts.storage)
    claims = Claims(opts.storage)
    tracking = Tracking.open(opts.tracking_uri, spec.name)
    if opts.resume:
        name = opts.study_name or spec.storage.study_name or latest_study(storage, spec)
        if name is None:
            raise BadInput(f"--resume: no study of spec {spec.name!r} in {redact(opts.storage)}")
        study = _load(storage, name)
        parent = study.user_attrs["parent_run_id"]
        tracking.reopen(parent)
    else:
        name = opts.study_name or spec.storage.study_name or f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        if name in optuna.get_all_study_names(storage):
            raise BadInput(f"study {name!r} already exists in {redact(opts.storage)}; continue it with --resume, "
                           "or give another --study-name")
        study = optuna.create_study(storage=storage, study_name=name, direction="maximize")
        parent = _start_parent(tracking, spec, name, opts.storage)
        for key, value in {"spec_name": spec.name, "parent_run_id": parent, "tracking_uri": redact(opts.tracking_uri),
                           "experiment_id": tracking.experiment_id}.items():
            study.set_user_attr(key, value)
    ctx = TrialContext(spec, tracking, name, parent)
    s = _search(spec, study, claims, ctx, opts)
    if opts.resume:
        for note in _reap(study, claims, tracking, parent):
            s.emit("resume", note)
    with tracking.ended_on_error(parent, "stop_reason"):
        out = _run(s, engine_factory, opts, stage1=True)
    _finish_parent(s, out)
    study.set_user_attr("outcome", {"target_reached": out.target_reached, "stop_reason": out.stop_reason})
    return out


def join_study(spec: Spec, opts: Options, engine_factory: Callable[[Spec], Engine],
               wait_s: float = WORKER_WAIT_S) -> Outcome:
    """A worker: join a study another process created, wait for its stage 1 and baseline, then search."""
    storage = open_storage(opts.storage)
    name = opts.study_name or spec.storage.study_name or latest_study(storage, spec)
    if name is None:
        raise BadInput(f"worker: no study of spec {spec.name!r} in {redact(opts.storage)}; start one with "
                       "`bisect-eagle run` first")
    study = _load(storage, name)
    attrs = study.user_attrs
    uri = opts.tracking_uri or attrs["tracking_uri"]
    if "***" in uri:
        raise BadInput(f"worker: study {name!r} logs to {uri}; give the full URI with --tracking-uri")
    tracking = Tracking.open(uri, spec.name)
    ctx = TrialContext(spec, tracking, name, attrs["parent_run_id"])
    s = _search(spec, study, Claims(opts.storage), ctx, opts, seed_offset=1 + int(hashlib.sha256(
        ctx.owner.encode()).hexdigest()[:6], 16))
    deadline = time.monotonic() + wait_s
    while s.attr("target") is None:
        if time.monotonic() > deadline:
            raise BadInput(f"worker: study {name!r} has no baseline after {wait_s:g} s; is its `run` alive?")
        s.emit("waiting", "waiting for the study's stage 1 and baseline")
        time.sleep(2.0)
        study = _load(storage, name)
        s.study = study
    return _run(s, engine_factory, opts, stage1=False)


def _load(storage: optuna.storages.RDBStorage, name: str) -> optuna.Study:
    try:
        return optuna.load_study(storage=storage, study_name=name)
    except KeyError:
        raise BadInput(f"study {name!r} not found in the Optuna storage") from None


def _search(spec: Spec, study: optuna.Study, claims: Claims, ctx: TrialContext, opts: Options,
            seed_offset: int = 0) -> StudyRun:
    return StudyRun(spec, study, claims, ctx, opts.storage, opts.max_live_trials or spec.search.max_live_trials,
                    opts.max_wall_s or spec.search.max_wall_s, opts.progress, seed=spec.search.seed + seed_offset)


def _run(s: StudyRun, engine_factory: Callable[[Spec], Engine], opts: Options, stage1: bool) -> Outcome:
    gate = s.stage1() if stage1 else s.attr("gate")
    s.ctx.wiring_accuracy = {tuple(sorted(v["layer_ids"])): v["accuracy"] for v in gate}
    if s.spec.standalone.wirings and not any(v["passed"] for v in gate):
        return s.outcome("no wiring passed the standalone gate", None)
    space = live_space(s.spec, gate)
    s.study.sampler = make_sampler(s.spec, space, s.seed)
    if stage1:
        s.ctx.tracking.log_texts(s.ctx.parent_run_id, {"search_space.json": _space_json(space)})
    with engine_factory(s.spec) as engine:
        s.ctx.engine = engine
        if stage1:
            s.baseline()
        else:
            s.load_baseline()
        s.emit("live", f"searching {len(space.params)} parameters with {s.spec.search.sampler}")
        reason = s.loop(space)
    out = s.outcome(reason, space)
    s.emit("done", reason)
    return out


def _space_json(space: SearchSpace) -> str:
    import json

    return json.dumps({"order": space.order, "params": space.describe(),
                       "encoded_choices": {n: [encode(c) for c in p.choices or []]
                                           for n, p in space.params.items() if p.type == "categorical"}},
                      indent=2, default=str)
