"""A deterministic engine for search tests: throughput follows the wiring and num_steps, no models
involved."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bisect_eagle.engines.base import Engine, RequestRecord, TrialResult, failed
from bisect_eagle.engines.plan import TrialPlan, make_plan
from bisect_eagle.engines.sglang.rules import apply_speculative_rules, speculative_effective
from bisect_eagle.errors import BadInput
from bisect_eagle.search.study import Options, StudyOutcome, run_study
from bisect_eagle.spec.settings import LiveSettings

TRUE_IDS = [1, 5, 9]
BASELINE_TOK_S = 100.0


def expected(ids: list[int] | None, steps: int) -> tuple[float, float]:
    """(accept length, tok/s): the true wiring accepts 0.6 tokens per step; others almost
    nothing."""
    al = 1 + 0.6 * steps if ids in (None, TRUE_IDS) else 1.05
    return al, BASELINE_TOK_S * al / (1 + 0.15 * steps)


class FakeEngine(Engine):
    """Live trials computed from the settings; ``crash_steps`` fail, ``log`` records each run's
    pid."""

    name = "fake"

    def __init__(
        self,
        crash_steps: tuple[int, ...] = (),
        sleep_s: float = 0.0,
        log: Path | None = None,
        live_after: Path | None = None,
        deterministic: tuple[str, ...] = (),
    ):
        # what it declares (its values are exact either way)
        self.deterministic_metrics = deterministic
        self.crash_steps = crash_steps
        self.sleep_s = sleep_s
        self.log = log
        self.live_after = live_after  # live trials wait (up to 120 s) until this file exists
        self.runs: list[LiveSettings] = []

    def plan(self, settings: LiveSettings) -> TrialPlan:
        """Like the local engine: the draft's own ids resolved, server-only fields ignored."""
        effective, warnings, refusal = speculative_effective(settings)
        for key in ("concurrency", "env", "server_args"):
            effective.pop(key)
        if not settings.is_baseline:
            ids = settings.eagle_aux_hidden_state_layer_ids
            effective["eagle_aux_hidden_state_layer_ids"] = sorted(TRUE_IDS if ids is None else ids)
        return make_plan(
            self.name, settings, effective=effective, warnings=warnings, refusal=refusal
        )

    def run(self, plan: TrialPlan) -> TrialResult:
        if plan.refusal is not None:
            raise BadInput(plan.refusal)
        settings = plan.settings
        self.runs.append(settings)
        deadline = time.monotonic() + 120
        while (
            self.live_after is not None
            and not settings.is_baseline
            and not self.live_after.exists()
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        eff, warnings = apply_speculative_rules(settings)
        requested, effective = settings.model_dump(), eff.model_dump()
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(
                    f"{os.getpid()} {effective['eagle_aux_hidden_state_layer_ids']} "
                    f"{eff.num_steps}\n"
                )
        time.sleep(self.sleep_s)
        if not eff.is_baseline and eff.num_steps in self.crash_steps:
            return failed(
                self.name,
                requested=requested,
                effective=effective,
                cls="crash_during_benchmark",
                detail="boom",
                warnings=warnings,
            )
        if eff.is_baseline:
            al, tok_s = 1.0, BASELINE_TOK_S
        else:
            al, tok_s = expected(
                eff.eagle_aux_hidden_state_layer_ids
                and sorted(eff.eagle_aux_hidden_state_layer_ids),
                eff.num_steps,
            )
        reqs = [
            RequestRecord(
                id=f"p{i}",
                prompt_tokens=10,
                completion_tokens=64,
                verify_steps=round(64 / al),
                latency_s=0.1,
            )
            for i in range(2)
        ]
        return TrialResult(
            engine=self.name,
            status="ok",
            requested=requested,
            effective=effective,
            output_tok_s=tok_s,
            accept_length=al,
            accept_length_hist={2: 3},
            accept_rate_per_position=[0.6] * eff.num_steps,
            requests=reqs,
            wall_s=0.2,
            warnings=warnings,
            artifacts={"launch_command.txt": "fake --steps\n"},
        )


SPEC = """\
name: {name}
target: t
draft: d
dump: u
prompts: p.jsonl
# the paths are not read (the fake engine replaces it); sglang specs may name absent ones
engine: {{kind: sglang}}
baseline: measure
criterion: {{metric: {metric}, ratio: {ratio}}}
space:
  eagle_aux_hidden_state_layer_ids:
    {{type: categorical, choices: [[1, 5, 9], [5, 9, 11], [-1, 1, 5]]}}
  num_steps: {{type: int, low: 1, high: {high}}}
  num_draft_tokens: {{type: categorical, choices: [null, 4, 8]}}
search: {{sampler: {sampler}, max_live_trials: {budget}, startup_trials: 4, seed: {seed},
          model: {{enabled: {model}}}}}
"""


def make_spec(
    tmp_path: Path,
    name: str,
    ratio: float = 2.0,
    high: int = 6,
    budget: int = 20,
    sampler: str = "tpe",
    seed: int = 0,
    model: bool = False,
    metric: str = "output_tok_s",
) -> Path:
    """A fake-engine spec; the throughput model is off unless ``model`` (these tests pin the
    sampler's loop)."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        SPEC.format(
            name=name,
            ratio=ratio,
            high=high,
            budget=budget,
            sampler=sampler,
            seed=seed,
            model=str(model).lower(),
            metric=metric,
        )
    )
    return path


def search(spec, engine: FakeEngine, store: dict[str, str], **options) -> StudyOutcome:
    """``run_study`` of ``spec`` with ``engine`` in the module's stores."""
    opts = Options(storage=store["storage"], tracking_uri=store["tracking"], **options)
    return run_study(spec, options=opts, engine_factory=lambda s: engine)
