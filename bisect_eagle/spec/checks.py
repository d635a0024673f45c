"""Cheap checks of the inputs -- a spec's paths, device and prompts; target, draft, dump -- run
before any store, study, run or file exists.

Nothing here loads a model: the target and the draft are checked from their config.json and
safetensors headers, the dump from its first good sample. Each input is checked on its own (keys,
types, shapes, weight format, finite values, token ids) and against the others where a mismatch
makes every trial fail (vocabulary, hidden sizes). A problem is one
:class:`~bisect_eagle.errors.BadInput` line naming the file and the key or tensor; what is merely
suspicious (a wiring, ids in the wrong place) is :mod:`bisect_eagle.doctor`'s job.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bisect_eagle.artifacts import capture, layers
from bisect_eagle.artifacts.devices import check_device
from bisect_eagle.artifacts.draft import DraftCheck, inspect_draft
from bisect_eagle.artifacts.dumps import DumpError, DumpReader, Sample
from bisect_eagle.artifacts.prompts import check_prompts
from bisect_eagle.artifacts.target import TargetConfig, check_target_weights, read_target_config
from bisect_eagle.artifacts.wiring import check_width, parse_rule
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.spec.schema import PATH_KEYS, Spec


@dataclass(frozen=True)
class DataFacts:
    """What the checks read, for callers that check ids or widths next (None: that input was not
    given)."""

    target: TargetConfig | None
    draft: DraftCheck | None
    dump_format: str | None
    first_sample: Sample | None  # the dump's first good sample


def _first_sample(dump: Path, *, vocab_size: int | None, skip_bad: bool) -> tuple[str, Sample]:
    reader = DumpReader(dump, skip_bad=skip_bad, vocab_size=vocab_size)
    first = next(iter(reader.head(1)), None)
    if first is None:
        raise DumpError(
            f"{dump}: no usable samples ({len(reader.skipped)} bad files skipped, the first: "
            f"{reader.skipped[0]})"
        )
    return reader.fmt, first


def _cross_check(target: Path, t: TargetConfig, d: DraftCheck) -> None:
    """The draft against the target it will run with."""
    cf, where = d.config_file, target / "config.json"
    vocab_key = (
        "transformer_layer_config.vocab_size" if cf.layout == "speculators" else "vocab_size"
    )
    if cf.vocab_size != t.vocab_size:
        raise BadInput(
            f"{cf.path}: key '{vocab_key}' is {cf.vocab_size}; the target's vocab_size ({where}) "
            f"is {t.vocab_size}"
        )
    if cf.target_hidden_size != t.hidden_size:
        key = "target_hidden_size" if "target_hidden_size" in cf.raw else "hidden_size"
        raise BadInput(
            f"{cf.path}: key '{key}' gives a target hidden size of {cf.target_hidden_size}; the "
            f"target's hidden_size ({where}) is {t.hidden_size}"
        )
    if "embed_tokens.weight" not in d.tensors and cf.hidden_size != t.hidden_size:
        raise BadInput(
            f"{cf.path}: key 'hidden_size' is {cf.hidden_size} and the draft has no "
            f"embed_tokens.weight; the target's embedding ({where}: hidden_size) is "
            f"{t.hidden_size} wide"
        )


def validate_data(
    *,
    target: Path | None = None,
    draft: Path | None = None,
    dump: Path | None = None,
    skip_bad: bool = False,
) -> DataFacts:
    """Check whichever of ``target``, ``draft`` and ``dump`` are given, alone and against each
    other.

    Reads configs, safetensors headers and one dump sample; writes nothing.

    Args:
        target: the target's Hugging Face directory (weights checked from the headers); None:
            skipped.
        draft: the draft directory (:func:`~bisect_eagle.artifacts.draft.inspect_draft`); None:
            skipped.
        dump: the hidden-state dump directory (its first good sample read); None: skipped.
        skip_bad: let the dump check pass over bad sample files to the first good one (as
            ``--skip-bad`` streaming would).

    Returns:
        What was read: the target's config, the draft check, the dump format and first sample (each
        None when that input was not given).

    Raises:
        BadInput: a bad input, or a target, draft and dump that disagree (vocabulary, hidden size):
            one line naming the file and the key or tensor.
    """
    t = check_target_weights(target) if target is not None else None
    d = inspect_draft(draft) if draft is not None else None
    if target is not None and t is not None and d is not None:
        _cross_check(Path(target), t, d)
    fmt, first = None, None
    if dump is not None:
        fmt, first = _first_sample(
            Path(dump), vocab_size=t.vocab_size if t else None, skip_bad=skip_bad
        )
        if t is not None and first.width != t.hidden_size:
            raise DumpError(
                f"{first.source}: tensor {first.state_name(0)!r} is {first.width} wide; the "
                f"target's hidden_size ({Path(target) / 'config.json'}) is {t.hidden_size}"
            )
    return DataFacts(t, d, fmt, first)


def _required(spec: Spec) -> tuple[str, ...]:
    """The path keys a spec must give: all four for the local engine or a stage 1 (it reads every
    one here)."""
    if spec.engine.in_process or spec.standalone.wirings:
        return PATH_KEYS
    return ("draft",) if spec.engine.server.model_path else ("target", "draft")


def _present(spec: Spec) -> dict[str, Path]:
    """The spec's paths that exist here; a missing one is an error unless the sglang engine only
    passes it on."""
    required = _required(spec)
    local = spec.engine.in_process or bool(spec.standalone.wirings)
    out = {}
    for key in PATH_KEYS:
        value = getattr(spec, key)
        if value is None:
            if key in required:
                raise BadInput(
                    f"{spec.source}: key {key!r} is missing (give a path, or 'scenario: NAME')"
                )
            continue
        if not value.exists():
            if local:
                raise BadInput(f"{spec.source}: key {key!r}: {value} does not exist")
            # an sglang spec may name paths of the server's machine (a dry run works anywhere)
            continue
        mode = os.R_OK | (os.X_OK if value.is_dir() else 0)
        if not os.access(value, mode):
            raise BadInput(f"{spec.source}: key {key!r}: {value} is not readable")
        out[key] = value
    return out


def _largest(spec: Spec, name: str) -> int:
    """The largest value a count setting takes in any trial of the spec (fixed, or the top of its
    space)."""
    value = getattr(spec.fixed_settings(), name)
    param = spec.space.get(name)
    if param is None:
        return value
    if param.type == "categorical":
        return max(int(c) for c in param.choices or [] if isinstance(c, (int, float)))
    return int(param.high or 0)


def _id_lists(spec: Spec) -> Iterator[tuple[str, list[int]]]:
    """(key, ids) of every layer-id list the spec gives in SGLang's convention."""
    fixed = spec.fixed_settings().eagle_aux_hidden_state_layer_ids
    if fixed is not None:
        yield f"engine.settings.{IDS_KEY}", fixed
    param = spec.space.get(IDS_KEY)
    for i, choice in enumerate(param.choices or [] if param is not None else []):
        if isinstance(choice, list):
            yield f"space.{IDS_KEY}.choices[{i}]", choice
    for i, w in enumerate(spec.standalone.wirings):
        if w.layer_ids is not None:
            yield f"standalone.wirings[{i}].layer_ids", w.layer_ids


