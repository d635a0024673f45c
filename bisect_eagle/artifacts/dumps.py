"""Hidden-state dump readers (and writers, for the generator and tests), one sample at a time.

Formats (upstream: speculators' legacy ``data_{i}.pt`` writer and SpecForge's
``prepare_hidden_states.py``):

* ``speculators-legacy``: ``data_{i}.pt`` with ``input_ids`` [S], ``loss_mask`` [S] and
  ``hidden_states``, a list of [S, H] tensors whose last one is the target's final *pre-norm* state.
  Row t of training pairs aux_t and token t+1 with the target's prediction at t+1, masked by
  ``loss_mask[t+1]``.
* ``specforge``: ``rows_*/data_{i}.ckpt`` (or ``.ckpt.gz``) with ``input_ids`` and ``loss_mask`` [1,
  S], ``aux_hidden_state`` [1, S, k·H] and ``hidden_state`` [1, S, H] *after* the final norm. Same
  pairing, masked by ``loss_mask[t]``.

Both read into :class:`Sample`, whose ``states`` list ends with the final state, so a wiring rule
means the same thing on either. Loading is pickle-free (``torch.load(weights_only=True)``). Each
sample is checked as it is read -- keys, tensor types and dtypes, shapes, lengths, finite states (no
accuracy is ever computed on NaN or inf), token ids inside the target vocabulary -- and a bad one
raises :class:`DumpError` naming the file and the key or tensor, or is skipped and recorded when
asked.
"""

from __future__ import annotations

import gzip
import io
import itertools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bisect_eagle.errors import BadInput

FORMATS = ("speculators-legacy", "specforge")
STATES_KEY = {"speculators-legacy": "hidden_states", "specforge": "aux_hidden_state"}


class DumpError(BadInput):
    """A dump file or directory that cannot be read as a hidden-state dump."""


@dataclass
class Sample:
    """One dumped sequence."""

    input_ids: torch.Tensor  # [S] int64
    loss_mask: torch.Tensor  # [S] bool
    states: list[torch.Tensor]  # each [S, H]; the last one is the final state
    final_normed: bool  # True when the final state is after the target's final norm (SpecForge)
    mask_offset: int  # row t is masked by loss_mask[t + mask_offset]
    source: Path
    # the tensor each state came from, for messages
    state_names: list[str] = field(default_factory=list)

    @property
    def width(self) -> int:
        """The hidden size H of the states."""
        return self.states[0].shape[-1]

    def state_name(self, i: int) -> str:
        """The file's name for state ``i`` (``hidden_states[i]``, ``aux_hidden_state``, ...).

        Args:
            i: the index into :attr:`states` (0-based; the last is the final state).

        Returns:
            The tensor's name in the dump file; ``"states[i]"`` when the reader recorded none.
        """
        return self.state_names[i] if i < len(self.state_names) else f"states[{i}]"


@dataclass
class DumpReader:
    """Streams the checked samples of a dump directory; with ``skip_bad``, bad files are skipped and
    recorded.

    Every sample is checked as it is read (:func:`read_sample`); token ids also against
    ``vocab_size`` when given, and each sample's state count and width against the first good
    sample's. ``skipped`` holds one line per file skipped by the latest pass.
    """

    path: Path
    skip_bad: bool = False
    vocab_size: int | None = None
    fmt: str = ""
    files: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if not self.path.is_dir():
            raise DumpError(f"{self.path}: dump directory not found")
        self.fmt, self.files = detect(self.path)

    def __iter__(self) -> Iterator[Sample]:
        self.skipped = []
        layout: tuple[int, int] | None = None
        for f in self.files:
            try:
                sample = self._checked(f, layout)
            except DumpError as e:
                if not self.skip_bad:
                    raise
                self.skipped.append(str(e))
                continue
            layout = layout or (len(sample.states), sample.width)
            yield sample

    def _checked(self, f: Path, layout: tuple[int, int] | None) -> Sample:
        """One file read and checked, also against the (state count, width) of the first good
        sample."""
        sample = read_sample(f, self.fmt)
        check_token_ids(sample, self.vocab_size)
        if layout is not None and (len(sample.states), sample.width) != layout:
            raise DumpError(
                f"{f}: key {STATES_KEY[self.fmt]!r} gives {len(sample.states)} states "
                f"{sample.width} wide; the first sample's gives {layout[0]} states {layout[1]} wide"
            )
        return sample

    def head(self, n: int) -> Iterator[Sample]:
        """The first ``n`` good samples.

        Args:
            n: how many samples at most (fewer when the dump holds fewer good ones).

        Returns:
            A lazy iterator: files are read and checked as it advances, and :attr:`skipped` is
                reset.

        Raises:
            DumpError: while iterating, a bad sample file when ``skip_bad`` is off.
        """
        return itertools.islice(iter(self), n)


