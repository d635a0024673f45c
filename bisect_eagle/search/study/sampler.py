"""The stage-2 search space and the Optuna sampler that explores it.

The live space is the spec's ``space`` plus, when the spec gates wirings, a categorical of the layer-id lists
that passed the standalone gate. The sampler is the spec's ``search.sampler``: TPE (multivariate, constant
liar so parallel workers spread out, grouped when parameters are conditional), an exhaustive grid, or random.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

import optuna

from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.errors import BadInput
from bisect_eagle.search.space import SearchSpace, encode
from bisect_eagle.spec.schema import WIRING_SETTING, Param, Spec
from bisect_eagle.spec.settings import LiveSettings


class AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler for ask-and-tell: it calls ``study.stop()``, which only works inside ``optimize``;
    the search loop stops by itself once every distinct config of the space is measured."""

    def after_trial(self, study, trial, state, values) -> None:
        return None


def make_sampler(spec: Spec, *, space: SearchSpace, seed: int) -> optuna.samplers.BaseSampler:
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


def space_json(space: SearchSpace) -> str:
    """The ``search_space.json`` artifact of a study's parent run: order, parameters, encoded choices."""
    return json.dumps({"order": space.order, "params": space.describe(),
                       "encoded_choices": {n: [encode(c) for c in p.choices or []]
                                           for n, p in space.params.items() if p.type == "categorical"}},
                      indent=2, default=str)


Listed = dict[str, tuple[dict[str, Any], dict[str, Any]]]
"""Every runnable config of a listable space: plan fingerprint -> (sampled values, effective settings)."""


def list_configs(space: SearchSpace, *, plan: Callable[[LiveSettings], TrialPlan]) -> Listed | None:
    """Every distinct config of ``space`` that ``plan`` (the engine's) accepts, by plan fingerprint (the first
    sampled values that give it); None when the space cannot be listed (continuous or too large)."""
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


def refusals(space: SearchSpace, *, plan: Callable[[LiveSettings], TrialPlan]) -> tuple[int, dict[str, int]] | None:
    """How many configs ``space`` lists and, per reason, how many of them the engine refuses (bad values
    included); None when the space cannot be listed. Planning is cheap: nothing runs."""
    combos = space.enumerate()
    if combos is None:
        return None
    total, refused = 0, {}
    for sampled in combos:
        total += 1
        try:
            reason = plan(space.settings(sampled)).refusal
        except BadInput as e:
            reason = str(e)
        if reason is not None:
            reason = " ".join(reason.split())
            refused[reason] = refused.get(reason, 0) + 1
    return total, refused
