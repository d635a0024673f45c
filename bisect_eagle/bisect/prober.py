"""The oracle of a bisect: a set of applied changes -> the engine's plan -> samples -> a verdict.

One plan fingerprint is one measurement: the first configuration that plans to it is measured (or
found in the MLflow store), every later configuration with the same fingerprint reuses those samples
and its verdict; the prober never starts a second trial of one plan. A measurement is sampled
sequentially (see :mod:`~bisect_eagle.bisect.judge`): its first sample is a live trial
(:func:`run_live_trial`: one child run of the bisect with the plan's params), further samples are
more launches of the same plan, recorded on that run (``{metric}`` = median, ``repeats``,
``bisect_samples.json``).

A sample is one launch. On an engine whose benchmark rounds share a launch
(:attr:`Engine.rounds_share_launch <bisect_eagle.engines.base.Engine.rounds_share_launch>`) each
launch measures several rounds, as confirmation does (:mod:`bisect_eagle.search.study.confirm`):
``search.confirm.first_rounds`` while the split of the noise between rounds and launches is
unmeasured, then :func:`~bisect_eagle.stats.best_rounds` of the split measured on the bisect's own
launches, at most ``search.confirm.max_rounds``. Rounds average away the noise that lives in them;
the launch noise needs launches.

The bisect's budget is ``max_launches`` launches (and as many looks,
:mod:`~bisect_eagle.bisect.judge`): once it is spent no configuration is launched or judged again,
and what is not known stays UNRESOLVED.

Every probe that is not replayed gets a child run of the bisect: the trial's own run when measured,
else a small run pointing (tag ``cached_from``) at the run measured before. Each is tagged
``bisect_applied`` and ``bisect_outcome``. The log is rewritten after every probe.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from bisect_eagle.bisect.changes import Change, FlatPlanner, apply_changes
from bisect_eagle.bisect.ddmin import Answer, BisectProgress, ChangeSet, ProbeOutcome
from bisect_eagle.bisect.endpoints import resolved_wiring
from bisect_eagle.bisect.judge import STANDALONE_METRIC, Judge
from bisect_eagle.bisect.log import BisectLog
from bisect_eagle.bisect.measurement import Measurement, ProbeRecord, launch_detail
from bisect_eagle.engines.base import TrialResult
from bisect_eagle.engines.plan import TrialPlan, make_plan
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.spec.schema import Spec, settings_from
from bisect_eagle.spec.settings import PINNED
from bisect_eagle.stats import best_rounds, median_mad, variance_split
from bisect_eagle.trials.context import TrialContext
from bisect_eagle.trials.live import run_live_trial
from bisect_eagle.trials.record import TrialRecord, find_cached

SAMPLES_ARTIFACT = "bisect_samples.json"


def make_planner(spec: Spec, plan: Callable[[Any], TrialPlan] | None) -> FlatPlanner:
    """Flat settings -> a plan: the engine's (``plan``), or for standalone probes the wiring
    alone."""

    def planner(flat: dict[str, Any]) -> TrialPlan:
        """The plan of one configuration given as flat settings.

        Args:
            flat: setting name -> value of the configuration.

        Returns:
            ``plan``'s plan of its settings, or without ``plan`` a standalone plan of its wiring.
        """
        settings = settings_from(flat, "bisect probe")
        if plan is not None:
            return plan(settings)
        return make_plan("standalone", settings, effective={IDS_KEY: resolved_wiring(flat, spec)})

    return planner


class Prober:
    """Answers :func:`~bisect_eagle.bisect.ddmin.find_culprits` (see the module docstring)."""

    def __init__(
        self,
        *,
        ctx: TrialContext,
        base: dict[str, Any],
        changes: list[Change],
        judge: Judge,
        planner: FlatPlanner,
        log: BisectLog,
        log_path: Path,
        replayed: dict[ChangeSet, tuple[ProbeOutcome, str]],
        scrub: Callable[[str], str],
        progress: BisectProgress | None = None,
        inert: list[Change] | None = None,
        max_launches: int | None = None,
    ):
        """``inert``: the requested differences that are not changes; a configuration may still
        apply them (the bad configuration as it is, when an answer is verified). ``max_launches``:
        the bisect's launch budget (None: none)."""
        self.ctx, self.base, self.judge, self.planner = ctx, base, judge, planner
        self.changes = {c.name: c for c in [*changes, *(inert or [])]}
        self.order = [c.name for c in [*changes, *(inert or [])]]
        # a configuration holding them all is the bad endpoint
        self.searched = frozenset(c.name for c in changes)
        self.log, self.log_path, self.replayed = log, log_path, dict(replayed)
        self.scrub, self.progress = scrub, progress
        self.seen: dict[str, Measurement] = {}
        # per configuration, one per time it was asked
        self.records: dict[ChangeSet, list[ProbeRecord]] = {}
        self.reference: Measurement | None = None
        self.measured = 0  # distinct plans measured (live or standalone trials started)
        self.samples = 0  # engine runs (launches)
        self.max_launches = max_launches
        self.budget_hit = False  # a launch or a look was refused for the budget
        self._dirty: set[str] = set()
        self._scorer = None

    @property
    def standalone(self) -> bool:
        return self.judge.metric == STANDALONE_METRIC

    def spent(self) -> bool:
        """Whether the bisect's budget is spent: its launches, or the judge's looks."""
        launches = self.max_launches is not None and self.samples >= self.max_launches
        return launches or self.judge.looks >= self.judge.comparisons

    def record(self, config: ChangeSet, time: int) -> ProbeRecord:
        """The record of the ``time``-th answer (0-based) about ``config`` (a verification asks
        again).

        Args:
            config: the probed configuration (changes applied to the good one).
            time: which answer, 0-based; past the last record, the last one.

        Returns:
            The logged record, or a bare ``ProbeRecord("replay")`` when none was logged.
        """
        records = self.records.get(config) or [ProbeRecord("replay")]
        return records[min(time, len(records) - 1)]

    def applied(self, config: ChangeSet) -> str:
        return ",".join(n for n in self.order if n in config) or "-"

    def plan(self, config: ChangeSet, *, pinned: list[float] | None = None) -> TrialPlan:
        """The plan of ``config`` (names applied to the good configuration); ``pinned``: with
        acceptance pinned to these unconditional rates (``pinned_acceptance``).

        Args:
            config: names of the changes to apply (applied in the bisect's change order).
            pinned: per-position unconditional acceptance rates to pin, or None to leave
                acceptance free.

        Returns:
            The planner's plan of the resulting settings.
        """
        chosen = [self.changes[n] for n in self.order if n in config]
        flat = apply_changes(self.base, chosen)
        return self.planner(flat if pinned is None else {**flat, PINNED: list(pinned)})

    def measurement(self, config: ChangeSet) -> Measurement | None:
        """The measurement ``config`` planned to in this bisect, if it was probed."""
        return self.seen.get(self.plan(config).fingerprint)

    def probe_pinned(
        self, config: ChangeSet, rates: list[float]
    ) -> tuple[ProbeOutcome, Measurement | None, str]:
        """``config`` with acceptance pinned to ``rates``, judged as a probe is (its own plan,
        fingerprint, samples and child run, within the budget), but outside the search: not in the
        bisect's log or its probes.

        Returns:
            (the verdict, the measurement or None when it could not even be planned, why).
        """
        self.ctx.run_id = None
        try:
            rec = self._probe(config, pinned=rates)
            m = rec.measurement
            assert m is not None
            outcome, what = self._decide(m, endpoint=False)
        except Exception as e:  # as a probe: a pinned probe that cannot run is unresolved
            reason = str(e).splitlines()[0] if str(e) else ""
            rec, m = ProbeRecord("measured", child_run_id=self.ctx.run_id), None
            outcome, what = ProbeOutcome.UNRESOLVED, f"could not run: {type(e).__name__}: {reason}"
        self._flush()
        what = self.scrub(what)
        if rec.child_run_id:
            self.ctx.tracking.log(
                rec.child_run_id,
                tags={
                    "bisect_outcome": outcome.name,
                    "bisect_detail": what,
                    "role": "bisect-side-probe",
                },
            )
        if self.progress:
            self.progress(
                self.scrub(
                    f"pinned probe: changes applied: {self.applied(config)}, acceptance pinned -> "
                    f"{outcome.name} ({what})"
                )
            )
        return outcome, m, what

    def __call__(self, config: ChangeSet) -> Answer:
        if config in self.replayed:
            outcome, note = self.replayed[config]
            self.records.setdefault(config, []).append(ProbeRecord("replay"))
            return self._done(
                config, Answer(outcome, f"replayed: {note}" if note else "replayed", cached=True)
            )
        if self.judge.relative and self.judge.reference is None and config:
            self._reference()
        endpoint = not config or self.searched <= config
        self.ctx.run_id = None
        outcome, what = ProbeOutcome.UNRESOLVED, ""
        try:
            rec = self._probe(config)
            m = rec.measurement
            assert m is not None
            if not m.failure:
                if not config and self.judge.relative and self.judge.reference is None:
                    self.reference = m
                    self.judge.reference = m.samples  # the same list: the limit follows new samples
                    self.judge.reference_requests = m.requests
                outcome, what = self._decide(m, endpoint=endpoint)
        # a probe that cannot even run is unresolved, never the end of the bisect
        except Exception as e:
            reason = str(e).splitlines()[0] if str(e) else ""
            rec = ProbeRecord(
                "measured",
                child_run_id=self.ctx.run_id,
                failure=f"could not run: {type(e).__name__}: {reason}",
            )
        self._flush()
        self.records.setdefault(config, []).append(rec)
        m = rec.measurement
        failure = rec.failure or (m.failure if m else "")
        if failure:
            answer = Answer(
                ProbeOutcome.UNRESOLVED, self.scrub(failure), cached=rec.source != "measured"
            )
        else:
            where = f"; {rec.source} run {m.run_id}" if m and m.run_id else ""
            answer = Answer(outcome, self.scrub(what + where), cached=rec.source != "measured")
        if rec.child_run_id:
            self.ctx.tracking.log(
                rec.child_run_id,
                tags={"bisect_outcome": answer.outcome.name, "bisect_detail": answer.detail},
            )
        return self._done(config, answer)

    def _done(self, config: ChangeSet, answer: Answer) -> Answer:
        applied = tuple(n for n in self.order if n in config)
        self.log.marks.append((answer.outcome, applied, answer.detail))
        if self.judge.reference:
            self.log.reference = {"samples": list(self.judge.reference)}
        self.log.noise = self.judge.noise.to_json()
        self.log.write(self.log_path)
        if self.progress:
            label = ", ".join(applied) or "none (the good configuration)"
            self.progress(
                self.scrub(
                    f"probe {len(self.log.marks)}: changes applied: {label} -> "
                    f"{answer.outcome.name} ({answer.detail})"
                )
            )
        return answer

    def _reference(self) -> None:
        """Measure the good configuration first (ratio mode) when a probe needs the limit before
        it."""
        self.replayed.pop(frozenset(), None)
        answer = self(frozenset())
        if self.judge.reference is None:
            raise BadInput(
                f"the good configuration could not be measured ({answer.detail}); nothing to "
                "compare with"
            )

    # -- samples
    # ------------------------------------------------------------------------------------

    def _decide(self, m: Measurement, *, endpoint: bool) -> tuple[ProbeOutcome, str]:
        """Sample ``m`` on the judge's schedule until it is GOOD or BAD or its budget is spent; a
        measurement judged before with the samples it has now (and the reference's) keeps its
        verdict (no new look)."""
        ref = self.reference if self.judge.relative and m is not self.reference else None
        if m.failure:
            return ProbeOutcome.UNRESOLVED, m.failure
        now = (len(m.samples), len(ref.samples) if ref else 0)
        if m.verdict is not None and (
            m.verdict.outcome is not ProbeOutcome.UNRESOLVED or now == m.judged_at
        ):
            return m.verdict.outcome, m.verdict.detail
        first, _ = self.judge.budget(endpoint=endpoint)

        # after an UNRESOLVED look, one reference launch per launch of it: A B A B
        def more(n: int) -> bool:
            unresolved = ref is not None and len(m.samples) >= first
            ref_to = (
                min(len(ref.samples) + n - len(m.samples), self.judge.budget(endpoint=True)[1])
                if ref is not None and unresolved
                else 0
            )
            self._sample_to(m, n, ref=ref if unresolved else None, ref_to=ref_to)
            return not m.failure and len(m.samples) >= n

        verdict = self.judge.decide(
            m.samples,
            key=m.fingerprint,
            endpoint=endpoint,
            more=more,
            is_reference=m is self.reference,
            requests=m.requests or None,
        )
        if m.failure:
            return ProbeOutcome.UNRESOLVED, m.failure
        m.verdict, m.judged_at = verdict, (len(m.samples), len(ref.samples) if ref else 0)
        return verdict.outcome, verdict.detail

    def _sample_to(
        self, m: Measurement, n: int, *, ref: Measurement | None = None, ref_to: int = 0
    ) -> None:
        """Sample ``m`` up to ``n`` samples (and ``ref`` up to ``ref_to``), interleaved: m, ref, m,
        ref, ...; never beyond the launch budget."""
        while not m.failure and (
            len(m.samples) < n or (ref is not None and len(ref.samples) < ref_to)
        ):
            if self.spent():
                self.budget_hit = True
                return
            if len(m.samples) < n:
                self._sample(m)
            if (
                ref is not None
                and len(ref.samples) < ref_to
                and not m.failure
                and not self.spent()
                and not self._sample(ref, probe=False)
            ):
                ref = None  # the reference stopped running: keep judging against what it has

    def rounds(self) -> int:
        """Benchmark rounds for the next launch: 1 where rounds do not share a launch, else from the
        noise split measured on this bisect's launches (module docstring).

        Returns:
            The number of rounds, at least 1 and at most ``search.confirm.max_rounds``.
        """
        engine = self.ctx.engine
        confirm = self.ctx.spec.search.confirm
        if (
            engine is None
            or not getattr(engine, "rounds_share_launch", False)
            or confirm.max_rounds == 1
        ):
            return 1
        launches, costs = [], []
        for m in self.seen.values():
            for i, value in enumerate(m.samples[len(m.samples) - len(m.rounds) :]):
                if value > 0:
                    launches.append((m.fingerprint, math.log(value), m.rounds[i], m.round_sd[i]))
        sigma_r2, sigma_l2 = variance_split(launches)
        last = getattr(engine, "last", None)
        if last is not None and last.launch_s and last.wall_s:
            costs.append(last.launch_s / (last.wall_s / max(1, last.rounds)))
        return best_rounds(
            sigma_r2=sigma_r2,
            sigma_l2=sigma_l2,
            cost_ratio=costs[0] if costs else 1.0,
            first=confirm.first_rounds,
            most=confirm.max_rounds,
        )

    def _sample(self, m: Measurement, *, probe: bool = True) -> bool:
        """One more launch of ``m``'s plan; a failure ends ``m``'s sampling (and marks it, for a
        probe)."""
        if self.ctx.engine is None or m.plan is None:
            m.failure = m.failure or "no engine to sample it again"
            return False
        rounds = self.rounds()
        try:
            result = (
                self.ctx.engine.run(m.plan)
                if rounds == 1
                else self.ctx.engine.run_rounds(m.plan, rounds=rounds)
            )
        except Exception as e:
            reason = str(e).splitlines()[0] if str(e) else ""
            detail = f"sample {len(m.samples) + 1} could not run: {type(e).__name__}: {reason}"
        else:
            if result.ok:
                self._add(m, result)
                self.samples += 1
                self._dirty.add(m.fingerprint)
                return True
            detail = (
                f"sample {len(m.samples) + 1} failed ({result.failure_class}): "
                f"{result.failure_detail}"
            )
        self.samples += 1
        if probe:
            m.failure = detail
        elif self.progress:
            self.progress(
                self.scrub(
                    f"the good configuration stopped running ({detail}); judging against its "
                    f"{len(m.samples)} samples"
                )
            )
        return False

    def _add(self, m: Measurement, result: TrialResult) -> None:
        """A launch's value, rounds and per-request tok/s onto ``m``."""
        m.samples.append(float(getattr(result, self.judge.metric)))
        launch_detail(m, result, self.judge.metric)

    def _flush(self) -> None:
        """Record the samples taken during this probe on each measurement's run."""
        metric = self.judge.metric
        for fp in sorted(self._dirty):
            m = self.seen[fp]
            if m.log_run_id is None or not m.samples:
                continue
            med, mad = median_mad(m.samples)
            self.ctx.tracking.log(
                m.log_run_id,
                metrics={metric: med, f"{metric}_mad": mad, "repeats": float(len(m.samples))},
            )
            self.ctx.tracking.log_texts(
                m.log_run_id,
                {
                    SAMPLES_ARTIFACT: json.dumps(
                        {"metric": metric, "fingerprint": fp, "samples": m.samples}
                    )
                },
            )
        self._dirty.clear()

    # -- the first sample: memory, the MLflow store, or a new trial
    # -------------------------------------

    def _probe(self, config: ChangeSet, *, pinned: list[float] | None = None) -> ProbeRecord:
        plan = self.plan(config, pinned=pinned)
        fp = plan.fingerprint
        if fp in self.seen:
            m = self.seen[fp]
            return ProbeRecord("memory", self._pointer(m, "memory", config), m)
        if self.standalone:
            return self._standalone(plan, config)
        found = self._cached(fp)
        if found is not None:
            m = found
            m.plan = plan
            m.log_run_id = self._pointer(m, "cache", config)
            self.seen[fp] = m
            return ProbeRecord("cache", m.log_run_id, m)
        if plan.refusal is None and self.spent():
            self.budget_hit = True
            m = Measurement(
                fp, "measured", plan, failure="not measured: the launch budget is spent"
            )
            return ProbeRecord("measured", None, m)
        self.measured += 1
        self.samples += plan.refusal is None  # a refused plan is recorded, never run
        rounds = self.rounds()
        engine = self.ctx.engine
        if engine is not None and hasattr(engine, "last"):
            engine.last = None
        pin = " (acceptance pinned)" if pinned is not None else ""
        trial = run_live_trial(
            self.ctx,
            plan,
            stage="live",
            parent_run_id=self.ctx.parent_run_id,
            tags={"bisect_applied": self.applied(config)},
            label=f"probe {self.measured:02d} +{self.applied(config)}{pin}",
            rounds=rounds,
        )
        m = self._from_trial(trial, plan.effective, "measured")
        m.plan, m.log_run_id = plan, trial.run_id
        last = getattr(engine, "last", None)
        if m.samples and last is not None and last.ok:
            launch_detail(m, last, self.judge.metric)
        self.seen[fp] = m
        self._dirty.add(fp)
        return ProbeRecord("measured", trial.run_id, m)

    def _from_trial(
        self,
        trial: TrialRecord,
        effective: dict[str, Any],
        source: Literal["measured", "cache"],
        samples: list[float] | None = None,
    ) -> Measurement:
        ok = trial.status == "ok"
        value = trial.metrics.get(self.judge.metric)
        if samples is None:
            samples = [float(value)] if ok and value is not None else []
        failure = "" if ok else f"failed ({trial.failure_class}): {trial.failure_detail}"
        if ok and not samples:
            failure = f"the trial has no {self.judge.metric}"
        return Measurement(
            trial.fingerprint,
            source,
            run_id=trial.run_id,
            samples=samples,
            metrics=dict(trial.metrics),
            effective=trial.effective or effective,
            failure=failure,
        )

    def _cached(self, fp: str) -> Measurement | None:
        """A stored trial of this fingerprint with this judge's metric (its samples when a bisect
        recorded them)."""
        record = find_cached(self.ctx.tracking, fp)
        if record is None or record.status == "pruned":
            return None
        if record.status == "failed":
            return self._from_trial(record, record.effective, "cache")
        if self.judge.metric not in record.metrics:
            return None
        samples = None
        try:
            stored = json.loads(self.ctx.tracking.read_text(record.run_id, SAMPLES_ARTIFACT))
            if stored.get("metric") == self.judge.metric and stored.get("samples"):
                samples = [float(v) for v in stored["samples"]]
        except Exception:  # no samples recorded: the trial's own value is one sample
            samples = None
        return self._from_trial(record, record.effective, "cache", samples)

    def _pointer(self, m: Measurement, source: str, config: ChangeSet) -> str:
        """A child run of the bisect for a probe answered by an earlier measurement."""
        t = self.ctx.tracking
        child = t.start_run(
            f"bisect probe {self.applied(config)} ({source})",
            tags={
                "stage": "bisect-cached",
                "fingerprint": m.fingerprint,
                "cached_from": str(m.run_id),
                "bisect_applied": self.applied(config),
            },
            parent_run_id=self.ctx.parent_run_id,
        )
        t.log(child, metrics=m.metrics)
        t.finish(child, "FINISHED")
        return child

    def _standalone(self, plan: TrialPlan, config: ChangeSet) -> ProbeRecord:
        """Standalone accuracy of the configuration's wiring (the plan holds only the wiring)."""
        from bisect_eagle.spec.schema import Wiring
        from bisect_eagle.trials.standalone import Scorer, candidates, run_standalone_trial

        spec = self.ctx.spec
        if self._scorer is None:
            self._scorer = Scorer(spec)
        ids = plan.effective[IDS_KEY]
        one = spec.model_copy(
            update={
                "standalone": spec.standalone.model_copy(
                    update={"wirings": [Wiring(layer_ids=ids)]}
                )
            }
        )
        self.measured += 1
        verdict = run_standalone_trial(
            self.ctx, self._scorer, candidate=candidates(one, self._scorer.num_layers)[0]
        )
        m = Measurement(
            plan.fingerprint,
            "measured",
            plan,
            verdict.run_id,
            verdict.run_id,
            [verdict.accuracy],
            {STANDALONE_METRIC: verdict.accuracy},
            {IDS_KEY: ids},
        )
        self.seen[plan.fingerprint] = m
        return ProbeRecord("measured", verdict.run_id, m)
