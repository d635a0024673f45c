"""The study's parent MLflow run: started with the spec, environment and budget; finished with the outcome.

Every trial of a study is a child of this run. Its artifacts are the spec as written (``spec.yaml``, secret
values scrubbed) and as resolved (``spec.resolved.json``: absolute paths, secret values redacted), from which
``reproduce`` and ``export`` rebuild the spec; its params name the versions, the host and the search budget.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bisect_eagle.search.study.outcome import StudyOutcome
from bisect_eagle.secrets import Scrubber, redact_mapping
from bisect_eagle.spec import Spec
from bisect_eagle.tracking import Tracking, environment_info, redact


def spec_text(spec: Spec) -> str:
    """The spec file as written, with the secret values of its fixed env and server args scrubbed."""
    fixed = spec.fixed_settings()
    return Scrubber(fixed.env, fixed.server_args)(Path(spec.source).read_text())


def resolved_spec(spec: Spec) -> dict[str, Any]:
    """The spec as loaded (defaults filled in, absolute source path), secret-named settings redacted."""
    d = spec.model_dump(mode="json")
    d["source"] = str(Path(spec.source).resolve())
    d["engine"]["settings"] = redact_mapping(d["engine"]["settings"])
    return d


def start_parent_run(tracking: Tracking, *, spec: Spec, study: str, storage: str) -> str:
    """The study's parent run: the spec (as written and resolved), environment, versions and search budget."""
    s = spec.search
    params = {**environment_info(), "spec": str(Path(spec.source).resolve()), "engine": spec.engine.kind,
              "sampler": s.sampler, "seed": str(s.seed), "max_live_trials": str(s.max_live_trials),
              "max_wall_s": str(s.max_wall_s), "repeats": str(s.repeats), "criterion.metric": spec.criterion.metric,
              "criterion.ratio": str(spec.criterion.ratio), "baseline": str(spec.baseline),
              "gate.margin": str(spec.standalone.margin), "gate.reference": spec.standalone.reference}
    tags = {"role": "study", "study": study, "storage": redact(storage),
            "mlflow.note.content": spec.description or f"bisect-eagle study {study}"}
    run_id = tracking.start_run(study, tags=tags, params=params)
    tracking.log_texts(run_id, {"spec.yaml": spec_text(spec),
                                "spec.resolved.json": json.dumps(resolved_spec(spec), indent=2)})
    return run_id


def finish_parent_run(tracking: Tracking, outcome: StudyOutcome) -> None:
    """Summary metrics (trials, duplicates, failures, best and its ratio), the verdict tags, status FINISHED."""
    out = outcome
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
    tracking.log(out.parent_run_id, metrics=metrics, tags=tags)
    tracking.finish(out.parent_run_id, "FINISHED")
