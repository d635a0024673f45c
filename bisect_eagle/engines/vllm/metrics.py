"""vLLM's own Prometheus counters (``GET /metrics``) and the trial metrics computed from their
deltas.

vLLM 0.32 counts, per engine and model (``vllm/v1/metrics/loggers.py``,
``vllm/v1/spec_decode/metrics.py``):

- ``vllm:spec_decode_num_drafts_total``: draft steps (one per request per step that proposed
  drafts);
- ``vllm:spec_decode_num_draft_tokens_total``: tokens proposed;
- ``vllm:spec_decode_num_accepted_tokens_total``: tokens accepted;
- ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position="k"}``: steps whose draft ``k``
  (0-based) was accepted; drafts are accepted as a prefix, so ``per_pos[k]`` counts steps with at
  least ``k + 1`` accepted;
- ``vllm:request_success_total{finished_reason=…}``: finished requests, recorded in the same
  ``record()`` call as the step statistics of their last step (``vllm/v1/engine/async_llm.py``
  ``output_handler``), which is how a reader knows the counters include every request answered so
  far.

Over the measured requests (deltas of two scrapes, warm-up excluded): accept length = ``1 +
Δaccepted / Δdrafts`` (tokens per verify step, the bonus token included); the conditional
per-position rate ``P(draft k accepted | draft k-1 accepted) = Δper_pos[k] / Δper_pos[k-1]``
(``Δper_pos[-1] = Δdrafts``); and the tokens-per-step histogram ``{j + 1: Δper_pos[j-1] -
Δper_pos[j]}``, exact for chain drafts (topk 1).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
FINISHED = "vllm:request_success_total"
GENERATED = "vllm:generation_tokens_total"

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


class MetricsError(ValueError):
    """A ``/metrics`` text that cannot be read."""


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition → ``{name: [(labels, value), ...]}`` (comments skipped).

    Raises :class:`MetricsError` on a sample line that does not parse.
    """
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise MetricsError(f"/metrics line {n}: not a Prometheus sample: {line[:120]!r}")
        name, _, labels, value = m.groups()
        try:
            number = float(value)
        except ValueError:
            raise MetricsError(f"/metrics line {n}: value {value!r} is not a number") from None
        out.setdefault(name, []).append(({k: v for k, v in _LABEL.findall(labels or "")}, number))
    return out


@dataclass(frozen=True)
class SpecCounters:
    """vLLM's cumulative counters at one scrape (summed over engines and models); ``present``: any
    spec counter."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: tuple[float, ...] = ()
    finished: float = 0.0
    generated: float = 0.0
    present: bool = False

    def minus(self, before: SpecCounters) -> SpecCounters:
        """The counters accumulated since ``before`` (a scrape of the same server)."""
        k = max(len(self.per_pos), len(before.per_pos))
        pos = tuple(
            (self.per_pos[i] if i < len(self.per_pos) else 0.0)
            - (before.per_pos[i] if i < len(before.per_pos) else 0.0)
            for i in range(k)
        )
        return SpecCounters(
            self.drafts - before.drafts,
            self.draft_tokens - before.draft_tokens,
            self.accepted - before.accepted,
            pos,
            self.finished - before.finished,
            self.generated - before.generated,
            self.present or before.present,
        )


def spec_counters(text: str) -> SpecCounters:
    """The counters a trial reads, from one ``/metrics`` text."""
    samples = parse_prometheus(text)

    def total(name: str) -> float:
        """The sum of every sample of metric ``name`` (0 when absent).

        Args:
            name: the metric's name.

        Returns:
            The sum.
        """
        return sum(v for _, v in samples.get(name, []))

    by_pos: dict[int, float] = {}
    for labels, value in samples.get(PER_POS, []):
        try:
            k = int(labels.get("position", ""))
        except ValueError:
            continue
        by_pos[k] = by_pos.get(k, 0.0) + value
    pos = tuple(by_pos.get(k, 0.0) for k in range(max(by_pos) + 1)) if by_pos else ()
    present = any(name in samples for name in (DRAFTS, ACCEPTED, PER_POS))
    return SpecCounters(
        total(DRAFTS),
        total(DRAFT_TOKENS),
        total(ACCEPTED),
        pos,
        total(FINISHED),
        total(GENERATED),
        present,
    )


@dataclass(frozen=True)
class SpecStats:
    """Speculative-decoding metrics over a window (deltas of :class:`SpecCounters`)."""

    drafts: int
    accepted: int
    draft_tokens: int
    accept_length: float  # 1 + accepted / drafts (nan without drafts)
    rates: list[float] = field(default_factory=list)  # P(draft k accepted | draft k-1 accepted)
    hist: dict[int, int] = field(default_factory=dict)  # tokens per verify step -> steps


def spec_stats(delta: SpecCounters, *, num_speculative_tokens: int) -> SpecStats:
    """Accept length, conditional per-position rates and the per-step histogram of a counter delta.

    ``num_speculative_tokens`` fixes how many positions are reported (vLLM reports one per proposed
    position).
    """
    drafts, accepted = int(round(delta.drafts)), int(round(delta.accepted))
    k = max(num_speculative_tokens, len(delta.per_pos))
    pos = [int(round(delta.per_pos[i])) if i < len(delta.per_pos) else 0 for i in range(k)]
    accept = 1.0 + accepted / drafts if drafts > 0 else math.nan
    rates, prev = [], drafts
    for reached in pos:
        rates.append(reached / prev if prev > 0 else math.nan)
        prev = reached
    hist: dict[int, int] = {}
    if drafts > 0:
        chain = [drafts, *pos, 0]
        # j drafts accepted in a step: chain[j] - chain[j + 1] steps, j + 1 tokens each
        for j in range(k + 1):
            steps = chain[j] - chain[j + 1]
            if steps:
                hist[j + 1] = steps
    return SpecStats(drafts, accepted, int(round(delta.draft_tokens)), accept, rates, hist)
