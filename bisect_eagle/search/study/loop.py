"""One process's part of a study: stage 1 (gate the wirings), the baseline, and the stage-2 loop
with its stops.

The loop asks Optuna for a config, asks the engine for its plan, and measures the plan only when its
fingerprint was never claimed in this study (:mod:`bisect_eagle.search.study.claims`). Whatever
happens is told back to Optuna: a measured value; a duplicate's known value without running
anything; crashed configs as PRUNED with an infeasibility constraint (TPE ignores FAIL trials and
would propose them again); interrupted trials as FAIL (measured again after ``--resume``). It stops
at the first of: target reached and confirmed, every distinct config of the space measured, the
live-trial budget, the wall-clock budget, too many proposals of measured configs in a row, the
launch budget (``search.max_launches``: :mod:`bisect_eagle.search.study.spend`), or (with
``search.model``) no untried config left whose optimistic prediction reaches the target.

With ``search.model.enabled`` the throughput model picks the next config, skips those predicted
below the target and puts ``predicted_*`` metrics on each live run
(:mod:`bisect_eagle.search.study.guide`). The sampler keeps its own turns: every
``SAMPLER_EVERY``-th live trial is its proposal, never skipped, and when the model's own picks stop
finding better measurements while it sees no likely winner (stuck), the sampler proposes the next
``HANDOFF`` trials alone; the progress output says when and why.

A config measured at or above the target is a candidate: with ``search.confirm.enabled`` it is
re-measured interleaved with the baseline (:mod:`bisect_eagle.search.study.candidates`,
:mod:`bisect_eagle.search.study.confirm`; an accept-length baseline is 1 by definition, and a metric
the engine declares deterministic counts the search's own measurement of the candidate as the one it
needs) and the study stops only when that confirms it; a candidate that is not confirmed stays in
the study but never stops it, and the search goes on.

The tool's own time per live trial (``tool_overhead_s_per_trial``) is every step of the loop
(stopping, confirming, steering with the model, asking, planning, recording) less the engine's
seconds in it (:class:`~bisect_eagle.search.study.spend.Spend`).

A baseline trial that fails raises :class:`BaselineFailed` (the parent run ends FAILED with its
failure class).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import optuna
from optuna.trial import TrialState

from bisect_eagle.engines.plan import acceptance_kind
from bisect_eagle.errors import BadInput
from bisect_eagle.search.gate import apply_gate, record_gate
from bisect_eagle.search.space import SearchSpace, encode
from bisect_eagle.search.study.candidates import reached
from bisect_eagle.search.study.claims import Claim, ClaimState
from bisect_eagle.search.study.guide import (
    HANDOFF,
    SAMPLER_EVERY,
    STUCK_AFTER,
    STUCK_CHANCE,
    Judgement,
    ModelGuide,
)
from bisect_eagle.search.study.outcome import StudyOutcome, study_outcome
from bisect_eagle.search.study.sampler import Listed, list_configs
from bisect_eagle.search.study.state import StudyState
from bisect_eagle.spec.schema import Spec
from bisect_eagle.trials.live import run_live_trial
from bisect_eagle.trials.record import NUMBERED, TrialRecord
from bisect_eagle.trials.standalone import Scorer, Verdict, run_standalone_trial

OVERRIDE = "search.model.enabled: false measures them anyway"
# consecutive proposals of measured, refused or skipped configs before the search gives up
DUPLICATE_LIMIT = 200

TrialKind = Literal["measured", "duplicate", "invalid", "skipped", "budget"]
"""What one Optuna trial of the loop came to: measured now; a config already claimed (its value
reused); a combination the engine refuses; a config the model predicts cannot reach the target; or
not run because other workers used up the live-trial budget."""


class BaselineFailed(RuntimeError):
    """The baseline trial failed: no target, no study. ``failure_class`` is the trial's; the message
    one line."""

    def __init__(self, message: str, *, failure_class: str | None, run_id: str):
        super().__init__(message)
        self.failure_class = failure_class or "error"
        self.run_id = run_id


@dataclass(kw_only=True)
class StudyRun(StudyState):
    """One process's part of a study: stage 1, the baseline and the stage-2 loop."""

    guide: ModelGuide | None = None  # the throughput model (search.model.enabled)
    # every runnable config, when the space can be listed (set by loop)
    listed: Listed | None = None
    skips_in_row: int = 0  # consecutive proposals the model predicted below the target
    sampler_turn: bool = False  # the next live trial is the sampler's own proposal: never skipped
    handoff: int = 0  # live trials the sampler still proposes alone (the model was stuck)
    # the model's own picks in a row that measured no better than the best before them
    streak: int = 0
    # records a trial's first heartbeat the moment it is asked (Liveness.beat_trial): a process
    # killed before its heartbeat thread's next tick would otherwise leave a trial Optuna never sees
    # as stale, never reaped
    first_beat: Callable[[int], None] = field(default=lambda trial_id: None)
    scorer_factory: Callable[[Spec], Scorer] = Scorer  # stage 1's scorer (Options.scorer_factory)

    def outcome(self, reason: str, space: SearchSpace | None) -> StudyOutcome:
        """The study's outcome as this process ends it (:func:`~.outcome.study_outcome`).

        Args:
            reason: why the study stops.
            space: the search space, or None when the study stops before one (no wiring
                passed the gate).

        Returns:
            The outcome.
        """
        return study_outcome(self, reason=reason, space=space)

    # -- stage 1
    # ---------------------------------------------------------------------------------------

    def stage1(self) -> list[dict[str, Any]]:
        """Standalone verdicts of every candidate wiring, gated; stored on the study (done once)."""
        if self.attr("gate") is not None:
            return self.attr("gate")
        st = self.spec.standalone
        if not st.wirings:
            self.study.set_user_attr("gate", [])
            return []
        scorer = self.scorer_factory(self.spec)
        cands = scorer.candidates()
        verdicts: list[Verdict] = []
        for i, c in enumerate(cands):
            self.emit("standalone", f"standalone {i + 1}/{len(cands)}: {c.label}")
            verdicts.append(run_standalone_trial(self.ctx, scorer=scorer, candidate=c))
        reference = self.spec.training_accuracy if st.reference == "training" else None
        ref = apply_gate(verdicts, margin=st.margin, reference=reference)
        record_gate(self.ctx.tracking, verdicts, reference=ref, margin=st.margin)
        gate = [v.to_json() for v in verdicts]
        self.study.set_user_attr("gate_reference", ref)
        self.study.set_user_attr("gate", gate)
        passed = [v.label for v in verdicts if v.passed]
        self.emit(
            "standalone",
            f"gate (reference {ref:.3f}, margin {st.margin}): {len(passed)} of {len(verdicts)} "
            f"wirings go live: {', '.join(passed) or 'none'}",
        )
        return gate

    # -- baseline
    # --------------------------------------------------------------------------------------

    def baseline(self) -> None:
        """The criterion's baseline (measured once without speculation, or the spec's number) and
        target."""
        if self.attr("target") is not None:
            self.load_baseline()
            return
        spec = self.spec
        if spec.baseline == "measure":
            settings = spec.fixed_settings().model_copy(update={"speculative_algorithm": "none"})
            self.emit("baseline", "baseline trial (no speculation)")
            record = run_live_trial(
                self.ctx,
                self.ctx.plan(settings),
                stage="baseline",
                parent_run_id=self.ctx.parent_run_id,
                reuse=True,
            )
            if record.status != "ok":
                detail = " ".join((record.failure_detail or "").split())[:300]
                message = (
                    f"the baseline trial failed ({record.failure_class}): {detail}; see run "
                    f"{record.run_id}"
                )
                self.ctx.tracking.log(
                    self.ctx.parent_run_id,
                    tags={
                        "failure_class": record.failure_class or "error",
                        "baseline_run_id": record.run_id,
                    },
                )
                raise BaselineFailed(
                    message, failure_class=record.failure_class, run_id=record.run_id
                )
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
        metric = spec.criterion.metric
        self.ctx.tracking.log(
            self.ctx.parent_run_id,
            metrics={
                f"baseline_{metric}": value,
                f"target_{metric}": target,
                "baseline_output_tok_s": tok_s,
            },
        )

    def load_baseline(self) -> None:
        """The study's baseline and target into the trial context."""
        self.ctx.baseline, self.ctx.target = self.attr("baseline"), self.attr("target")
        self.ctx.baseline_tok_s = self.attr("baseline_output_tok_s")

    # -- stage 2
    # ---------------------------------------------------------------------------------------

    def stop_reason(self, listed: Listed | None, duplicates_in_row: int) -> str | None:
        """Why the loop stops now, or None to go on (with the model, it also enqueues the next
        config)."""
        claims = self.claims.all()
        if verdict := reached(self):
            return verdict
        untried = None
        # every listed config neither claimed nor measured outside stage 2 (the baseline)
        if listed is not None:
            taken = {c.fingerprint for c in claims} | self._cached_outside(set(listed))
            untried = {fp: v for fp, v in listed.items() if fp not in taken}
        if untried is not None and not untried:
            if self.elapsed() < self.max_wall_s and self.await_running(
                claims, why="every config is claimed"
            ):
                return None  # a released claim (its worker died) is measured again: look again
            return f"search space exhausted (all {len(listed)} distinct configs measured)"
        if len(claims) >= self.max_live_trials:
            return f"budget: max_live_trials ({self.max_live_trials}) used"
        if self.elapsed() >= self.max_wall_s:
            return f"budget: max_wall_s ({self.max_wall_s:g} s) used"
        if self.max_launches is not None and (used := self.launches().total) >= self.max_launches:
            return f"budget: max_launches ({self.max_launches}) used: {used} {self.spend.unit}"
        if duplicates_in_row >= DUPLICATE_LIMIT:
            if self.skips_in_row >= DUPLICATE_LIMIT:
                return (
                    f"the throughput model predicted the last {self.skips_in_row} proposals below "
                    f"the target; {OVERRIDE}"
                )
            return (
                f"the sampler proposed only measured, refused or skipped configs {DUPLICATE_LIMIT} "
                "times in a row"
            )
        return self.steer(untried, claims) if self.guide is not None else None

    def steer(self, untried: Listed | None, claims: list[Claim]) -> str | None:
        """Teach the model the study's finished trials; enqueue the config of ``untried`` (None: the
        space cannot be listed) likeliest to reach the target, or return why none is worth
        running."""
        guide, target = self.guide, self.ctx.target
        guide.learn_runs(
            self.ctx.tracking, [self.attr("baseline_run_id"), *(c.run_id for c in claims)]
        )
        if untried is None or target is None:
            return None
        if self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            # a config is enqueued already (by this process or another worker): it runs first
            return None
        if self.handoff > 0 or (len(claims) + 1) % SAMPLER_EVERY == 0:
            self.sampler_turn = True
            return None
        sampled, forecast, hopeless = guide.choose(untried, target=target)
        if sampled is not None and self.streak >= STUCK_AFTER and forecast.chance < STUCK_CHANCE:
            self.emit(
                "live",
                f"model stuck: its last {self.streak} picks measured nothing better and its best "
                f"untried chance is {forecast.chance:.0%}; the sampler proposes the next {HANDOFF}",
            )
            self.handoff, self.streak, self.sampler_turn = HANDOFF, 0, True
            return None
        if sampled is not None:
            if guide.note:
                self.emit("live", f"model: {guide.note}")
            self.study.enqueue_trial(
                {k: encode(v) for k, v in sampled.items()}, user_attrs={"enqueued_by": "model"}
            )
            return None
        if not hopeless or hopeless < len(untried):
            return None
        if self.await_running(claims, why="the model rules out every untried config"):
            return None  # another worker's trial may still reach the target: look again
        return (
            f"no untried config can reach the target: the model's {guide.optimism:.0%} quantile of "
            f"all {hopeless} misses {self.spec.criterion.metric} {target:.4g}; {OVERRIDE}"
        )

    def await_running(self, claims: list[Claim], *, why: str) -> bool:
        """Wait for other workers' running claims to finish or be released (a dead worker, reaped):
        a released config is measured again, a running one may reach the target. False when there
        were none."""
        running = [c for c in claims if c.state == "running"]
        if running:
            self.emit(
                "live", f"{why}; waiting for the trials other workers are running ({len(running)})"
            )
            for c in running:
                self.claims.wait_done(c.fingerprint, timeout_s=self._time_left())
        return bool(running)

    def _cached_outside(self, fps: set[str]) -> set[str]:
        """Space fingerprints measured outside stage 2 (the baseline config, if the space holds
        it)."""
        baseline_run = self.attr("baseline_run_id")
        if not baseline_run:
            return set()
        fp = self.ctx.tracking.get_run(baseline_run).data.tags.get("fingerprint")
        return {fp} & fps

    def loop(self, space: SearchSpace) -> str:
        """Ask, deduplicate, claim, measure, tell, until a stop reason; returns it. All of it but
        the engine's seconds is the tool's own time (:meth:`Spend.tool_time`), listing the space
        included."""
        with self.spend.tool_time():
            listed = self.listed = list_configs(space, plan=self.ctx.plan)
        duplicates_in_row = 0
        while True:
            with self.spend.tool_time():
                reason = self.stop_reason(listed, duplicates_in_row)
                if reason:
                    return reason
                kind, record = self.one_trial(space)
                if kind == "budget":
                    continue
                duplicates_in_row = (
                    duplicates_in_row + 1 if kind in ("duplicate", "invalid", "skipped") else 0
                )
                self.skips_in_row = self.skips_in_row + 1 if kind == "skipped" else 0
                if kind == "measured" and record is not None:
                    self.spend.measured += 1
                    self._after_measured(record)
                    shown = (
                        f"{record.value:.2f}" if record.value is not None else record.failure_class
                    )
                    self.emit(
                        "live", f"{record.name}: {shown} ({record.status}), run {record.run_id[:8]}"
                    )

    def _after_measured(self, record: TrialRecord) -> None:
        """The sampler's turn is spent; a model pick that measured no better than the best before it
        extends the streak the stuck test reads (:meth:`steer`)."""
        if self.sampler_turn:
            self.sampler_turn = False
            self.handoff = max(0, self.handoff - 1)
            return
        if self.guide is None:
            return
        before = [
            c.value
            for c in self.claims.all()
            if c.state == "ok" and c.value is not None and c.run_id != record.run_id
        ]
        better = record.value is not None and (not before or record.value > max(before))
        self.streak = 0 if better else self.streak + 1

    def one_trial(self, space: SearchSpace) -> tuple[TrialKind, TrialRecord | None]:
        """One Optuna trial: what it came to (:data:`TrialKind`) and the record when measured."""
        trial = self.study.ask()
        self.first_beat(trial._trial_id)
        trial.set_user_attr("owner", self.ctx.owner)
        # its MLflow run's name once measured (trial_name's format: no call into the record here)
        trial.set_user_attr("name", NUMBERED.format(stage="live", number=trial.number))
        sampled = space.suggest(trial)
        try:
            plan = self.ctx.plan(space.settings(sampled))
            if plan.refusal is not None:
                raise BadInput(plan.refusal)
            # its tok/s is not the deployment's: never a winner
            if acceptance_kind(plan.effective) == "pinned":
                raise BadInput(
                    "pinned_acceptance measures a config's cost alone: a search trial's acceptance "
                    "is natural"
                )
        # a combination the engine refuses (e.g. topk > 1 without num_draft_tokens)
        except BadInput as e:
            trial.set_user_attr("invalid", str(e))
            trial.set_constraint("invalid", 1.0)
            self.study.tell(trial, state=TrialState.PRUNED)
            return "invalid", None
        fp = plan.fingerprint
        trial.set_user_attr("fingerprint", fp)
        # the searched settings as the engine runs them (a default it resolved, e.g.
        # num_draft_tokens None -> 4): what tables and optuna-dashboard show beside the sampled
        # params
        effective = {k: plan.effective.get(k, v) for k, v in sampled.items()}
        trial.set_user_attr("effective", effective)
        # one row each in optuna-dashboard's user attributes, beside the params
        for key, value in effective.items():
            trial.set_user_attr(f"effective.{key}", value)
        judged = self._judge(trial, plan.effective)
        # a measured config is a duplicate, never "skipped"
        if judged is not None and judged.skip and self.claims.get(fp) is None:
            trial.set_user_attr("skipped", judged.skip)
            trial.set_constraint("predicted_below", 1.0)
            self.study.tell(trial, state=TrialState.PRUNED)
            return "skipped", None
        with self.claims.claimed(
            fp, trial=trial.number, owner=self.ctx.owner, limit=self.max_live_trials
        ) as claim:
            if not claim.won:
                return self._not_claimed(trial, fp, claim.other), None
            before = self.ctx.run_id
            # a finished trial of fp (the baseline config, or one measured before a lost claim) is
            # reused
            try:
                record = run_live_trial(
                    self.ctx,
                    plan,
                    stage="live",
                    parent_run_id=self.ctx.parent_run_id,
                    number=trial.number,
                    reuse=True,
                    start_metrics=None if judged is None else judged.start_metrics,
                )
            # interrupted or broken: not a result; the claim is released, the config may be measured
            # again
            except BaseException:
                if self.ctx.run_id not in (None, before):
                    # the run it left (ended KILLED or FAILED)
                    trial.set_user_attr("mlflow_run_id", self.ctx.run_id)
                self.study.tell(trial, state=TrialState.FAIL)
                raise
            claim.finished = (record.status, record.value, record.run_id)
        if record.cached:
            self._tell_known(
                trial, state=record.status, value=record.value, run_id=record.run_id, duplicate=True
            )
            return "duplicate", None
        trial.set_user_attr("mlflow_run_id", record.run_id)
        if record.failure_class:
            trial.set_user_attr("failure_class", record.failure_class)
        self._tell_known(
            trial, state=record.status, value=record.value, run_id=record.run_id, duplicate=False
        )
        return "measured", record

    def _not_claimed(self, trial: optuna.Trial, fp: str, other: Claim | None) -> TrialKind:
        """Tell Optuna what a trial whose config another holds came to: beyond the live-trial
        budget, a duplicate of one running elsewhere, or a duplicate whose result is reused (waited
        for while it runs)."""
        if other is None:
            trial.set_user_attr("not_run", "the live-trial budget was used up by other workers")
            self.study.tell(trial, state=TrialState.FAIL)
            return "budget"
        # two workers enqueued it
        if other.state == "running" and trial.user_attrs.get("enqueued_by"):
            trial.set_user_attr("duplicate_of_running", other.owner)
            self.study.tell(trial, state=TrialState.FAIL)
            return "duplicate"
        done = (
            other
            if other.state != "running"
            else self.claims.wait_done(fp, timeout_s=self._time_left())
        )
        if done is None:
            self.study.tell(trial, state=TrialState.FAIL)
            return "duplicate"
        self._tell_known(
            trial, state=done.state, value=done.value, run_id=done.run_id, duplicate=True
        )
        return "duplicate"

    def _tell_known(
        self,
        trial: optuna.Trial,
        *,
        state: ClaimState,
        value: float | None,
        run_id: str | None,
        duplicate: bool,
    ) -> None:
        """Tell Optuna a measured outcome: ok -> value; pruned -> PRUNED; failed -> PRUNED and
        infeasible."""
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

    def _judge(self, trial: optuna.Trial, effective: dict[str, Any]) -> Judgement | None:
        """The model's judgement of a proposed config (its forecast stored on the Optuna trial;
        never skipped on the sampler's turn); None without a model or a target."""
        if self.guide is None or self.ctx.target is None:
            return None
        judged = self.guide.judge(effective, target=self.ctx.target, may_skip=not self.sampler_turn)
        if judged.predicted is not None:
            trial.set_user_attr("predicted", judged.predicted)
        return judged

    def _time_left(self) -> float:
        return max(1.0, self.max_wall_s - self.elapsed())
