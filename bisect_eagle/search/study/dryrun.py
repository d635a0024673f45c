"""``run --dry-run``: what a study of a spec would launch, judged by the engine's own plans, with nothing run and
nothing written (no store is opened, no server started).

Every config of the live space is planned as the study would plan it (wirings aside: stage 1 picks the ids from
the draft's standalone accuracy), so the answer says how many configs the engine would launch, which it refuses
and why (grouped by reason), and what checked the plans (SGLang's parser and resolution, "not resolved here" on a
host without the node's GPUs, vLLM's parser). A space that cannot be listed (a float range) is sampled.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from bisect_eagle.errors import BadInput
from bisect_eagle.search.space import SearchSpace
from bisect_eagle.search.study.api import EngineFactory
from bisect_eagle.spec.schema import WIRING_SETTING, Spec, Wiring

SAMPLED = 200  # configs planned from a space that cannot be listed (a float range): a sample, said so


@dataclass(frozen=True)
class StudyPlan:
    """What ``run`` would do with a spec, judged by the engine's plans; ``to_json`` for ``--json``."""

    engine: str
    wirings: list[str]  # stage 1's candidate wirings ("name: rule"), scored offline before any launch
    baseline: dict[str, Any] | None  # the baseline trial's plan (``baseline: measure``), else None
    configs: int  # live configs planned
    listed: bool  # whether ``configs`` is the whole space (False: a sample of a space that cannot be listed)
    launchable: int  # configs the engine would launch
    refused: dict[str, int]  # reason -> configs the engine refuses for it
    checked: dict[str, int]  # what checked the launchable plans -> how many
    budget: dict[str, Any]  # max_live_trials, max_wall_s, max_launches

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def plan_study(spec: Spec, *, engine_factory: EngineFactory) -> StudyPlan:
    """Plan every live config of ``spec`` (and the baseline) with its engine; nothing runs.

    Raises:
        BadInput: the engine refuses every config of the space (the study could launch nothing).
    """
    space = SearchSpace({k: v for k, v in spec.space.items() if k != WIRING_SETTING}, spec.engine.settings,
                        str(spec.source))
    combos = space.enumerate()
    listed = combos is not None
    if combos is None:
        combos = _sampled(space, SAMPLED)
    refused: Counter[str] = Counter()
    checked: Counter[str] = Counter()
    configs = 0
    with engine_factory(spec) as engine:
        baseline = None
        if spec.baseline == "measure":
            base = engine.plan(spec.fixed_settings().model_copy(update={"speculative_algorithm": "none"}))
            baseline = {"fingerprint": base.fingerprint, "refusal": base.refusal,
                        "checked": base.checked or "the engine's own rules"}
        for sampled in combos:
            configs += 1
            try:
                plan = engine.plan(space.settings(sampled))
                reason = plan.refusal
            except BadInput as e:
                plan, reason = None, str(e)
            if reason is not None:
                refused[" ".join(reason.split())] += 1
            elif plan is not None:
                checked[plan.checked or "the engine's own rules"] += 1
        name = engine.name
    launchable = configs - sum(refused.values())
    if configs and not launchable:
        reason, count = refused.most_common(1)[0]
        raise BadInput(f"{spec.source}: the {name} engine refuses all {configs} configs of the space ({count} of "
                       f"them: {reason})")
    s = spec.search
    return StudyPlan(
        engine=name, wirings=[_wiring(w) for w in spec.standalone.wirings], baseline=baseline,
        configs=configs, listed=listed, launchable=launchable, refused=dict(refused.most_common()),
        checked=dict(checked.most_common()),
        budget={"max_live_trials": s.max_live_trials, "max_wall_s": s.max_wall_s,
                "max_launches": s.max_launches})


def _wiring(w: Wiring) -> str:
    """``trained: [:-1]`` or ``layer ids [2, 30, 60]``: one candidate wiring as the dry run names it."""
    what = f"rule {w.rule}" if w.rule is not None else f"layer ids {w.layer_ids}"
    return f"{w.name}: {what}" if w.name else what


def _sampled(space: SearchSpace, n: int) -> list[dict[str, Any]]:
    """``n`` configs of a space that cannot be listed, drawn by Optuna's random sampler (seeded: reproducible)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    out = []
    for _ in range(n):
        trial = study.ask()
        out.append(space.suggest(trial))
        study.tell(trial, 0.0)
    return out