def _index(p: Path) -> int:
    m = re.search(r"data_(\d+)", p.name)
    return int(m.group(1)) if m else -1


def detect(path: Path) -> tuple[str, list[Path]]:
    """The dump format of a directory and its sample files in index order."""
    legacy = sorted(path.glob("data_*.pt"), key=_index)
    specforge = sorted([*path.glob("**/data_*.ckpt"), *path.glob("**/data_*.ckpt.gz")], key=_index)
    if legacy and not specforge:
        return "speculators-legacy", legacy
    if specforge and not legacy:
        return "specforge", specforge
    if legacy and specforge:
        raise DumpError(f"{path}: holds both data_*.pt and data_*.ckpt files; point at one dump")
    raise DumpError(
        f"{path}: no data_*.pt (speculators legacy) or data_*.ckpt[.gz] (SpecForge) files"
    )


def _load(f: Path) -> dict:
    try:
        source = io.BytesIO(gzip.decompress(f.read_bytes())) if f.suffix == ".gz" else f
        obj = torch.load(source, weights_only=True, map_location="cpu")
    except Exception as e:  # torch/zip/gzip raise many types for damaged files
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DumpError(f"{f}: cannot read ({reason})") from None
    if not isinstance(obj, dict):
        raise DumpError(f"{f}: expected a dict of tensors, found {type(obj).__name__}")
    return obj


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {list(value.shape)}"
    if isinstance(value, (list, tuple)):
        kinds = sorted({type(v).__name__ for v in value})
        return f"a {type(value).__name__} of {len(value)} ({', '.join(kinds) or 'nothing'})"
    return f"{type(value).__name__} {value!r:.40}"


def _tensor(obj: dict, key: str, f: Path) -> torch.Tensor:
    if key not in obj:
        raise DumpError(f"{f}: key {key!r} is missing (found {sorted(map(str, obj))})")
    value = obj[key]
    if not isinstance(value, torch.Tensor):
        raise DumpError(f"{f}: key {key!r}: expected a tensor, found {_describe(value)}")
    return value


def _ids(obj: dict, key: str, f: Path) -> torch.Tensor:
    """A tensor [S] or [1, S] as [S]; ``input_ids`` must be integers, ``loss_mask`` 0/1 values of
    any dtype."""
    t = _tensor(obj, key, f)
    if key == "input_ids" and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
        raise DumpError(
            f"{f}: tensor {key!r}: expected an integer tensor [seq], found {_describe(t)}"
        )
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1:
        raise DumpError(
            f"{f}: tensor {key!r}: expected shape [seq] (or [1, seq]), found {list(t.shape)}"
        )
    if key == "loss_mask" and t.dtype != torch.bool and not bool(((t == 0) | (t == 1)).all()):
        raise DumpError(f"{f}: tensor {key!r}: expected 0/1 values, found {_describe(t)}")
    return t


def _states(t: torch.Tensor, name: str, f: Path) -> torch.Tensor:
    """A floating, finite [S, H] (or [1, S, H]) state tensor as [S, H]."""
    if not t.is_floating_point():
        raise DumpError(
            f"{f}: tensor {name!r}: expected a floating-point tensor, found {_describe(t)}"
        )
    if t.dim() == 3 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 2 or t.shape[-1] == 0:
        raise DumpError(
            f"{f}: tensor {name!r}: expected shape [seq, H] (or [1, seq, H]), found {list(t.shape)}"
        )
    # NaN and inf propagate; no float64 overflow
    if not bool(torch.isfinite(t.sum(dtype=torch.float64))):
        raise DumpError(
            f"{f}: tensor {name!r} holds {int((~torch.isfinite(t)).sum())} NaN or inf values"
        )
    return t


