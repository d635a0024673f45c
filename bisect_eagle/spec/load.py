"""TODO
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from bisect_eagle.artifacts import scenarios
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import (
    ADAPTIVE_FLAG,
    SPECULATIVE_COUNTS,
    WIRING_SETTING,
    Spec,
    check_setting_name,
    settings_from,
)
from bisect_eagle.spec.settings import ADAPTIVE, LiveSettings


def _fill_from_scenario(raw: dict, path: Path) -> None:
    try:
        sc = scenarios.get(raw["scenario"])
    except BadInput as e:
        raise BadInput(f"{path}: key 'scenario': {e}") from None
    meta = sc.meta
    for key in ("target", "draft", "dump", "prompts"):
        raw.setdefault(key, str(getattr(sc, key)))
    raw.setdefault("dump_layer_ids", meta["aux_layer_ids"]["sglang"])
    raw.setdefault("training_accuracy", meta["training_accuracy"]["full_vocab"])


def _check_space(spec: Spec, path: Path) -> None:
    """Names exist, choices are valid setting values, conditions point at known settings, no overlaps."""
    fixed = spec.engine.settings
    for name, param in spec.space.items():
        where = f"{path}: space.{name}"
        check_setting_name(name, str(path))
        if name in fixed:
            raise BadInput(f"{where}: {name!r} is searched and also fixed in engine.settings; keep one of them")
        if name == WIRING_SETTING and spec.standalone.wirings:
            raise BadInput(f"{where}: the wiring is searched through standalone.wirings (gated by standalone "
                           f"accuracy); remove {name!r} from space or empty standalone.wirings")
        if param.type == "categorical":
            for i, choice in enumerate(param.choices or []):
                _check_count(name, choice, f"{where}.choices[{i}]")
                settings_from({name: choice}, f"{where}.choices[{i}]")
        elif not name.startswith("env."):
            for bound in ("low", "high"):
                value = getattr(param, bound)
                if not math.isfinite(value):
                    raise BadInput(f"{where}.{bound}: expected a finite number, found {value}")
                _check_count(name, value, f"{where}.{bound}")
                settings_from({name: int(value) if param.type == "int" else value}, f"{where}.{bound}")
        for other, values in param.when.items():
            check_setting_name(other, f"{where}.when")
            if other not in spec.space and other not in fixed and other not in LiveSettings.model_fields:
                raise BadInput(f"{where}.when: {other!r} is neither searched nor fixed; expected a setting name")
            if other == name:
                raise BadInput(f"{where}.when: a parameter cannot depend on itself")
            if not isinstance(values, list) or not values:
                raise BadInput(f"{where}.when.{other}: expected a non-empty list of values, found {values!r}")


def _check_adaptive_once(spec: Spec, path: Path) -> None:
    """``speculative_adaptive`` and ``server_args.speculative_adaptive`` are one setting: named once across
    ``engine.settings`` and ``space``, and by the field's name in ``groups`` (what bisect compares)."""
    settings = spec.engine.settings
    fixed = ({f"server_args.{k}" for k, v in (settings.get("server_args") or {}).items() if v is not None}
             | {k for k, v in settings.items() if v is not None})  # null means unset
    if {ADAPTIVE, ADAPTIVE_FLAG} <= fixed | set(spec.space):
        raise BadInput(f"{path}: key {ADAPTIVE_FLAG!r}: it is {ADAPTIVE!r} spelled as a flag, which is also given "
                       f"(engine.settings or space); keep {ADAPTIVE!r}")
    if any(ADAPTIVE_FLAG in g for g in spec.groups):
        raise BadInput(f"{path}: groups: name {ADAPTIVE_FLAG!r} as {ADAPTIVE!r}")


def _check_count(name: str, value: Any, where: str) -> None:
    """A searched ``num_steps`` or ``topk`` below 1 would be a speculative trial no engine can run."""
    if name in SPECULATIVE_COUNTS and isinstance(value, (int, float)) and value < 1:
        raise BadInput(f"{where}: {name} must be >= 1 in a speculative trial, found {value}")


def _check_fixed(spec: Spec, path: Path) -> None:
    """Fixed speculative counts (unless searched), and the rules of the wirings: parse, no repeated state."""
    from bisect_eagle.artifacts.wiring import parse_rule

    fixed = spec.fixed_settings()
    if not fixed.is_baseline:
        for name in SPECULATIVE_COUNTS:
            if name not in spec.space:
                _check_count(name, getattr(fixed, name), f"{path}: engine.settings.{name}")
    for i, w in enumerate(spec.standalone.wirings):
        if w.rule is None:
            continue
        where = f"{path}: key 'standalone.wirings.{i}.rule'"
        try:
            rule = parse_rule(w.rule)
        except BadInput as e:
            raise BadInput(f"{where}: {e}") from None
        items = list(rule.items or ())
        repeated = [x for j, x in enumerate(items) if x in items[:j]]
        if repeated:
            raise BadInput(f"{where}: {w.rule} takes state {repeated[0]} twice; each state feeds fc once")


def _check_criterion(spec: Spec, path: Path) -> None:
    if spec.standalone.reference == "training" and spec.standalone.wirings and spec.training_accuracy is None:
        raise BadInput(f"{path}: key 'standalone.reference' is 'training' but 'training_accuracy' is missing; "
                       "give the draft's recorded accuracy or use reference: best")
    if spec.standalone.wirings and any(w.rule for w in spec.standalone.wirings) and spec.dump_layer_ids is None:
        raise BadInput(f"{path}: key 'dump_layer_ids' is missing; rules in standalone.wirings need the dump's "
                       "SGLang layer ids to be searched live")
    if spec.search.prune_below is not None and spec.search.repeats < 2:
        raise BadInput(f"{path}: key 'search.prune_below' needs search.repeats >= 2 (found {spec.search.repeats})")


def load_spec(path: str | Path, *, check_inputs: bool = True) -> Spec:
    """Read and validate a spec file, and every input it names that exists here; writes nothing.

    The whole spec (keys, types, bounds, repeated ids, rules, setting names) and then, unless ``check_inputs``
    is False (``doctor`` explains those problems instead), its inputs
    (:func:`bisect_eagle.spec.checks.check_spec_inputs`: paths, device, prompts, data, ids against the target's
    depth) are checked before any command creates a store, a study, a run or a directory.
    """
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: spec file not found")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise BadInput(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise BadInput(f"{path}: expected a mapping at the top level, found {type(raw).__name__}")
    if raw.get("scenario"):
        _fill_from_scenario(raw, path)
    try:
        spec = Spec.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise BadInput(f"{path}: key {key!r}: {err['msg']} (found {err.get('input')!r})") from None
    base = path.resolve().parent
    for key in ("target", "draft", "dump", "prompts"):
        value = getattr(spec, key)
        if value is not None and not value.is_absolute():
            setattr(spec, key, (base / value).resolve())
    spec.source = path
    for name in spec.engine.settings:
        if name not in ("env", "server_args"):
            check_setting_name(name, f"{path}: engine.settings")
    spec.fixed_settings()
    for name in (n for g in spec.groups for n in g):
        check_setting_name(name, f"{path}: groups")
    _check_adaptive_once(spec, path)
    _check_space(spec, path)
    _check_fixed(spec, path)
    _check_criterion(spec, path)
    if check_inputs:
        from bisect_eagle.spec.checks import check_spec_inputs  # torch and the data readers: only when needed

        check_spec_inputs(spec)
    return spec