def _check_ids(spec: Spec, target: Path) -> None:
    """Every layer id against the target's depth, read as SGLang reads ids for its model type.

    A space choice that SGLang reads but cannot serve (``-1`` on a family that takes ids raw) is not
    an input error: the plan of that trial refuses it with SGLang's reason. Ids outside every
    meaning are still refused.
    """
    cfg = read_target_config(target)
    n = layers.target_depth(cfg) or cfg["num_hidden_layers"]
    family = spec.engine.family_capture_rules
    conv = (
        capture.sglang_convention(cfg.get("model_type"), layers.target_architecture(cfg))
        if family
        else "sglang"
    )
    lists = [
        *_id_lists(spec),
        *([("dump_layer_ids", spec.dump_layer_ids)] if spec.dump_layer_ids else []),
    ]
    for key, ids in lists:
        try:
            layers.ids_to_canonical(
                ids, "sglang" if key == "dump_layer_ids" else conv, num_layers=n
            )
        except layers.LayerIdError as e:
            if key.startswith("space.") and conv in layers.LIST_RULES:
                try:  # a value SGLang's parser takes: its capture rule decides per trial
                    layers.ids_to_canonical(ids, "sglang", num_layers=n)
                    continue
                except layers.LayerIdError:
                    pass
            raise BadInput(
                f"{spec.source}: key {key!r}: {ids}: {e} ({target / 'config.json'})"
            ) from None


