"""Which side of the throughput a live measurement falls short on: acceptance or cost.

A speculative deployment's output tok/s is its accept length times its verify cycles per second
(``cycles/s = tok/s ÷ accept length``, all requests together). Given a live trial's measured
accept length and tok/s, the accept length predicted for the same wiring and steps (stage 1's
per-position accuracy on the dump, :func:`stage1_accept_length`, or the throughput model's
prediction) and the tok/s the deployment needs, :func:`explain` says which side explains the gap,
in the words ``bisect`` gives a breaking set (``bisect/sides.py``):

- ``acceptance``: the accept length is materially below the prediction (under its ``floor``),
  while the measured cycles/s would reach the need at the predicted accept length;
- ``cost``: the accept length is not materially below the prediction, and the cycles/s are below
  what the need takes at the predicted accept length (``needed tok/s ÷ predicted accept length``);
- ``both``: both hold;
- ``none``: no gap: the measured tok/s meets the need;
- ``unknown``: a gap that neither side explains beyond the noise (the accept length is short of
  the need but above the floor of its prediction, and the cycles would reach the need at the
  prediction), or nothing predicted the accept length.

"Materially below" accounts for noise. Stage 1 is teacher-forced on the dump's samples while a
live trial drafts its own tokens on other prompts: its prediction's floor is ``predicted × (1 −
ACCEPT_MARGIN)`` (:func:`stage1_floor`), 10 %, two and a half times the 4 % error per wiring the
gate allows that proxy. The model's prediction carries its own interval, whose low end is the
floor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from bisect_eagle.perf import acceptance as acc

Side = Literal["acceptance", "cost", "both", "none", "unknown"]
ACCEPT_MARGIN = 0.10
VERDICT = {
    "acceptance": "the acceptance side",
    "cost": "the cost side",
    "both": "both sides (acceptance and cost)",
}


@dataclass(frozen=True)
class Split:
    """A live measurement against its predicted accept length and the tok/s it needs
    (:func:`explain`).

    ``source`` says what predicted the accept length (``the dump (stage 1)``, ``the model``; empty
    when nothing did), ``need`` what the needed tok/s is (``the target``, ``the baseline``).
    """

    side: Side
    accept_length: float
    tok_s: float
    needed_tok_s: float
    need: str
    predicted: float | None = None
    floor: float | None = None
    source: str = ""

    @property
    def cycles_s(self) -> float:
        """Measured verify cycles per second (all requests together)."""
        return self.tok_s / self.accept_length

    @property
    def needed_cycles_s(self) -> float | None:
        """The verify cycles per second the need takes at the predicted accept length."""
        return None if self.predicted is None else self.needed_tok_s / self.predicted

    @property
    def short(self) -> bool:
        """Whether the accept length is materially below its prediction (under the floor)."""
        return self.floor is not None and self.accept_length < self.floor

    def sentence(self) -> str:
        """The numbers and the side, for a person: ``accept length 2.1 where the dump (stage 1)
        predicts 3.6 (floor 3.24); 42.9 verify cycles/s, 25 needed for the target's 90 tok/s at 3.6:
        the acceptance side``.

        Returns:
            One line: the measured and predicted accept length, the verify cycles per second
            measured and needed, and the side (or why the side is unknown).
        """
        a, p = _num(self.accept_length), _num(self.predicted)
        if self.predicted is None:
            head = f"accept length {a} (nothing predicts it for this wiring and steps)"
            cycles = f"{_num(self.cycles_s)} verify cycles/s"
        else:
            head = f"accept length {a} where {self.source} predicts {p} (floor {_num(self.floor)})"
            cycles = (
                f"{_num(self.cycles_s)} verify cycles/s, {_num(self.needed_cycles_s)} needed for "
                f"{self.need}'s {_num(self.needed_tok_s)} tok/s at {p}"
            )
        measured = f"{_num(self.tok_s)} tok/s"
        if self.side in VERDICT:
            end = VERDICT[self.side]
        elif self.side == "none":
            end = f"no gap ({measured} meets {self.need}'s {_num(self.needed_tok_s)})"
            if self.short:
                end += ", though the accept length is materially below its prediction"
        elif self.predicted is None:
            end = f"side unknown ({measured} against {self.need}'s {_num(self.needed_tok_s)})"
        else:
            end = "side unknown: the gap is within the noise of the predicted accept length"
        return f"{head}; {cycles}: {end}"


def stage1_accept_length(
    per_position: Sequence[float],
    *,
    num_steps: int,
    topk: int = 1,
    num_draft_tokens: int | None = None,
) -> float:
    """The accept length (bonus token included, SGLang's) that stage 1's per-position accuracy
    predicts for a speculative setting: SpecForge's simulated accept length plus 1 at stage 1's own
    depth; deeper positions reuse the last accuracy, trees follow
    :func:`~bisect_eagle.perf.acceptance.survival`.

    Args:
        per_position: stage 1's teacher-forced accuracy per draft position (conditional acceptance).
        num_steps: the setting's draft steps (at least 1).
        topk: its tree width.
        num_draft_tokens: its verified tokens, the root included (default: ``num_steps + 1``).

    Returns:
        The predicted accept length.
    """
    ndt = num_steps + 1 if num_draft_tokens is None else num_draft_tokens
    surv = acc.survival(list(per_position), num_steps=num_steps, topk=topk, num_draft_tokens=ndt)
    return float(acc.accept_length(surv))


def stage1_floor(predicted: float, *, margin: float = ACCEPT_MARGIN) -> float:
    """Below this a live accept length is materially below stage 1's prediction (module docstring).

    Args:
        predicted: stage 1's predicted accept length (:func:`stage1_accept_length`).
        margin: the relative margin of stage 1's noise.

    Returns:
        ``predicted × (1 − margin)``, never below 1 (the bonus token alone).
    """
    return max(1.0, predicted * (1.0 - margin))


def explain(
    *,
    accept_length: float,
    tok_s: float,
    needed_tok_s: float,
    need: str,
    predicted: float | None = None,
    floor: float | None = None,
    source: str = "",
) -> Split:
    """Which side explains a live measurement's gap to ``needed_tok_s`` (module docstring).

    Args:
        accept_length: the measured accept length (bonus token included), above 0.
        tok_s: the measured output tok/s, above 0.
        needed_tok_s: the tok/s the deployment needs (a study's target, or the baseline's tok/s).
        need: what ``needed_tok_s`` is, for the sentence (``the target``).
        predicted: the accept length predicted for the same wiring and steps; None when nothing
            predicts it.
        floor: below this the accept length is materially short (default: :func:`stage1_floor` of
            ``predicted``).
        source: what predicted it (``the dump (stage 1)``, ``the model``).

    Returns:
        The split: its side and the numbers it was decided on.

    Raises:
        ValueError: an accept length or tok/s that is not a positive number.
    """
    if not all(v > 0 and math.isfinite(v) for v in (accept_length, tok_s)):
        raise ValueError(f"accept length and tok/s must be positive: {accept_length}, {tok_s}")
    if predicted is not None and floor is None:
        floor = stage1_floor(predicted)
    split = Split("unknown", accept_length, tok_s, needed_tok_s, need, predicted, floor, source)
    side: Side = "unknown"
    if tok_s >= needed_tok_s:
        side = "none"
    elif predicted is not None:
        slow = split.cycles_s * predicted < needed_tok_s
        short = split.short
        side = (
            "both" if short and slow else "acceptance" if short else "cost" if slow else "unknown"
        )
    return Split(side, accept_length, tok_s, needed_tok_s, need, predicted, floor, source)


def _num(value: float | None) -> str:
    """3 significant digits, one decimal from 100 up (as the tool's tables write a metric)."""
    if value is None:
        return "-"
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.3g}"
