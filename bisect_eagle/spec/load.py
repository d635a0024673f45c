"""Loading a spec file: YAML read safely, a shipped scenario filled in, every rule of the schema applied
(:class:`~bisect_eagle.spec.schema.Spec` holds them all), relative paths resolved against the file's folder, and
the inputs it names checked (:mod:`bisect_eagle.spec.checks`) before anything is written.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from bisect_eagle.artifacts import scenarios
from bisect_eagle.artifacts.configs import validation_error
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.checks import check_spec_inputs
from bisect_eagle.spec.schema import (
    Spec,
)


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
        spec = Spec.model_validate(raw, context={"source": path})
    except ValidationError as e:
        raise validation_error(e, where=path) from None
    base = path.resolve().parent
    for key in ("target", "draft", "dump", "prompts"):
        value = getattr(spec, key)
        if value is not None and not value.is_absolute():
            setattr(spec, key, (base / value).resolve())
    spec.source = path
    if check_inputs:
        check_spec_inputs(spec)
    return spec
