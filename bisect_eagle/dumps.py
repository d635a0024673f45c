"""Hidden-state dump readers (and writers, for the generator and tests), one sample at a time.

Formats (see the facts sheet, sections 9 and 10):

* ``speculators-legacy``: ``data_{i}.pt`` with ``input_ids`` [S], ``loss_mask`` [S] and ``hidden_states``,
  a list of [S, H] tensors whose last one is the target's final *pre-norm* state. Row t of training pairs
  aux_t and token t+1 with the target's prediction at t+1, masked by ``loss_mask[t+1]``.
* ``specforge``: ``rows_*/data_{i}.ckpt`` (or ``.ckpt.gz``) with ``input_ids`` and ``loss_mask`` [1, S],
  ``aux_hidden_state`` [1, S, k·H] and ``hidden_state`` [1, S, H] *after* the final norm. Same pairing,
  masked by ``loss_mask[t]``.

Both read into :class:`Sample`, whose ``states`` list ends with the final state, so a wiring rule means
the same thing on either. Loading is pickle-free (``torch.load(weights_only=True)``); a damaged file raises
:class:`DumpError` naming it, or is counted and skipped when asked.
"""

from __future__ import annotations

import gzip
import io
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bisect_eagle.errors import BadInput

FORMATS = ("speculators-legacy", "specforge")


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


@dataclass
class DumpReader:
    """Streams the samples of a dump directory; counts files skipped with ``skip_bad``."""

    path: Path
    skip_bad: bool = False
    fmt: str = ""
    files: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if not self.path.is_dir():
            raise DumpError(f"{self.path}: dump directory not found")
        self.fmt, self.files = detect(self.path)

    def __iter__(self) -> Iterator[Sample]:
        read = _read_legacy if self.fmt == "speculators-legacy" else _read_specforge
        for f in self.files:
            try:
                yield read(f)
            except DumpError as e:
                if not self.skip_bad:
                    raise
                self.skipped.append(str(e))

    def head(self, n: int) -> Iterator[Sample]:
        """The first ``n`` readable samples."""
        for i, s in enumerate(self):
            if i >= n:
                return
            yield s


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
    raise DumpError(f"{path}: no data_*.pt (speculators legacy) or data_*.ckpt[.gz] (SpecForge) files")


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


def _key(obj: dict, key: str, f: Path):
    if key not in obj:
        raise DumpError(f"{f}: key {key!r} is missing (found {sorted(obj)})")
    return obj[key]


def _read_legacy(f: Path) -> Sample:
    obj = _load(f)
    ids = _key(obj, "input_ids", f).reshape(-1).long()
    mask = _key(obj, "loss_mask", f).reshape(-1).bool()
    hs = _key(obj, "hidden_states", f)
    if not isinstance(hs, (list, tuple)) or len(hs) < 2:
        raise DumpError(f"{f}: key 'hidden_states' must be a list of >= 2 [seq, H] tensors")
    states = [h.reshape(h.shape[-2], h.shape[-1]) for h in hs]
    _check_lengths(f, ids, mask, states)
    return Sample(ids, mask, states, final_normed=False, mask_offset=1, source=f)


def _read_specforge(f: Path) -> Sample:
    obj = _load(f)
    ids = _key(obj, "input_ids", f).reshape(-1).long()
    mask = _key(obj, "loss_mask", f).reshape(-1).bool()
    aux = _key(obj, "aux_hidden_state", f)
    final = _key(obj, "hidden_state", f)
    h = final.shape[-1]
    aux = aux.reshape(-1, aux.shape[-1])
    if aux.shape[-1] % h:
        raise DumpError(f"{f}: aux_hidden_state width {aux.shape[-1]} is not a multiple of hidden_state's {h}")
    states = [*aux.split(h, dim=-1), final.reshape(-1, h)]
    _check_lengths(f, ids, mask, states)
    return Sample(ids, mask, states, final_normed=True, mask_offset=0, source=f)


def _check_lengths(f: Path, ids: torch.Tensor, mask: torch.Tensor, states: list[torch.Tensor]) -> None:
    n = ids.shape[0]
    if mask.shape[0] != n:
        raise DumpError(f"{f}: loss_mask has {mask.shape[0]} tokens, input_ids {n}")
    for i, s in enumerate(states):
        if s.shape[0] != n:
            raise DumpError(f"{f}: hidden state {i} has {s.shape[0]} rows, input_ids {n}")


def write_sample(
    directory: Path,
    index: int,
    fmt: str,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    aux: Sequence[torch.Tensor],
    final: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """Write one sample; ``final`` must be pre-norm for speculators-legacy and post-norm for specforge."""
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
