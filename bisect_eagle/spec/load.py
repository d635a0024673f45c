"""Loading a spec file: YAML read safely, a shipped scenario filled in, every rule of the schema
applied (:class:`~bisect_eagle.spec.schema.Spec` holds them all), relative paths resolved against
the file's folder, and the inputs it names checked (:mod:`bisect_eagle.spec.checks`) before anything
is written.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import ValidationError

from bisect_eagle.artifacts import scenarios
from bisect_eagle.artifacts.configs import validation_error
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.checks import check_spec_inputs
from bisect_eagle.spec.schema import (
    PATH_KEYS,
    Spec,
)


def _fill_from_scenario(raw: dict, path: Path) -> None:
    try:
        sc = scenarios.get(raw["scenario"])
    except BadInput as e:
        raise BadInput(f"{path}: key 'scenario': {e}") from None
    meta = sc.meta
    for key in PATH_KEYS:
        raw.setdefault(key, str(getattr(sc, key)))
    raw.setdefault("dump_layer_ids", meta["aux_layer_ids"]["sglang"])
    raw.setdefault("training_accuracy", meta["training_accuracy"]["full_vocab"])


MAX_SPEC_BYTES = 1_000_000  # a spec is a page of YAML; this is a thousand pages
# YAML anchors reused more often than this are refused (an alias bomb expands exponentially)
MAX_ALIASES = 20


class _BudgetLoader(yaml.SafeLoader):
    """PyYAML's safe loader, counting alias uses: a document past :data:`MAX_ALIASES` is refused
    before it is built (PyYAML has no such limit of its own, and a few lines of aliases can expand
    to gigabytes)."""

    aliases = 0

    def compose_node(self, parent, index):  # noqa: ANN001 (PyYAML's signature)
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_ALIASES} aliases (*name): refused")
        return super().compose_node(parent, index)


def read_yaml(path: Path) -> object:
    """A YAML file's one document, safely: no Python objects, at most :data:`MAX_SPEC_BYTES` and
    :data:`MAX_ALIASES` alias uses; any fault is one :class:`BadInput` line."""
    size = path.stat().st_size
    if size > MAX_SPEC_BYTES:
        raise BadInput(f"{path}: {size} bytes; a spec holds at most {MAX_SPEC_BYTES}")
    try:
        text = path.read_text()
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    loader = _BudgetLoader(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as e:
        raise BadInput(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    finally:
        loader.dispose()


def load_spec(path: str | Path, *, check_inputs: bool = True) -> Spec:
    """Read and validate a spec file, and every input it names that exists here; writes nothing.

    The whole spec (keys, types, bounds, repeated ids, rules, setting names) and then, unless
    ``check_inputs`` is False (``doctor`` explains those problems instead), its inputs
    (:func:`bisect_eagle.spec.checks.check_spec_inputs`: paths, device, prompts, data, ids against
    the target's depth) are checked before any command creates a store, a study, a run or a
    directory.

    Args:
        path: the spec file (YAML).
        check_inputs: also check the inputs the spec names; False for ``doctor``, which explains
            those problems instead.

    Returns:
        The spec, its data paths made absolute against the spec's directory and ``source`` set to
        ``path``.

    Raises:
        BadInput: a missing or unreadable file, YAML that does not parse or is not a mapping, any
            key the schema refuses, or (with ``check_inputs``) a bad input: one line naming the file
            and key.
    """
    path = Path(path)
    if not path.is_file():
        raise BadInput(
            f"{path}: spec file not found" if not path.exists() else f"{path}: not a file"
        )
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise BadInput(f"{path}: expected a mapping at the top level, found {type(raw).__name__}")
    if raw.get("scenario"):
        _fill_from_scenario(raw, path)
    try:
        spec = Spec.model_validate(raw, context={"source": path})
    except ValidationError as e:
        raise validation_error(e, where=path) from None
    base = path.resolve().parent
    for key in PATH_KEYS:
        value = getattr(spec, key)
        if value is not None and not value.is_absolute():
            setattr(spec, key, (base / value).resolve())
    # an interpreter given as a relative path, like a model
    for server in (spec.engine.sglang, spec.engine.vllm):
        if (
            server.python
            and "/" in server.python
            and not Path(server.python).expanduser().is_absolute()
        ):
            # not resolve(): a venv's python is a symlink
            server.python = os.path.normpath(base / server.python)
    spec.source = path
    if check_inputs:
        check_spec_inputs(spec)
    return spec
