"""Cheap checks of the data inputs -- target, draft, dump -- run before any store, study, run or file exists.

Nothing here loads a model: the target and the draft are checked from their config.json and safetensors
headers, the dump from its first good sample. Each input is checked on its own (keys, types, shapes, weight
format, finite values, token ids) and against the others where a mismatch makes every trial fail (vocabulary,
hidden sizes). A problem is one :class:`~bisect_eagle.errors.BadInput` line naming the file and the key or
tensor; what is merely suspicious (a wiring, ids in the wrong place) is :mod:`bisect_eagle.doctor`'s job.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bisect_eagle.draft import DraftCheck, inspect_draft
from bisect_eagle.dumps import DumpError, DumpReader, Sample
from bisect_eagle.errors import BadInput
from bisect_eagle.target import TargetConfig, check_target_weights


@dataclass(frozen=True)
class DataFacts:
    """What the checks read, for callers that check ids or widths next (None: that input was not given)."""

    target: TargetConfig | None
    draft: DraftCheck | None
    dump_format: str | None
    first_sample: Sample | None  # the dump's first good sample


def _first_sample(dump: Path, *, vocab_size: int | None, skip_bad: bool) -> tuple[str, Sample]:
    reader = DumpReader(dump, skip_bad=skip_bad, vocab_size=vocab_size)
    first = next(iter(reader.head(1)), None)
    if first is None:
        raise DumpError(f"{dump}: no usable samples ({len(reader.skipped)} bad files skipped, the first: "
                        f"{reader.skipped[0]})")
    return reader.fmt, first


def _cross_check(target: Path, t: TargetConfig, d: DraftCheck) -> None:
    """The draft against the target it will run with."""
    cf, where = d.config_file, target / "config.json"
    vocab_key = "transformer_layer_config.vocab_size" if cf.layout == "speculators" else "vocab_size"
    if cf.vocab_size != t.vocab_size:
        raise BadInput(f"{cf.path}: key '{vocab_key}' is {cf.vocab_size}; the target's vocab_size ({where}) is "
                       f"{t.vocab_size}")
    if cf.target_hidden_size != t.hidden_size:
        key = "target_hidden_size" if "target_hidden_size" in cf.raw else "hidden_size"
        raise BadInput(f"{cf.path}: key '{key}' gives a target hidden size of {cf.target_hidden_size}; the "
                       f"target's hidden_size ({where}) is {t.hidden_size}")
    if "embed_tokens.weight" not in d.tensors and cf.hidden_size != t.hidden_size:
        raise BadInput(f"{cf.path}: key 'hidden_size' is {cf.hidden_size} and the draft has no embed_tokens.weight; "
                       f"the target's embedding ({where}: hidden_size) is {t.hidden_size} wide")


def validate_data(
    *, target: Path | None = None, draft: Path | None = None, dump: Path | None = None, skip_bad: bool = False
) -> DataFacts:
    """Check whichever of ``target``, ``draft`` and ``dump`` are given, alone and against each other.

    ``skip_bad`` lets the dump check pass over bad sample files to the first good one (as ``--skip-bad``
    streaming would). Reads configs, safetensors headers and one dump sample; writes nothing.
    """
    t = check_target_weights(target) if target is not None else None
    d = inspect_draft(draft) if draft is not None else None
    if target is not None and t is not None and d is not None:
        _cross_check(Path(target), t, d)
    fmt, first = None, None
    if dump is not None:
        fmt, first = _first_sample(Path(dump), vocab_size=t.vocab_size if t else None, skip_bad=skip_bad)
        if t is not None and first.width != t.hidden_size:
            raise DumpError(f"{first.source}: tensor {first.state_name(0)!r} is {first.width} wide; the target's "
                            f"hidden_size ({Path(target) / 'config.json'}) is {t.hidden_size}")
    return DataFacts(t, d, fmt, first)