def _read_legacy(f: Path) -> Sample:
    obj = _load(f)
    ids, mask = _ids(obj, "input_ids", f), _ids(obj, "loss_mask", f)
    if "hidden_states" not in obj:
        raise DumpError(f"{f}: key 'hidden_states' is missing (found {sorted(map(str, obj))})")
    hs = obj["hidden_states"]
    if (
        not isinstance(hs, (list, tuple))
        or len(hs) < 2
        or not all(isinstance(h, torch.Tensor) for h in hs)
    ):
        raise DumpError(
            f"{f}: key 'hidden_states': expected a list of >= 2 [seq, H] tensors, found "
            f"{_describe(hs)}"
        )
    states = [_states(h, f"hidden_states[{i}]", f) for i, h in enumerate(hs)]
    names = [f"hidden_states[{i}]" for i in range(len(states))]
    _check_lengths(f, ids, mask, states, names)
    return Sample(
        ids.long(),
        mask.bool(),
        states,
        final_normed=False,
        mask_offset=1,
        source=f,
        state_names=names,
    )


def _read_specforge(f: Path) -> Sample:
    obj = _load(f)
    ids, mask = _ids(obj, "input_ids", f), _ids(obj, "loss_mask", f)
    aux = _states(_tensor(obj, "aux_hidden_state", f), "aux_hidden_state", f)
    final = _states(_tensor(obj, "hidden_state", f), "hidden_state", f)
    h = final.shape[-1]
    if aux.shape[-1] % h:
        raise DumpError(
            f"{f}: tensor 'aux_hidden_state' is {aux.shape[-1]} wide, not a multiple of "
            f"hidden_state's {h}"
        )
    states = [*aux.split(h, dim=-1), final]
    names = ["aux_hidden_state"] * (len(states) - 1) + ["hidden_state"]
    _check_lengths(f, ids, mask, states, names)
    return Sample(
        ids.long(),
        mask.bool(),
        states,
        final_normed=True,
        mask_offset=0,
        source=f,
        state_names=names,
    )


def read_sample(f: Path, fmt: str) -> Sample:
    """One sample file of dump format ``fmt``, checked: keys, types, dtypes, shapes and finite
    states."""
    return _read_legacy(f) if fmt == "speculators-legacy" else _read_specforge(f)


def _check_lengths(
    f: Path, ids: torch.Tensor, mask: torch.Tensor, states: list[torch.Tensor], names: list[str]
) -> None:
    n = ids.shape[0]
    if n < 2:
        raise DumpError(f"{f}: tensor 'input_ids' has {n} tokens; a sample needs at least 2")
    if mask.shape[0] != n:
        raise DumpError(f"{f}: tensor 'loss_mask' has {mask.shape[0]} tokens, input_ids {n}")
    for s, name in zip(states, names, strict=True):
        if s.shape[0] != n:
            raise DumpError(f"{f}: tensor {name!r} has {s.shape[0]} rows, input_ids {n}")
        if s.shape[-1] != states[0].shape[-1]:
            raise DumpError(
                f"{f}: tensor {name!r} is {s.shape[-1]} wide, {names[0]!r} {states[0].shape[-1]}"
            )


def check_token_ids(sample: Sample, vocab_size: int | None) -> None:
    """Token ids are >= 0 and, when ``vocab_size`` is given, inside the target vocabulary.

    Args:
        sample: one dumped sample.
        vocab_size: the target's vocabulary size; None checks only that ids are >= 0.

    Raises:
        DumpError: an id outside the vocabulary, naming the sample's file and the first bad id.
    """
    ids = sample.input_ids
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        bad = low if low < 0 else high
        limit = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
        raise DumpError(
            f"{sample.source}: tensor 'input_ids' holds token id {bad}, outside the target "
            f"vocabulary {limit}"
        )


def write_sample(
    directory: Path,
    index: int,
    *,
    fmt: str,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    aux: Sequence[torch.Tensor],
    final: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """Write one sample; ``final`` must be pre-norm for speculators-legacy and post-norm for
    specforge."""
    if fmt == "speculators-legacy":
        path = directory / f"data_{index}.pt"
        obj = {
            "input_ids": input_ids.long(),
            "loss_mask": loss_mask.long(),
            "hidden_states": [t.to(dtype).contiguous() for t in [*aux, final]],
        }
    elif fmt == "specforge":
        group = index // 2000 * 2000
        path = directory / f"rows_{group}-{group + 2000}" / f"data_{index}.ckpt"
        obj = {
            "input_ids": input_ids.long()[None],
            "loss_mask": loss_mask.long()[None],
            "aux_hidden_state": torch.cat(list(aux), -1).to(dtype)[None].contiguous(),
            "hidden_state": final.to(dtype)[None].contiguous(),
        }
    else:
        raise ValueError(f"unknown dump format {fmt!r}; expected one of {FORMATS}")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(obj, path)
    return path