def check_spec_inputs(spec: Spec) -> DataFacts:
    """Everything a spec names that exists here, before anything is written (``load_spec`` calls
    this).

    Paths (present where needed, readable), the device (local engine), the prompts file (lines,
    keys, and at least ``warmup_prompts + num_prompts`` prompts for the largest trial), the data
    (:func:`validate_data`: the target's weights and the dump only where this machine reads them)
    and the layer ids against the target's depth. Paths of an sglang spec that are absent here are
    skipped (:func:`check_live_inputs` checks what a live run reads).

    Args:
        spec: a validated spec, its paths resolved (:func:`~bisect_eagle.spec.load.load_spec`).

    Returns:
        What :func:`validate_data` read (inputs this machine does not read are None).

    Raises:
        BadInput: one line naming the file and the key or tensor.
    """
    present = _present(spec)
    fixed = spec.fixed_settings()
    if spec.engine.in_process:
        check_device(fixed.device, f"{spec.source}: engine.settings.device")
        for i, choice in enumerate(
            spec.space["device"].choices or [] if "device" in spec.space else []
        ):
            check_device(choice, f"{spec.source}: space.device.choices[{i}]")
    if "prompts" in present:
        need = _largest(spec, "warmup_prompts") + _largest(spec, "num_prompts")
        try:
            check_prompts(present["prompts"], need, what="warmup_prompts + num_prompts")
        except BadInput as e:
            raise BadInput(f"{spec.source}: key 'prompts': {e}") from None
    reads_data = spec.engine.in_process or bool(spec.standalone.wirings)
    facts = validate_data(
        target=present.get("target") if reads_data else None,
        draft=present.get("draft"),
        dump=present.get("dump") if reads_data else None,
    )
    target = present.get("target") or _model_path(spec)
    if target is not None and (target / "config.json").is_file():
        _check_ids(spec, target)
    _check_wirings(spec, facts)
    return facts


def _check_wirings(spec: Spec, facts: DataFacts) -> None:
    """Each stage-1 wiring against the dump and the draft it will be scored with: a rule must select
    existing states (``[5:2]`` selects none), each once, as many as the draft's ``fc`` takes; layer
    ids as many."""
    draft = facts.draft
    if draft is None:
        return
    need, hidden = draft.config.num_aux, draft.config.target_hidden_size
    for i, w in enumerate(spec.standalone.wirings):
        where = f"{spec.source}: key 'standalone.wirings[{i}]' ({w.label})"
        refusal = (
            None
            if w.layer_ids is None
            else layers.fc_width_refusal(
                w.layer_ids,
                width=need,
                where=where,
                said_by=str(draft.config_file.path),
                named="layer_ids",
            )
        )
        if refusal is not None:
            raise BadInput(refusal)
        if w.rule is not None and facts.first_sample is not None:
            try:
                check_width(
                    parse_rule(w.rule),
                    len(facts.first_sample.states),
                    hidden=hidden,
                    fc_in=need * hidden,
                )
            except BadInput as e:
                raise BadInput(f"{where}: {e} (dump {facts.first_sample.source})") from None


def _model_path(spec: Spec) -> Path | None:
    path = spec.engine.server.model_path if spec.engine.server is not None else None
    return Path(path) if path and Path(path).is_dir() else None


def check_live_inputs(spec: Spec) -> None:
    """What a live run reads on this machine whatever its engine: the prompts file (the sglang
    engine sends them).

    Args:
        spec: a validated spec.

    Raises:
        BadInput: no ``prompts`` key, or a prompts file that is not here, one line naming the spec.
    """
    if spec.prompts is None:
        raise BadInput(
            f"{spec.source}: key 'prompts' is missing; a live run reads the prompts here"
        )
    if not spec.prompts.is_file():
        raise BadInput(
            f"{spec.source}: key 'prompts': {spec.prompts} does not exist on this machine (the "
            "engine reads the prompts here and sends them to the server)"
        )
