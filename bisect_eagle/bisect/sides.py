"""Which side of the throughput each breaking set acts on: acceptance or cost.

A speculative deployment's tok/s is its accept length times its verify cycles per second. A breaking
set ``S`` is verified BAD applied to the good configuration; it is probed once more with acceptance
*pinned* to the good configuration's measured profile (``pinned_acceptance``: the unconditional
per-position rates of its launches, or, where ``S`` changes the number of draft steps, the good
configuration's accept length as a profile of the new length). The pinned probe keeps every forward
of ``S`` and only decides which drafts count as accepted, so it measures ``S``'s cost at the good
configuration's acceptance:

- ``acceptance``: the pinned probe judges GOOD: with the good acceptance, ``S`` no longer breaks it;
- ``cost``: it judges BAD, and ``S``'s own accept length is not below ``ratio`` × the good
  configuration's;
- ``both``: it judges BAD, and ``S``'s accept length alone is below ``ratio`` × the good one's;
- ``unknown``: the pinned probe could not be judged (an engine that cannot pin, the launch budget
  spent, a verdict within the noise), or ``S`` has no draft steps to pin.

Pinning acceptance keeps every forward, so it changes tok/s by the accept lengths' ratio alone.
Before a set is launched pinned, its own launches scaled by ``good / its accept length`` (when that
is above 1) are judged as the pinned probe would be (a look of the bisect,
:meth:`~bisect_eagle.bisect.judge.Judge.predict`): when even they judge BAD, pinning cannot recover
it, and the side (``cost``, or ``both``) is given without a launch; the detail says so. Only a set
the good acceptance might recover is launched pinned.

A bisect judged by ``accept_length`` needs no pinned probe: a set that breaks the accept length acts
on acceptance. The pinned probe is judged as any probe is (the same limit, level and sample
schedule) and counts against the bisect's launch budget; it is outside the search, so it never
changes a breaking set.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any, Literal

from bisect_eagle.bisect.ddmin import ProbeOutcome
from bisect_eagle.bisect.measurement import Measurement
from bisect_eagle.bisect.prober import Prober
from bisect_eagle.spec.settings import profile_for_accept_length, unconditional_rates

Side = Literal["acceptance", "cost", "both", "unknown"]


def good_profile(good: Measurement, num_steps: int) -> tuple[list[float] | None, str]:
    """The good configuration's acceptance as a ``pinned_acceptance`` profile of ``num_steps``
    rates, and how it was made; None (and why) when the good configuration's acceptance was not
    measured.

    Args:
        good: the good configuration's measurement.
        num_steps: the draft steps of the configuration to pin.
    """
    curves = [unconditional_rates(c) for c in good.curves if len(c) == num_steps]
    if curves:
        rates = [statistics.fmean(position) for position in zip(*curves, strict=True)]
        # non-increasing, as a profile must be
        rates = [min(rates[: i + 1]) for i in range(len(rates))]
        return (
            rates,
            f"its per-position acceptance over {len(curves)} "
            f"launch{'' if len(curves) == 1 else 'es'}",
        )
    length = good.accept_length
    if length is None:
        return None, "the good configuration's accept length was not measured"
    clamped = max(1.0, min(1.0 + num_steps, length))
    return profile_for_accept_length(
        clamped, num_steps
    ), f"its accept length {length:.3g} over {num_steps} steps"


def classify(
    pinned: ProbeOutcome, *, natural: float | None, good: float | None, ratio: float
) -> Side:
    """The side (module docstring) from the pinned probe's verdict and the natural and good accept
    lengths.

    Args:
        pinned: the pinned probe's verdict.
        natural: the set's own accept length, or None when unknown.
        good: the good configuration's accept length, or None (or 0) when unknown.
        ratio: the criterion ratio a set's accept length is compared with.

    Returns:
        ``acceptance`` (pinned GOOD), ``unknown`` (pinned neither GOOD nor BAD), ``both`` (pinned
        BAD and ``natural / good < ratio``) or ``cost`` (pinned BAD otherwise).
    """
    if pinned is ProbeOutcome.GOOD:
        return "acceptance"
    if pinned is not ProbeOutcome.BAD:
        return "unknown"
    if natural is not None and good and math.isfinite(natural) and natural / good < ratio:
        return "both"
    return "cost"


def find_sides(prober: Prober, breaking: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
    """For each breaking set, in order: its ``side``, why (``side_detail``), and the pinned probe's
    measurement (``pinned``, None when none was launched). The sets pinning cannot recover are
    settled first (no launch), then the others are launched pinned while the budget lasts.

    Args:
        prober: the bisect's prober, after its search (the good configuration and each set
            measured).
        breaking: the breaking sets.
    """
    if prober.judge.metric == "accept_length":
        return [
            {
                "side": "acceptance",
                "side_detail": "it breaks the accept length itself (the bisect's metric)",
                "pinned": None,
            }
            for _ in breaking
        ]
    good = prober.measurement(frozenset())
    out: list[dict[str, Any]] = []
    launch: list[tuple[int, frozenset[str], int, Measurement]] = []
    for i, cause in enumerate(breaking):
        config = frozenset(cause)
        steps = int(prober.plan(config).effective.get("num_steps") or 0)
        natural = prober.measurement(config)
        out.append({"side": "unknown", "side_detail": "", "pinned": None})
        if good is None or natural is None or steps < 1:
            out[i]["side_detail"] = (
                "no draft steps to pin"
                if steps < 1
                else "the good configuration or the set was not measured"
            )
        elif not _settled(prober, good, natural, out[i]):
            launch.append((i, config, steps, natural))
    for i, config, steps, natural in launch:
        assert good is not None
        rates, made = good_profile(good, steps)
        if rates is None:
            out[i]["side_detail"] = made
        elif prober.spent():
            out[i]["side_detail"] = "the launch budget is spent: not probed with acceptance pinned"
        else:
            out[i] = _pinned(
                prober, config, rates, made, good=good.accept_length, natural=natural.accept_length
            )
    return out


def _settled(
    prober: Prober, good: Measurement, natural: Measurement, entry: dict[str, Any]
) -> bool:
    """Whether the set's own launches at the good acceptance still judge BAD (module docstring); if
    so its side and why go into ``entry``."""
    g, n = good.accept_length, natural.accept_length
    if g is None or n is None or not natural.samples:
        return False
    scale = max(1.0, g / n)
    predicted = prober.judge.predict([v * scale for v in natural.samples])
    if predicted.outcome is not ProbeOutcome.BAD:
        return False
    entry["side"] = classify(ProbeOutcome.BAD, natural=n, good=g, ratio=prober.judge.ratio)
    entry["side_detail"] = (
        f"not launched pinned: its accept length is {n:.3g} against the good configuration's "
        f"{g:.3g}, and its launches at the good acceptance (× {scale:.3g}) still judge BAD "
        f"({predicted.detail})"
    )
    return True


def _pinned(
    prober: Prober,
    config: frozenset[str],
    rates: list[float],
    made: str,
    *,
    good: float | None,
    natural: float | None,
) -> dict[str, Any]:
    """The set launched with acceptance pinned to ``rates``: its side and the measurement."""
    outcome, m, what = prober.probe_pinned(config, rates)
    lengths = (
        ""
        if good is None or natural is None
        else f"; accept length {natural:.3g} with the set against the good configuration's "
        f"{good:.3g}"
    )
    return {
        "side": classify(outcome, natural=natural, good=good, ratio=prober.judge.ratio),
        "side_detail": (
            f"with acceptance pinned to the good configuration's ({made}): {outcome.name} "
            f"({what}){lengths}"
        ),
        "pinned": {
            "outcome": outcome.name,
            "rates": [round(r, 6) for r in rates],
            "value": None if m is None else m.value,
            "accept_length": None if m is None else m.accept_length,
            "natural_accept_length": natural,
            "good_accept_length": good,
            "run_id": None if m is None else m.log_run_id,
        },
    }
