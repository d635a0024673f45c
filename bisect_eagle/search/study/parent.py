"""The study's parent MLflow run: started with the spec, environment and budget; finished with the
answer.

Every trial of a study is a child of this run. Its artifacts are the spec as written (``spec.yaml``,
secret values scrubbed) and as resolved (``spec.resolved.json``: absolute paths, secret values
redacted), from which ``reproduce`` and ``export`` rebuild the spec; its params name the versions,
the host and the search budget; its dataset inputs are the target, draft, dump and prompts. When the
study ends, its description (``mlflow.note.content``) states the verdict sentence once, the best
config's tok/s against the baseline's, the best config with a link to its run and the ``export``
command; its tags ``outcome`` (``target reached`` or ``target not reached``), ``verdict`` (the
sentence) and ``speed`` (the tok/s sentence); its metrics the best trial's values beside the
baseline and the target.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from bisect_eagle.engines import engine_class
from bisect_eagle.report.study import write_report
from bisect_eagle.search.study.outcome import StudyOutcome
from bisect_eagle.spec.schema import Spec
from bisect_eagle.tracking.provenance import environment_info
from bisect_eagle.tracking.redact import Scrubber, mask_text, redact_mapping, redact_url
from bisect_eagle.tracking.runs import NOTE, Tracking
from bisect_eagle.trials.launches import Launches
from bisect_eagle.trials.record import deployment_paths, deployment_tags, ratio_name

HEADLINE = ("output_tok_s", "accept_length")  # shown beside the criterion metric


def spec_text(spec: Spec) -> str:
    """The spec file as written, with the values the secret policy hides (its fixed env and
    server args, the engine's extra arguments) scrubbed."""
    fixed = spec.fixed_settings()
    scrub = Scrubber(
        {"env": fixed.env, "server_args": fixed.server_args}, spec.model_dump(mode="json")["engine"]
    )
    return scrub(Path(spec.source).read_text())


def resolved_spec(spec: Spec) -> dict[str, Any]:
    """The spec as a study's parent run stores it (``spec.resolved.json``).

    Args:
        spec: the study's spec.

    Returns:
        The spec as loaded (defaults filled in, absolute source path), its engine section
        (settings, extra arguments) as the secret policy writes it, its description masked.
    """
    d = spec.model_dump(mode="json")
    d["source"] = str(Path(spec.source).resolve())
    d["engine"] = redact_mapping(d["engine"])
    d["description"] = mask_text(d["description"])
    return d


def start_parent_run(tracking: Tracking, *, spec: Spec, study: str, storage: str) -> str:
    """The study's parent run: the spec (as written and resolved), environment, versions and search
    budget."""
    s = spec.search
    params = {
        **environment_info(),
        **engine_class(spec.engine.kind).versions(spec),
        "spec": str(Path(spec.source).resolve()),
        "engine": spec.engine.kind,
        "sampler": s.sampler,
        "seed": str(s.seed),
        "max_live_trials": str(s.max_live_trials),
        "max_wall_s": str(s.max_wall_s),
        "repeats": str(s.repeats),
        "criterion.metric": spec.criterion.metric,
        "criterion.ratio": str(spec.criterion.ratio),
        "baseline": str(spec.baseline),
        "gate.margin": str(spec.standalone.margin),
        "gate.reference": spec.standalone.reference,
        "search.model.enabled": str(spec.search.model.enabled),
    }
    tags = {
        "role": "study",
        "study": study,
        "storage": redact_url(storage),
        **deployment_tags(spec),
        NOTE: f"**Study running.** {spec.description}".strip(),
    }
    run_id = tracking.start_run(study, tags=tags, params=params)
    description = mask_text(experiment_description(spec))
    tracking.client.set_experiment_tag(tracking.experiment_id, NOTE, description)
    tracking.log_datasets(run_id, deployment_paths(spec))
    tracking.log_texts(
        run_id,
        {
            "spec.yaml": spec_text(spec),
            "spec.resolved.json": json.dumps(resolved_spec(spec), indent=2),
        },
    )
    return run_id


def experiment_description(spec: Spec) -> str:
    """The experiment's description: what its studies search, for which deployment."""
    lines = [
        f"bisect-eagle studies of spec `{Path(spec.source).name}`: EAGLE-3 speculative decoding "
        f"settings searched to reach {spec.criterion.ratio:g}× the baseline "
        f"{spec.criterion.metric}.",
        "",
    ]
    lines += [f"- {key}: `{value}`" for key, value in deployment_tags(spec).items()]
    if spec.description:
        lines += ["", spec.description]
    return "\n".join(lines)


def summary_metrics(out: StudyOutcome) -> dict[str, float]:
    """Counts, and the best trial's criterion and headline metrics beside the baseline, the target
    and ratios."""
    metrics = {
        "live_trials": float(out.counts["live_measured"]),
        "duplicates": float(out.counts["duplicates"]),
        "failed_trials": float(out.counts["failed"]),
        "elapsed_s": out.elapsed_s,
    }
    if out.tool_overhead_s_per_trial is not None:
        metrics["tool_overhead_s_per_trial"] = out.tool_overhead_s_per_trial
    if out.tool_cpu_s_per_trial is not None:
        metrics["tool_cpu_s_per_trial"] = out.tool_cpu_s_per_trial
    if out.launches is not None:  # launches, launches_live, launches_confirm, launches_baseline
        metrics.update(Launches.from_json(out.launches).metrics())
    if out.baseline is not None:
        metrics[f"baseline_{out.metric}"] = out.baseline
    if out.target is not None:
        metrics[f"target_{out.metric}"] = out.target
    if out.baseline_output_tok_s is not None:
        metrics["baseline_output_tok_s"] = out.baseline_output_tok_s
    if out.best:
        best = out.best["metrics"]
        metrics[f"best_{out.metric}"] = out.best["value"]
        for name in HEADLINE:
            if name in best:
                metrics[f"best_{name}"] = best[name]
        for name in {out.metric, *HEADLINE}:
            if ratio_name(name) in best:
                metrics[f"best_{ratio_name(name)}"] = best[ratio_name(name)]
    return metrics


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}" if abs(v) < 100 else f"{v:.1f}"


