"""The stage-2 search space and the Optuna sampler that explores it.

The live space is the spec's ``space`` plus, when the spec gates wirings, a categorical of the
layer-id lists that passed the standalone gate. The sampler is the spec's ``search.sampler``: TPE
(multivariate, constant liar so parallel workers spread out, grouped when parameters are
conditional), an exhaustive grid, or random.
"""

from __future__ import annotations

import json
import math
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna

from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.search.space import SearchSpace, encode
from bisect_eagle.spec.schema import Param, Spec
from bisect_eagle.spec.settings import LiveSettings


class AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler for ask-and-tell: it calls ``study.stop()``, which only works inside
    ``optimize``; the search loop stops by itself once every distinct config of the space is
    measured."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


def make_sampler(spec: Spec, *, space: SearchSpace, seed: int) -> optuna.samplers.BaseSampler:
    """TPE (multivariate, constant liar; grouped when parameters are conditional), grid or
    random."""
    s = spec.search
    if s.sampler == "grid":
        return AskTellGridSampler(space.grid(), seed=seed)
    if s.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    conditional = any(p.when for p in space.params.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            n_startup_trials=s.startup_trials,
            multivariate=True,
            constant_liar=True,
            group=conditional,
            seed=seed,
        )


def live_space(spec: Spec, gate: list[dict[str, Any]]) -> SearchSpace:
    """The spec's space with the wirings that passed the gate as a categorical of layer-id lists."""
    params: dict[str, Param] = {}
    if spec.standalone.wirings:
        passed = [v["layer_ids"] for v in gate if v["passed"]]
        params[IDS_KEY] = Param(type="categorical", choices=passed)
    params.update(spec.space)
    return SearchSpace(params, spec.engine.settings, str(spec.source))


def space_json(space: SearchSpace) -> str:
    """The ``search_space.json`` artifact of a study's parent run: order, parameters, encoded
    choices."""
    return json.dumps(
        {
            "order": space.order,
            "params": space.describe(),
            "encoded_choices": {
                n: [encode(c) for c in p.choices or []]
                for n, p in space.params.items()
                if p.type == "categorical"
            },
        },
        indent=2,
        default=str,
    )


Listed = dict[str, tuple[dict[str, Any], dict[str, Any]]]
"""Every runnable config of a listable space: plan fingerprint -> (sampled values, effective
settings)."""


def list_configs(space: SearchSpace, *, plan: Callable[[LiveSettings], TrialPlan]) -> Listed | None:
    """Every distinct config of ``space`` that ``plan`` (the engine's) accepts, by plan fingerprint
    (the first sampled values that give it); None when the space cannot be listed (continuous or too
    large)."""
    combos = space.enumerate()
    if combos is None:
        return None
    out: Listed = {}
    for sampled in combos:
        try:
            p = plan(space.settings(sampled))
        except BadInput:
            continue
        if p.refusal is None:
            out.setdefault(p.fingerprint, (sampled, p.effective))
    return out


# configs planned from a space that cannot be listed (continuous, or too large): a seeded sample
SAMPLED = 200


@dataclass(frozen=True)
class SpacePlan:
    """Every config of a space judged by the engine's plans; of a space that cannot be listed, a
    seeded sample."""

    planned: int  # configs planned
    listed: bool  # whether they are the whole space (False: a sample of ``SAMPLED``)
    # configs the space holds at most (the product of the value counts); None: a float range
    bound: int | None
    refused: dict[str, int]  # reason (one line) -> configs the engine refuses for it, most first
    checked: dict[str, int]  # what checked the plans it accepts -> how many

    @property
    def launchable(self) -> int:
        """The configs planned that the engine would launch."""
        return self.planned - sum(self.refused.values())

    def whole(self) -> str:
        """What ``planned`` counts: ``"27216 configs of the space"`` or ``"a seeded sample of 200
        configs of a space too large to list (at most 1200000)"``."""
        if self.listed:
            return f"{self.planned} configs of the space"
        size = "a float range" if self.bound is None else f"at most {self.bound}"
        return f"a seeded sample of {self.planned} configs of a space too large to list ({size})"

    def check(self, engine: str, source: object) -> None:
        """:class:`BadInput` when the engine refuses every config of a listed space (the study could
        launch nothing); a sample refused whole says only that the sample is (see :meth:`whole`),
        and is no verdict.

        Args:
            engine: the engine's name, for the message.
            source: what the message names first (the spec file).

        Raises:
            BadInput: configs were planned from a listed space and the engine refuses every one.
        """
        if self.planned and self.listed and not self.launchable:
            reason, count = next(iter(self.refused.items()))
            raise BadInput(
                f"{source}: the {engine} engine refuses all {self.planned} configs of the space "
                f"({count} of them: {reason})"
            )


def plan_space(
    space: SearchSpace, *, plan: Callable[[LiveSettings], TrialPlan], sample: int = SAMPLED
) -> SpacePlan:
    """Plan every config of ``space`` with ``plan`` (the engine's; nothing runs), or a seeded sample
    of ``sample`` configs when the space cannot be listed (a float range, or more than the space
    lists).

    Args:
        space: the space, its conditions applied (inactive parameters are left out, so repeats are
            planned once).
        plan: the engine's plan of a config's settings; its refusal, or a :class:`BadInput` it
            raises, refuses it.
        sample: how many configs to draw from a space that cannot be listed (Optuna's random
            sampler, seed 0).

    Returns:
        The counts, refusals grouped by reason.
    """
    combos = space.enumerate()
    listed = combos is not None
    sizes = [space.values(name) for name in space.order]
    bound = None if any(v is None for v in sizes) else math.prod(max(1, len(v)) for v in sizes)
    refused: Counter[str] = Counter()
    checked: Counter[str] = Counter()
    planned = 0
    for sampled in combos if listed else _sampled(space, sample):
        planned += 1
        try:
            p = plan(space.settings(sampled))
            reason = p.refusal
        except BadInput as e:
            p, reason = None, str(e)
        if reason is not None:
            refused[" ".join(reason.split())] += 1
        elif p is not None:
            checked[p.checked or "the engine's own rules"] += 1
    return SpacePlan(
        planned=planned,
        listed=listed,
        bound=bound,
        refused=dict(refused.most_common()),
        checked=dict(checked.most_common()),
    )


def _sampled(space: SearchSpace, n: int) -> list[dict[str, Any]]:
    """``n`` configs of a space that cannot be listed, drawn by Optuna's random sampler (seeded:
    reproducible)."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    out = []
    for _ in range(n):
        trial = study.ask()
        out.append(space.suggest(trial))
        study.tell(trial, 0.0)
    return out
