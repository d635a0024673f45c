"""Standalone accuracy trial: the draft on the hidden states it was trained on, under a chosen
wiring.

Alignment (speculators' ``shift_batch``; SpecForge pairs the same rows): row ``t`` feeds the draft
``fc(rule(states)_t)`` and token ``x_{t+1}``; its label is the target's greedy token at ``t + 1``
(argmax of ``lm_head(norm(final_{t+1}))``); it counts where ``loss_mask[t + 1]`` (SpecForge:
``[t]``). Step ``k`` of the teacher-forced multi-step run reads token ``x_{t+1+k}`` and is scored
against the target's greedy token at ``t + 1 + k``.

Two accuracies, because frameworks disagree (speculators' and SpecForge's training metrics):
``draft_vocab`` compares with the target's argmax *within the draft vocabulary* (speculators,
optimistic); ``full_vocab`` maps the draft's pick to a target id and compares with the target's
argmax over its whole vocabulary (SpecForge; target tokens outside the draft vocabulary always
miss). The simulated accept length is SpecForge's ``a0 + a0·a1 + …`` over per-step full-vocabulary
accuracies (drafted tokens only; add 1 for SGLang's AL).

Uncertainty: each accuracy's standard error (``accuracy_sd``) is a bootstrap over the dump's samples
(its tokens are not independent: a sample's tokens share a prompt), from the first step's hits per
sample (:func:`bootstrap_sd`). The gate (:mod:`bisect_eagle.search.gate`) sizes its margin with it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from bisect_eagle.artifacts.draft import LoadedDraft
from bisect_eagle.artifacts.dumps import DumpError, DumpReader, Sample, check_token_ids
from bisect_eagle.artifacts.target import TargetHead
from bisect_eagle.artifacts.wiring import Rule, check_width
from bisect_eagle.errors import BadInput

BOOTSTRAP_DRAWS = 2000
ALIGNMENT = (
    "row t: fc(rule(states)[t]) + token t+1 -> target argmax at t+1, masked by loss_mask[t+1] "
    "(SpecForge dumps: loss_mask[t]); step k reads token t+1+k, scored at t+1+k"
)


@dataclass
class Counts:
    """Running hit counts of one draft step."""

    tokens: int = 0
    draft_hits: int = 0
    full_hits: int = 0
    # (tokens, draft hits, full hits) per sample
    by_sample: list[tuple[int, int, int]] = field(default_factory=list)

    def rate(self, hits: int) -> float:
        return hits / self.tokens if self.tokens else float("nan")


@dataclass
class StandaloneResult:
    """What one standalone trial measured."""

    rule: str
    selection: list[int | str]
    samples: int
    tokens: int
    steps: int
    accuracy: dict[str, float]
    per_position: list[dict[str, float]]
    simulated_accept_length: float
    # bootstrap over samples (module docstring)
    accuracy_sd: dict[str, float] = field(default_factory=dict)
    skipped_files: list[str] = field(default_factory=list)
    alignment: str = ALIGNMENT

    def to_json(self) -> dict:
        """The result as plain data (``bisect-eagle standalone --json``).

        Returns:
            Every field by name (``dataclasses.asdict``).
        """
        return asdict(self)


@dataclass
class Batch:
    """Padded rows of several samples, ready for ``ttt_forward``."""

    aux: torch.Tensor  # [B, T, k·H]
    tokens: torch.Tensor  # [B, T + steps - 1]
    full_labels: torch.Tensor  # [B, T + steps - 1] target argmax (target ids)
    draft_labels: torch.Tensor  # [B, T + steps - 1] argmax within the draft vocabulary (draft ids)
    valid: torch.Tensor  # [B, T + steps - 1] bool


def batches(
    samples: Iterable[Sample],
    rule: Rule,
    *,
    head: TargetHead,
    draft_vocab: torch.Tensor,
    steps: int,
    max_rows: int,
) -> Iterator[Batch]:
    """Group samples into padded batches of at most ``max_rows`` rows (memory-bounded); see the
    module doc."""
    pending: list[Sample] = []
    rows = 0

    def flush() -> Batch:
        """The pending samples as one padded batch, with the target's labels.

        Returns:
            The batch: ``aux`` rows, tokens, the target's full- and draft-vocabulary
            argmax, and the valid mask.
        """
        width = max(s.input_ids.shape[0] for s in pending) - 1
        b, cols, hidden = len(pending), width + steps - 1, pending[0].states[-1].shape[-1]
        aux = torch.zeros(b, width, len(rule.select(len(pending[0].states))) * hidden)
        final = torch.zeros(b, cols, hidden)
        tok = torch.zeros(b, cols, dtype=torch.long)
        valid = torch.zeros(b, cols, dtype=torch.bool)
        for i, s in enumerate(pending):
            n = s.input_ids.shape[0] - 1  # rows t = 0 .. S-2; labels at positions 1 .. S-1
            rule.apply(s.states, s.input_ids, embed=head.embed, out=aux[i, :n])
            final[i, :n] = s.states[-1][1:]
            tok[i, :n] = s.input_ids[1:]
            valid[i, :n] = s.loss_mask[1:] if s.mask_offset == 1 else s.loss_mask[:-1]
        normed = final if pending[0].final_normed else head.norm(final)
        logits = normed @ head.lm_head.T  # target logits at label positions, one matmul per batch
        return Batch(aux, tok, logits.argmax(-1), logits[..., draft_vocab].argmax(-1), valid)

    for sample in samples:
        n = sample.input_ids.shape[0] - 1
        if pending and rows + n > max_rows:
            yield flush()
            pending, rows = [], 0
        pending.append(sample)
        rows += n
    if pending:
        yield flush()


@torch.inference_mode()
def score_batch(loaded: LoadedDraft, batch: Batch, *, steps: int, counts: list[Counts]) -> None:
    """Run the teacher-forced steps on one batch and add hits to ``counts`` (one per step)."""
    model = loaded.model
    device = next(model.parameters()).device
    t = batch.aux.shape[1]
    outs = model.ttt_forward(batch.aux.to(device), batch.tokens.to(device), steps=steps)
    for k, h in enumerate(outs):
        pred = model.logits(h).argmax(-1).cpu()  # draft ids [B, T]
        valid = batch.valid[:, k : k + t]
        full_hit = (
            model.to_target_ids(pred.to(device)).cpu() == batch.full_labels[:, k : k + t]
        ) & valid
        draft_hit = (pred == batch.draft_labels[:, k : k + t]) & valid
        counts[k].tokens += int(valid.sum())
        counts[k].full_hits += int(full_hit.sum())
        counts[k].draft_hits += int(draft_hit.sum())
        counts[k].by_sample += zip(
            valid.sum(1).tolist(), draft_hit.sum(1).tolist(), full_hit.sum(1).tolist(), strict=True
        )


def bootstrap_sd(
    tokens: list[int], hits: list[int], *, draws: int = BOOTSTRAP_DRAWS, seed: int = 0
) -> float:
    """The standard error of ``sum(hits) / sum(tokens)`` over samples, by the bootstrap (samples
    resampled whole).

    Args:
        tokens: scored tokens of each sample.
        hits: hits of each sample (same length).
        draws: bootstrap resamples.
        seed: the resampling's seed (an accuracy's error is reproducible).

    Returns:
        The resampled ratios' standard deviation; NaN with fewer than two samples that scored a
        token.
    """
    n, h = np.asarray(tokens, dtype=float), np.asarray(hits, dtype=float)
    keep = n > 0
    n, h = n[keep], h[keep]
    if len(n) < 2:
        return float("nan")
    pick = np.random.default_rng(seed).integers(0, len(n), size=(draws, len(n)))
    return float(np.std(h[pick].sum(1) / n[pick].sum(1)))


def summarize(
    rule: Rule, *, selection: list, samples: int, counts: list[Counts], skipped: list[str]
) -> StandaloneResult:
    """Turn per-step counts into a :class:`StandaloneResult`.

    Args:
        rule: the wiring rule measured.
        selection: the target layers it selects.
        samples: number of samples measured.
        counts: per draft step, its hit counts.
        skipped: dump files skipped.

    Returns:
        The result: the first step's accuracy and its bootstrap sds, per-position rates, and the
        sum of running products of full-vocabulary rates as the simulated accept length.
    """
    per_position = [
        {"draft_vocab": c.rate(c.draft_hits), "full_vocab": c.rate(c.full_hits), "tokens": c.tokens}
        for c in counts
    ]
    sim, running = 0.0, 1.0
    for p in per_position:
        running *= p["full_vocab"]
        sim += running
    first = counts[0].by_sample
    sample_tokens = [t for t, _, _ in first]
    sd = {
        "draft_vocab": bootstrap_sd(sample_tokens, [d for _, d, _ in first]),
        "full_vocab": bootstrap_sd(sample_tokens, [f for _, _, f in first]),
    }
    return StandaloneResult(
        rule=rule.text,
        selection=selection,
        samples=samples,
        tokens=counts[0].tokens,
        steps=len(counts),
        accuracy={
            "draft_vocab": per_position[0]["draft_vocab"],
            "full_vocab": per_position[0]["full_vocab"],
        },
        per_position=per_position,
        simulated_accept_length=sim,
        accuracy_sd=sd,
        skipped_files=skipped,
    )


def _first(reader: DumpReader, stream: Iterator[Sample]) -> Sample:
    first = next(stream, None)
    if first is None:
        bad = reader.skipped
        skipped = f" ({len(bad)} bad files skipped, the first: {bad[0]})" if bad else ""
        raise DumpError(f"{reader.path}: no usable samples{skipped}")
    return first


def evaluate(
    loaded: LoadedDraft,
    reader: DumpReader,
    *,
    head: TargetHead,
    rule: Rule,
    samples: int | None = None,
    steps: int = 1,
    max_rows: int = 4096,
) -> StandaloneResult:
    """Standalone accuracy of ``loaded`` on ``reader``'s samples wired by ``rule``.

    Every sample's token ids are checked against the target vocabulary and its width against the
    target's hidden size before it is scored; no accuracy is reported when no token is scored (all
    masked).

    Args:
        loaded: the draft (:func:`~bisect_eagle.artifacts.draft.load_draft`).
        reader: the dump's samples (a ``DumpReader``, or anything with its ``head``, ``path`` and
            ``skipped``).
        head: the target's embedding, final norm and LM head (the labels are its argmax).
        rule: the wiring rule that builds ``fc``'s input from each sample's states.
        samples: score the first this many good samples (≥ 1); None: all.
        steps: teacher-forced draft steps (≥ 1).
        max_rows: token rows per batch (bounds memory).

    Returns:
        The accuracy per position (full and draft vocabulary), their bootstrap errors, the simulated
        accept length, and the counts and files skipped.

    Raises:
        BadInput: ``steps`` or ``samples`` below 1.
        DumpError: no usable sample, a sample of another width than the target or with a token
            outside its vocabulary, or no token scored.
        WiringError: a rule that does not fit the dump or the draft's ``fc``.
    """
    if steps < 1:
        raise BadInput(f"steps must be >= 1, got {steps}")
    if samples is not None and samples < 1:
        raise BadInput(f"samples must be >= 1 (or unset for all), got {samples}")
    stream = iter(reader.head(samples) if samples else reader)
    first = _first(reader, stream)
    hidden = first.width
    if hidden != head.hidden_size:
        raise DumpError(
            f"{first.source}: tensor {first.state_name(0)!r} is {hidden} wide; the target's "
            f"hidden_size is {head.hidden_size}"
        )
    selection = check_width(
        rule, len(first.states), hidden=hidden, fc_in=loaded.model.fc_in_features
    )
    draft_vocab = loaded.model.to_target_ids(torch.arange(loaded.config.draft_vocab_size)).cpu()
    counts = [Counts() for _ in range(steps)]
    seen = 0

    def counted() -> Iterator[Sample]:
        nonlocal seen
        for s in itertools.chain([first], stream):
            check_token_ids(s, head.vocab_size)
            seen += 1
            yield s

    for batch in batches(
        counted(), rule, head=head, draft_vocab=draft_vocab, steps=steps, max_rows=max_rows
    ):
        score_batch(loaded, batch, steps=steps, counts=counts)
    if counts[0].tokens == 0:
        raise DumpError(
            f"{reader.path}: no token is scored in the {seen} samples read (tensor 'loss_mask' is "
            "0 everywhere)"
        )
    return summarize(
        rule, selection=selection, samples=seen, counts=counts, skipped=list(reader.skipped)
    )