def description(out: StudyOutcome) -> str:
    """The parent run's markdown. Its first lines are what the UI shows before "Show more": the
    verdict sentence (said once), the best config's tok/s against the baseline's, the best run
    (linked) and the command that deploys it; then the study's cost, the best config's metrics and
    settings.

    Args:
        out: the study's outcome.

    Returns:
        The markdown text.
    """
    verdict = out.verdict
    lines = [f"**{verdict[:1].upper()}{verdict[1:]}.**", ""]
    if out.speed_text:
        lines += [f"Speed: {out.speed_text}.", ""]
    b = out.best
    if b:
        name = f"{b['name']} (run {b['run_id'][:8]})" if b.get("name") else f"run {b['run_id'][:8]}"
        lines += [
            f"Best: [{name}](#/experiments/{out.experiment_id}/runs/{b['run_id']}). Deploy it: "
            f"`bisect-eagle export {b['run_id'][:8]} --tracking-uri {out.tracking_uri}` (the "
            "engine's launch command, its environment and the draft's config patch).",
            "",
        ]
    else:
        lines += [
            "No live trial finished ok: the failed trials' runs say why (tag `failure_class`).",
            "",
        ]
    if out.launches is not None:
        lines += [
            f"Cost: {Launches.from_json(out.launches).summary()} for {out.counts['live_measured']} "
            "live trials."
        ]
    if not b:
        return "\n".join(lines).rstrip()
    lines += [
        "",
        "### Best config",
        "",
        "| metric | best | baseline | ratio |",
        "|---|---|---|---|",
    ]
    baselines = {out.metric: out.baseline, "output_tok_s": out.baseline_output_tok_s}
    for name in dict.fromkeys([out.metric, *HEADLINE]):
        value = b["metrics"].get(name)
        if value is not None:
            ratio = b["metrics"].get(ratio_name(name))
            lines.append(
                f"| {name} | {_num(value)} | {_num(baselines.get(name))} | "
                f"{'-' if ratio is None else _times(ratio)} |"
            )
    lines += ["", "| setting | value |", "|---|---|"]
    lines += [f"| {k} | `{v}` |" for k, v in sorted(b["params"].items()) if v not in ({}, None, [])]
    return "\n".join(lines)


def _times(ratio: float) -> str:
    """A ratio to the baseline as every page writes it: ``1.04× baseline``."""
    return f"{ratio:.2f}× baseline"


def finish_parent_run(tracking: Tracking, outcome: StudyOutcome) -> None:
    """Summary and best-trial metrics, the description and verdict tags, then status FINISHED."""
    out = outcome
    tags = {
        "outcome": "target reached" if out.target_reached else "target not reached",
        "verdict": out.verdict,
        NOTE: description(out),
    }
    if out.speed_text:
        tags["speed"] = out.speed_text
    if out.best:
        tags["best_run_id"] = out.best["run_id"]
    tracking.log(out.parent_run_id, metrics=summary_metrics(out), tags=tags)
    # the plots, on the parent run
    with tempfile.TemporaryDirectory(prefix="bisect-eagle-report-") as tmp:
        write_report(tracking, tracking.get_run(out.parent_run_id), out=Path(tmp))
    tracking.finish(out.parent_run_id, "FINISHED")
