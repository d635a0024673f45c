"""The schema of a trial's MLflow run, written and read in one place.

A live trial's run carries: params = the plan's effective settings (with ``requested.*`` beside the
ones the engine changed), tags (``stage``, ``trial``: its one name (:func:`trial_name`),
``trial_number`` in a study, ``fingerprint``, ``outcome``, ``value``, ``effective`` when it fits a
tag, failure class and detail, warnings, the display tags ``shown.<metric>``: the headline metrics
and their ratios rounded for a person, :func:`shown_tags`), metrics (the criterion's median over
repeats and its MAD, the ratios to the baseline, the per-position acceptance as one curve,
``launches``: the engine runs the trial made, :mod:`bisect_eagle.trials.launches`), and the artifact
``trial.json``, which holds each fact once: ``plan`` (the engine's plan: requested, effective,
fingerprint, warnings, refusal, launch) and ``repeats`` (what each measurement returned, without the
settings the plan already states). Readers (:func:`find_cached`, :func:`effective_of`,
:func:`settings_of_run`, :func:`spec_of_study`, :func:`live_trial_name`, the model's inputs) use
only this module; so does its writer: :func:`trial_run` is a live trial's run as one block, opened
before its engine runs and written when it ends.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import statistics
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from bisect_eagle.engines.base import TrialResult
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.spec.schema import PATH_KEYS, Spec, settings_from
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.stats import median_mad
from bisect_eagle.tracking.redact import Scrubber
from bisect_eagle.tracking.runs import NOTE, PARENT_TAG, TAG_LIMIT, RunEnd, Tracking
from bisect_eagle.tracking.sysmetrics import PREFIX as SYSTEM_PREFIX
from bisect_eagle.trials.context import TrialContext
from bisect_eagle.trials.launches import LAUNCHES

STATUS = {"ok": "FINISHED", "failed": "FAILED", "pruned": "KILLED"}
# the engines' per-position acceptance, logged as one curve below
POSITION_METRIC = "accept_rate_pos_"
ACCEPT_CURVE = "accept_rate_per_position"  # step = draft position
TRIAL_JSON = "trial.json"
# a trial run's one name (trial_name): the CLI's tables, report and the UI call it so
TRIAL_TAG = "trial"
NUMBERED = "{stage} {number:03d}"  # a study's numbered trial's name (trial_name): ``live 003``
NUMBER_TAG = "trial_number"  # a study's live trial: its Optuna trial number
# a trial's headline metrics, each with its ratio to the baseline
HEADLINE = ("accept_length", "output_tok_s")
# + a headline metric or its ratio: the value rounded for a person (the metric stays exact)
SHOWN_TAG = "shown."


def ratio_name(metric: str) -> str:
    """The one name of a metric's ratio to the baseline: ``output_tok_s_ratio_to_baseline``.

    Args:
        metric: the metric's name (``output_tok_s``).

    Returns:
        ``f"{metric}_ratio_to_baseline"``.
    """
    return f"{metric}_ratio_to_baseline"


def short_number(value: float) -> str:
    """A metric for a person, the one way every table writes it: 3 significant digits, one decimal
    from 100 up.

    Args:
        value: the metric's value.

    Returns:
        ``"75.2"``, ``"123.4"``, ``"0.0123"`` (``nan`` and ``inf`` as Python formats them).
    """
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.3g}"


def shown_tags(metrics: Mapping[str, float]) -> dict[str, str]:
    """The display tags of a trial's headline metrics and their ratios to the baseline, those it has
    and finite, as the CLI's tables write them: ``shown.output_tok_s`` = ``75.2`` (3 significant
    digits, one decimal from 100 up), ``shown.output_tok_s_ratio_to_baseline`` = ``1.04×`` (two
    decimals). MLflow's runs table shows a metric as logged (``4.800000190734863``) and has no
    number format; these tags are for the eye, the metrics stay exact."""
    tags: dict[str, str] = {}
    for name in HEADLINE:
        value, ratio = metrics.get(name), metrics.get(ratio_name(name))
        if value is not None and math.isfinite(value):
            tags[SHOWN_TAG + name] = short_number(value)
        if ratio is not None and math.isfinite(ratio):
            tags[SHOWN_TAG + ratio_name(name)] = f"{ratio:.2f}×"
    return tags


def deployment_paths(spec: Spec) -> dict[str, Path]:
    """The spec's target, draft, dump and prompts (those it names).

    Args:
        spec: a spec.

    Returns:
        Key (``target``, ``draft``, ``dump``, ``prompts``) → path as the spec holds it; keys it does
        not name are left out.
    """
    return {k: Path(v) for k in PATH_KEYS if (v := getattr(spec, k, None)) is not None}


def deployment_tags(spec: Spec) -> dict[str, str]:
    """The spec's target, draft, dump and prompts as run tags (``target``: its absolute path).

    Args:
        spec: a spec.

    Returns:
        Key → resolved absolute path as text, for the keys :func:`deployment_paths` gives.
    """
    return {k: str(v.resolve()) for k, v in deployment_paths(spec).items()}


@dataclass(kw_only=True)
class TrialRecord:
    """The outcome of one trial (measured now, or found in the store)."""

    fingerprint: str
    stage: str
    status: Literal["ok", "failed", "pruned"]
    value: float | None  # the criterion metric (median over repeats)
    metrics: dict[str, float]
    effective: dict[str, Any]
    run_id: str
    name: str = ""  # trial_name (its ``trial`` tag; empty for a run logged before the tag existed)
    cached: bool = False
    failure_class: str | None = None
    failure_detail: str | None = None
    warnings: list[str] = field(default_factory=list)
    engine_s: float = 0.0  # seconds inside engine.run
    wall_s: float = 0.0  # seconds in run_live_trial

    def to_json(self) -> dict[str, Any]:
        """The record as plain data (a bisect's report entry, ``--json``).

        Returns:
            Every field by name (``dataclasses.asdict``).
        """
        return asdict(self)


def _effective_tag(effective: dict[str, Any]) -> dict[str, str]:
    """The effective settings as a run tag when they fit one (else only in ``trial.json``)."""
    text = json.dumps(effective, sort_keys=True)
    return {"effective": text} if len(text) <= TAG_LIMIT else {}


def read_trial(tracking: Tracking, run_id: str) -> dict[str, Any]:
    """A trial run's ``trial.json``: ``{"plan": ..., "repeats": [...]}``.

    Raises:
        BadInput: the run has none: it was killed (or failed) before the trial was recorded; the
            message says so.
    """
    try:
        return json.loads(tracking.read_text(run_id, TRIAL_JSON))
    except Exception as e:  # MLflow raises its own errors for a missing artifact, by store
        status = tracking.get_run(run_id).info.status
        raise BadInput(
            f"run {run_id}: no readable {TRIAL_JSON} (the run ended {status} before its trial was "
            f"recorded: killed with its controller?); nothing to read back ({type(e).__name__})"
        ) from None


def trial_failure(run) -> str | None:
    """Why a logged trial did not measure ok (its status and failure class), or None when it did.

    Args:
        run: the trial's MLflow run.

    Returns:
        One phrase (``the trial ended FAILED (failed), failure class X: detail``, the detail cut at
        200 characters); None for a FINISHED run tagged ``outcome=ok``.
    """
    tags = run.data.tags
    if run.info.status == "FINISHED" and tags.get("outcome") == "ok":
        return None
    cls = tags.get("failure_class")
    detail = " ".join((tags.get("failure_detail") or "").split())[:200]
    return (
        f"the trial ended {run.info.status}"
        + (f" ({tags['outcome']})" if tags.get("outcome") else "")
        + (f", failure class {cls}: {detail}" if cls else "")
    )


def effective_of(tracking: Tracking, run) -> dict[str, Any]:
    """A live run's effective settings: its tag, else its ``trial.json``.

    Args:
        tracking: the run's store (read when the settings did not fit a tag).
        run: the trial's MLflow run.

    Returns:
        The plan's effective settings (redacted).

    Raises:
        BadInput: no ``effective`` tag and no readable ``trial.json`` (:func:`read_trial`).
    """
    if "effective" in run.data.tags:
        return json.loads(run.data.tags["effective"])
    return read_trial(tracking, run.info.run_id)["plan"]["effective"]


def requested_of(tracking: Tracking, run_id: str) -> dict[str, Any]:
    """The settings a logged trial requested explicitly (redacted), from its ``trial.json``."""
    return read_trial(tracking, run_id)["plan"]["requested"]


def run_metrics(run) -> dict[str, float]:
    """A trial run's own metrics: without the ``system/*`` samples MLflow's system-metrics monitor
    adds.

    Args:
        run: the trial's MLflow run.

    Returns:
        Metric name → latest value, ``system/*`` left out.
    """
    return {k: v for k, v in run.data.metrics.items() if not k.startswith(SYSTEM_PREFIX)}


def find_cached(
    tracking: Tracking, fingerprint: str, *, parent_run_id: str | None = None
) -> TrialRecord | None:
    """A finished live or baseline trial with this fingerprint (newest first), as a record; None if
    absent.

    Args:
        tracking: the store to search.
        fingerprint: the plan's fingerprint.
        parent_run_id: only trials under this parent run (a study); None: any study's.

    Returns:
        The newest reusable run (:meth:`~bisect_eagle.tracking.runs.Tracking.find_fingerprint`) as a
        record with ``cached=True``; None when there is none.

    Raises:
        BadInput: the run found has no ``effective`` tag and no readable ``trial.json``.
    """
    run = tracking.find_fingerprint(fingerprint, parent_run_id=parent_run_id)
    return None if run is None else cached_record(tracking, run, fingerprint)


def cached_record(tracking: Tracking, run, fingerprint: str) -> TrialRecord:
    """A finished trial's run (an mlflow Run) as a record with ``cached=True``.

    Args:
        tracking: the run's store (read when the run has no ``effective`` tag).
        run: the finished run.
        fingerprint: its plan's fingerprint.

    Returns:
        The record: its stage, outcome, value, metrics, effective settings, name and failure.

    Raises:
        BadInput: the run has no ``effective`` tag and no readable ``trial.json``.
    """
    tags = run.data.tags
    value = tags.get("value")
    return TrialRecord(
        fingerprint=fingerprint,
        stage=tags.get("stage", ""),
        status=tags["outcome"],
        value=float(value) if value not in (None, "None") else None,
        metrics=run_metrics(run),
        effective=effective_of(tracking, run),
        run_id=run.info.run_id,
        name=tags.get(TRIAL_TAG, ""),
        cached=True,
        failure_class=tags.get("failure_class"),
        failure_detail=tags.get("failure_detail"),
    )


def trial_name(
    stage: str,
    *,
    number: int | None = None,
    label: str | None = None,
    tags: Mapping[str, str] | None = None,
    of: str | None = None,
) -> str:
    """The one name of a trial: its ``trial`` tag, the head of its run name (:func:`run_name`), the
    ``name`` user attribute of its Optuna trial, and what ``run``'s tables and ``report`` call it.

    - a study's live trial: ``live 003``, ``number`` being its Optuna trial number
      (optuna-dashboard's ``number=3``);
    - a study's baseline (stage ``baseline``): ``baseline``, once per study;
    - a confirmation measurement (stage ``confirm``): ``confirm 1 candidate live 003`` or ``confirm
      1 baseline``, from ``tags`` as the confirmation step sets them (``confirm_pair``: the pair's
      0-based index, shown from 1; ``confirm_role``; each left out when absent) and ``of``, the name
      of the trial a candidate re-measures (left out when None);
    - ``label`` as given (a bisect's ``probe 04 +num_steps``);
    - else the stage (``live``: one trial of ``bisect-eagle live``; ``reproduce``).

    Args:
        stage: the trial's stage tag (``live``, ``baseline``, ``confirm``, ``reproduce``, ...).
        number: a study's live trial's Optuna trial number.
        label: a name given whole; it wins over everything else.
        tags: a confirmation's tags (``confirm_pair``, ``confirm_role``).
        of: the name of the trial a confirmation candidate re-measures.

    Returns:
        The name, by the first rule above that applies.
    """
    if label is not None:
        return label
    if stage == "confirm":
        tags = tags or {}
        pair, role = tags.get("confirm_pair"), tags.get("confirm_role")
        return " ".join(
            [
                "confirm",
                *([str(int(pair) + 1)] if pair is not None else []),
                *([role] if role else []),
                *([of] if role == "candidate" and of else []),
            ]
        )
    return NUMBERED.format(stage=stage, number=number) if number is not None else stage


def run_name(name: str, stage: str, effective: dict[str, Any]) -> str:
    """A trial's MLflow run name: its :func:`trial_name`, then what it ran where the name does not
    say it (``live 003 ids=1,5,9 steps=3 topk=1``, ``probe 04 +num_steps no speculation``); a
    baseline's and a confirmation measurement's name alone (``baseline``, ``confirm 2 baseline``:
    the candidate's settings are its trial's).

    Args:
        name: the trial's :func:`trial_name`.
        stage: the trial's stage tag.
        effective: the plan's effective settings (``speculative_algorithm``, the layer ids,
            ``num_steps``, ``topk`` are read).

    Returns:
        The run name.
    """
    if stage in ("baseline", "confirm"):
        return name
    if effective.get("speculative_algorithm") == "none":
        return f"{name} no speculation"
    ids = effective.get(IDS_KEY)
    wiring = "server-default" if ids is None else ",".join(str(i) for i in ids)
    return f"{name} ids={wiring} steps={effective.get('num_steps')} topk={effective.get('topk')}"


def live_trial_name(tracking: Tracking, fingerprint: str, *, parent_run_id: str) -> str | None:
    """The name (``trial`` tag) of the study's finished live trial of ``fingerprint``; None when it
    has none."""
    run = tracking.find_fingerprint(fingerprint, stages=("live",), parent_run_id=parent_run_id)
    return None if run is None else run.data.tags.get(TRIAL_TAG)


def scrubber_for(plan: TrialPlan) -> Scrubber:
    """Scrubs the controller's and this trial's secret values (env, server args) from free text."""
    return Scrubber({"env": plan.settings.env, "server_args": plan.settings.server_args})


def _requests_csv(results: list[TrialResult]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(
        [
            "repeat",
            "id",
            "prompt_tokens",
            "completion_tokens",
            "verify_steps",
            "accept_length",
            "latency_s",
        ]
    )
    for i, r in enumerate(results):
        for q in r.requests:
            w.writerow(
                [
                    i,
                    q.id,
                    q.prompt_tokens,
                    q.completion_tokens,
                    q.verify_steps,
                    q.accept_length,
                    q.latency_s,
                ]
            )
    return buf.getvalue()


def trial_description(record: TrialRecord, plan: TrialPlan, *, metric: str, launches: int) -> str:
    """A trial run's markdown description, what its MLflow page shows first: what ran and what it
    measured (the criterion metric first, each headline metric with its ratio to the baseline), or
    why it failed."""
    head = f"**{record.stage.capitalize()} trial `{record.name or record.stage}`**: {record.status}"
    if record.status == "failed":
        lines = [
            head,
            "",
            f"Failed ({record.failure_class}): {record.failure_detail or 'no detail'}",
        ]
    else:
        shown = []
        for name in dict.fromkeys([metric, *HEADLINE]):
            value, ratio = record.metrics.get(name), record.metrics.get(ratio_name(name))
            if value is not None and math.isfinite(value):
                times = (
                    f" ({ratio:.2f}× the baseline)"
                    if ratio is not None and math.isfinite(ratio)
                    else ""
                )
                shown.append(f"{name} {short_number(value)}{times}")
        lines = [
            head,
            "",
            f"{'; '.join(shown) or 'no metric'}, over {launches} "
            f"launch{'' if launches == 1 else 'es'} (criterion: {metric}).",
        ]
    pinned = (
        " Acceptance was pinned: its tok/s measures the cost side alone."
        if plan.acceptance == "pinned"
        else ""
    )
    lines += [
        "",
        f"Engine {plan.engine}; the effective settings are its parameters (`requested.*`: where "
        f"the request differed), the plan and each launch in `{TRIAL_JSON}`.{pinned}",
    ]
    return "\n".join(lines)


def result_end(
    plan: TrialPlan, record: TrialRecord, results: list[TrialResult], *, metric: str
) -> RunEnd:
    """What a measured (or refused) trial's run ends with.

    Args:
        plan: the plan the trial ran (its ``trial.json``; its secrets scrub every text written).
        record: the trial's outcome.
        results: what each launch returned (empty for a refused plan).
        metric: the criterion metric, named first in the run's description.

    Returns:
        The run's end: its metrics (exact), outcome tags, the display tags of the headline metrics
        (:func:`shown_tags`), its artifacts, the per-position acceptance curve, its final status
        and, for a failed trial, its name's suffix.
    """
    scrub = scrubber_for(plan)
    files = {
        TRIAL_JSON: json.dumps(
            {"plan": plan.to_json(), "repeats": [_repeat(r) for r in results]},
            indent=2,
            default=str,
        ),
    }
    if any(r.requests for r in results):
        files["requests.csv"] = _requests_csv(results)
    for name, text in results[-1].artifacts.items() if results else ():
        files[name] = text
    tags = {
        "outcome": record.status,
        "value": str(record.value),
        "acceptance": plan.acceptance,
        NOTE: scrub(trial_description(record, plan, metric=metric, launches=len(results))),
        **shown_tags(record.metrics),
    }
    if record.failure_class:
        tags["failure_class"] = record.failure_class
        tags["failure_detail"] = scrub(record.failure_detail or "")
    if record.warnings:
        tags["warnings"] = scrub(" | ".join(record.warnings))
    curve = {k: v for k, v in record.metrics.items() if k.startswith(POSITION_METRIC)}
    metrics = {
        **{k: v for k, v in record.metrics.items() if k not in curve},
        LAUNCHES: float(len(results)),
    }
    positions = sorted(curve, key=lambda k: int(k[len(POSITION_METRIC) :]))
    return RunEnd(
        status=STATUS[record.status],
        texts={k: scrub(v) for k, v in files.items()},
        metrics=metrics,
        tags=tags,
        curves={ACCEPT_CURVE: [curve[k] for k in positions]},
        name_suffix=f" [failed: {record.failure_class}]" if record.failure_class else "",
    )


@dataclass(kw_only=True)
class Trial:
    """A live trial inside :func:`trial_run`'s block.

    :func:`trial_run` sets ``cached`` (a finished trial found in the store: nothing else is set) or
    ``run_id`` and ``name`` (the started run) before the block; the block sets what the engine
    returned (``results``, ``pruned``, ``engine_s``); ``record`` is set when the block ends.
    """

    cached: TrialRecord | None = None
    run_id: str = ""
    name: str = ""  # the trial's trial_name
    results: list[TrialResult] = field(default_factory=list)  # one per launch; empty: refused
    pruned: bool = False  # the first launch measured below search.prune_below of the target
    engine_s: float = 0.0  # the seconds inside the engine
    record: TrialRecord | None = None


@contextlib.contextmanager
def trial_run(
    ctx: TrialContext,
    plan: TrialPlan,
    *,
    stage: str,
    parent_run_id: str,
    number: int | None = None,
    tags: Mapping[str, str] | None = None,
    label: str | None = None,
    reuse: bool = False,
    start_metrics: Mapping[str, float] | None = None,
) -> Iterator[Trial]:
    """A live trial's run as one block (:meth:`~bisect_eagle.tracking.runs.Tracking.trial_run`):
    the cached lookup, else the run started as a child of ``parent_run_id`` with its name, tags and
    params, the engine run by the block inside its guard, and its record written when the block
    ends.

    Args:
        ctx: the study's shared context (its store, study, owner, spec, criterion, baseline and
            stage-1 accuracies are read).
        plan: the engine's plan (its fingerprint is the trial's identity).
        stage: the run's ``stage`` tag.
        parent_run_id: the parent run.
        number: a study's Optuna trial number (also tagged ``trial_number``).
        tags: more tags (a confirmation's ``confirm_pair`` / ``confirm_role`` / ``confirm_of``).
        label: names the run instead of the stage (:func:`trial_name`).
        reuse: first look for a finished trial of the plan's fingerprint under ``parent_run_id``
            and give it as ``cached``, starting nothing.
        start_metrics: metrics logged on the run as it starts (a study's forecast of it).

    Returns:
        A context manager giving the :class:`Trial`. The started run is named :func:`run_name` of
        its :func:`trial_name`, its params the plan's effective settings (``requested.*`` beside
        those the engine changed). When the block ends, ``record`` is the trial's record, written
        into the run, which ends: a refused plan a failed ``bad_arguments`` trial; a failed launch a
        failed trial with its failure class; else the criterion's median over the launches
        (:func:`aggregate`), with the ratios to the baseline and the wiring's stage-1 accuracy when
        known, ``pruned`` or ``ok``. The block raising ends the run KILLED (Ctrl-C, SIGTERM) or
        FAILED (an engine bug; a BadInput as ``bad_arguments``) and re-raises.
    """
    tracking, fp, effective = ctx.tracking, plan.fingerprint, plan.effective
    tags = dict(tags or {})
    of = (
        live_trial_name(tracking, tags["confirm_of"], parent_run_id=parent_run_id)
        if stage == "confirm" and tags.get("confirm_role") == "candidate"
        else None
    )
    name = trial_name(stage, number=number, label=label, tags=tags, of=of)
    if number is not None:
        tags[NUMBER_TAG] = str(number)
    with tracking.trial_run(
        run_name(name, stage, effective),
        tags={
            "stage": stage,
            TRIAL_TAG: name,
            "fingerprint": fp,
            "study": ctx.study,
            "owner": ctx.owner,
            **deployment_tags(ctx.spec),
            "engine": plan.engine,
            "checked": plan.checked or "the engine's own rules",
            **_effective_tag(effective),
            **tags,
        },
        settings=effective,
        requested=plan.requested,
        parent_run_id=parent_run_id,
        metrics=start_metrics,
        reuse=fp if reuse else None,
        failure_classes={BadInput: "bad_arguments"},
        scrub=scrubber_for(plan),
    ) as run:
        if run.reused is not None:
            trial = Trial(cached=cached_record(tracking, run.reused, fp))
            yield trial
            trial.record = trial.cached
            return
        trial = Trial(run_id=run.run_id, name=name)
        yield trial
        if plan.refusal is not None:
            record = TrialRecord(
                fingerprint=fp,
                stage=stage,
                status="failed",
                value=None,
                metrics={},
                effective=effective,
                run_id=run.run_id,
                name=name,
                failure_class="bad_arguments",
                failure_detail=plan.refusal,
                warnings=list(plan.warnings),
            )
        else:
            record = _measured(ctx, plan, stage, trial.results, trial.pruned, run.run_id)
            record.name, record.engine_s = name, trial.engine_s
        run.end = result_end(plan, record, trial.results, metric=ctx.spec.criterion.metric)
        trial.record = record


def aggregate(results: list[TrialResult], metric: str) -> tuple[dict[str, float], TrialResult]:
    """Median metrics over repeats (with MAD of the criterion metric) and the median run itself.

    Args:
        results: what each launch returned (each ok).
        metric: the criterion metric.

    Returns:
        (the median launch's metrics with ``metric`` the median, ``{metric}_mad`` and ``repeats``
        added, and ``output_tok_s`` / ``accept_length`` medians; that launch).
    """
    med, mad = median_mad([getattr(r, metric) for r in results])
    rep = min(results, key=lambda r: abs(getattr(r, metric) - med))
    metrics = dict(rep.metrics())
    metrics[metric] = med
    metrics[f"{metric}_mad"] = mad
    metrics["repeats"] = float(len(results))
    for other in ("output_tok_s", "accept_length"):
        if other != metric:
            metrics[other] = statistics.median(getattr(r, other) for r in results)
    return metrics, rep


def _measured(
    ctx: TrialContext,
    plan: TrialPlan,
    stage: str,
    results: list[TrialResult],
    pruned: bool,
    run_id: str,
) -> TrialRecord:
    fp, effective, metric = plan.fingerprint, plan.effective, ctx.spec.criterion.metric
    last = results[-1]
    warnings = list(dict.fromkeys([*plan.warnings, *(w for r in results for w in r.warnings)]))
    if not last.ok:
        return TrialRecord(
            fingerprint=fp,
            stage=stage,
            status="failed",
            value=None,
            metrics={},
            effective=effective,
            run_id=run_id,
            failure_class=last.failure_class,
            failure_detail=last.failure_detail,
            warnings=warnings,
        )
    metrics, _ = aggregate(results, metric)
    if ctx.baseline:
        metrics[ratio_name(metric)] = metrics[metric] / ctx.baseline
    if ctx.baseline_tok_s:
        metrics[ratio_name("output_tok_s")] = metrics["output_tok_s"] / ctx.baseline_tok_s
    ids = effective.get(IDS_KEY)
    if ids is not None and tuple(ids) in ctx.wiring_accuracy:
        metrics["standalone_accuracy"] = ctx.wiring_accuracy[tuple(ids)]
    return TrialRecord(
        fingerprint=fp,
        stage=stage,
        status="pruned" if pruned else "ok",
        value=metrics[metric],
        metrics=metrics,
        effective=effective,
        run_id=run_id,
        warnings=warnings,
    )


def _repeat(r: TrialResult) -> dict[str, Any]:
    """One measurement as ``trial.json`` keeps it: what it returned, not the settings the plan
    states."""
    d = r.to_json()
    # requests: requests.csv
    for key in ("requests", "artifacts", "requested", "effective", "engine"):
        d.pop(key, None)
    return d


def spec_of_study(tracking: Tracking, parent_run_id: str) -> Spec:
    """The spec a study ran with (``spec.resolved.json`` of its parent run: absolute paths, no
    secrets).

    Args:
        tracking: the study's store.
        parent_run_id: the study's parent run.

    Returns:
        The spec, its ``source`` the spec file the study was started from.
    """
    d = json.loads(tracking.read_text(parent_run_id, "spec.resolved.json"))
    source = d.pop("source", None)
    spec = Spec.model_validate(d)
    spec.source = source
    return spec


def settings_of_run(tracking: Tracking, run) -> tuple[LiveSettings, str]:
    """The settings a logged live trial requested (as explicitly set) and its parent run id.

    Args:
        tracking: the trial's store.
        run: the trial's MLflow run (stage ``live``, ``baseline`` or ``reproduce``).

    Returns:
        ``(settings, parent_run_id)``: the requested settings validated, and the run's parent tag.

    Raises:
        BadInput: a run of another stage, no readable ``trial.json``, or requested settings the
            schema refuses.
    """
    run_id = run.info.run_id
    if run.data.tags.get("stage") not in ("live", "baseline", "reproduce"):
        raise BadInput(
            f"run {run_id}: expected a live, baseline or reproduce trial, found stage "
            f"{run.data.tags.get('stage')!r}"
        )
    return settings_from(
        requested_of(tracking, run_id), f"run {run_id}: trial.json"
    ), run.data.tags[PARENT_TAG]
