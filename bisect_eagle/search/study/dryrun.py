"""``run --dry-run``: what a study of a spec would launch, judged by the engine's own plans, with
nothing run and nothing written (no store is opened, no server started).

Every config of the live space is planned as the study would plan it, the layer-id choices of
``space`` included (:func:`~bisect_eagle.search.study.sampler.plan_space`); stage 1's wirings are
listed apart, since their standalone accuracy picks which of them stage 2 searches. The answer says
how many configs the engine would launch, which it refuses and why (grouped by reason), and what
checked the plans (SGLang's parser and resolution, "not resolved here" on a host without the node's
GPUs, vLLM's parser). A space that cannot be listed (a float range, or too many configs) is sampled,
and the answer says so: a sample refused whole is reported, not taken for the whole space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bisect_eagle.search.space import SearchSpace
from bisect_eagle.search.study.api import EngineFactory
from bisect_eagle.search.study.sampler import plan_space
from bisect_eagle.spec.schema import Spec, Wiring


@dataclass(frozen=True)
class StudyPlan:
    """What ``run`` would do with a spec, judged by the engine's plans; ``to_json`` for
    ``--json``."""

    engine: str
    # stage 1's candidate wirings ("name: rule"), scored offline before any launch
    wirings: list[str]
    baseline: dict[str, Any] | None  # the baseline trial's plan (``baseline: measure``), else None
    configs: int  # live configs planned
    # whether ``configs`` is the whole space (False: a sample of a space that cannot be listed)
    listed: bool
    # what ``configs`` counts, in words ("a seeded sample of 200 configs of a space too large ...")
    space: str
    space_bound: int | None  # configs the space holds at most (None: a float range)
    launchable: int  # configs the engine would launch
    refused: dict[str, int]  # reason -> configs the engine refuses for it
    checked: dict[str, int]  # what checked the launchable plans -> how many
    budget: dict[str, Any]  # max_live_trials, max_wall_s, max_launches

    def to_json(self) -> dict[str, Any]:
        """The dry run as JSON (``--json``).

        Returns:
            Every field by name.
        """
        return dict(self.__dict__)


def plan_study(spec: Spec, *, engine_factory: EngineFactory) -> StudyPlan:
    """Plan every live config of ``spec`` (and the baseline) with its engine; nothing runs.

    Args:
        spec: the loaded spec.
        engine_factory: builds the spec's engine (``engines.make_engine``); only its ``plan`` is
            called.

    Returns:
        The study's plan: the counts of the live space, its refusals by reason and the baseline's
        plan.

    Raises:
        BadInput: the engine refuses every config of a listed space (the study could launch
            nothing).
    """
    space = SearchSpace(spec.space, spec.engine.settings, str(spec.source))
    with engine_factory(spec) as engine:
        baseline = None
        if spec.baseline == "measure":
            base = engine.plan(
                spec.fixed_settings().model_copy(update={"speculative_algorithm": "none"})
            )
            baseline = {
                "fingerprint": base.fingerprint,
                "refusal": base.refusal,
                "checked": base.checked or "the engine's own rules",
            }
        found = plan_space(space, plan=engine.plan)
        name = engine.name
    found.check(name, spec.source)
    s = spec.search
    return StudyPlan(
        engine=name,
        wirings=[_wiring(w) for w in spec.standalone.wirings],
        baseline=baseline,
        configs=found.planned,
        listed=found.listed,
        space=found.whole(),
        space_bound=found.bound,
        launchable=found.launchable,
        refused=found.refused,
        checked=found.checked,
        budget={
            "max_live_trials": s.max_live_trials,
            "max_wall_s": s.max_wall_s,
            "max_launches": s.max_launches,
        },
    )


def _wiring(w: Wiring) -> str:
    """``trained: [:-1]`` or ``layer ids [2, 30, 60]``: one candidate wiring as the dry run names
    it."""
    what = f"rule {w.rule}" if w.rule is not None else f"layer ids {w.layer_ids}"
    return f"{w.name}: {what}" if w.name else what
