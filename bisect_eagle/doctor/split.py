"""Doctor's finding on a logged measurement's throughput split (:mod:`bisect_eagle.perf.split`):
which side of the throughput, acceptance or cost, explains a live trial's gap, and where to look."""

from __future__ import annotations

from bisect_eagle.doctor.core import Finding, Severity
from bisect_eagle.perf.split import Split

CODE = "throughput-split"
ACCEPTANCE_FIX = (
    "look at what feeds the draft: the wiring and capture findings above, `bisect-eagle "
    "fingerprint` (which layer each captured state is), the draft, the context length"
)
COST_FIX = (
    "look at what a verify cycle costs: NCCL, the scheduler, overlap, the attention backend, graph "
    "sizes (`bisect-eagle live --pin-acceptance L` measures a config's cost alone)"
)
FIX = {
    "acceptance": ACCEPTANCE_FIX,
    "cost": COST_FIX,
    "both": f"on both sides: {ACCEPTANCE_FIX}; and {COST_FIX}",
    "none": "nothing: the measurement meets what it needs",
    "unknown": (
        "measure it again with more prompts or launches (`bisect-eagle reproduce RUN_ID`), "
        "or score its wiring in stage 1 for a prediction"
    ),
}


def split_finding(split: Split | None, *, where: str) -> Finding:
    """The ``throughput-split`` finding: a warning when a side explains a gap, a note otherwise.

    Args:
        split: the measurement's split; None when there is none (no live trial to split).
        where: the measurement (its study, trial and run).

    Returns:
        The finding: the split's sentence, and where to look on its side.
    """
    if split is None:
        return Finding(
            CODE,
            "info",
            where,
            "no live trial finished ok with an accept length and tok/s, or the study has no tok/s "
            "to need: nothing to split",
            "run the study (`bisect-eagle run SPEC`), then ask again",
        )
    severity: Severity = "warning" if split.side in ("acceptance", "cost", "both") else "info"
    fix = FIX[split.side]
    if split.side == "none" and split.short:
        fix = f"nothing for what it needs; for more, the accept length: {ACCEPTANCE_FIX}"
    return Finding(CODE, severity, where, split.sentence(), fix)
