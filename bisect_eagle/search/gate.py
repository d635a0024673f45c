"""Stage 1's gate: from every candidate's standalone verdict
(:mod:`bisect_eagle.trials.standalone`), which wirings go live, recorded on the study's parent run.

A standalone accuracy is a proxy of live acceptance, and a noisy one: it is measured on a finite
dump (its bootstrap standard error over the dump's samples, ``Verdict.accuracy_sd``), and teacher
forcing reads each wiring a little differently from a live server (:data:`PROXY_REL_SD`, relative).
So a wiring goes live when its accuracy is within noise of the reference (the best candidate, or the
draft's training accuracy)::

    accuracy ≥ reference − max(margin, GATE_Z · √(sd_ref² + sd² + (PROXY_REL_SD · reference)²))

``margin`` (``standalone.margin``) is a floor. The wirings that go live are ranked by accuracy (a
note ``gate rank N``, 1 the best) and the throughput model starts from their per-position accuracy;
a wiring below its threshold is never dropped silently: its run says ``gate: reject`` with its
accuracy, its threshold and the distance between them.
"""

from __future__ import annotations

import json
import math

from bisect_eagle.errors import BadInput
from bisect_eagle.tracking.runs import Tracking
from bisect_eagle.trials.standalone import Verdict

GATE_Z = 2.33  # one-sided 1 %: a wiring as good as the best is dropped at most this often by noise
# a teacher-forced accuracy's own error per wiring, relative: the incident's right wiring scored 77
# % standalone against 75 % in training (docs/incident.md), about 3 %; taken a little wider
PROXY_REL_SD = 0.04


def _sd(value: float | None) -> float:
    return value if value is not None and math.isfinite(value) else 0.0


def apply_gate(verdicts: list[Verdict], *, margin: float, reference: float | None) -> float:
    """Mark the verdicts within noise of the reference as passed, rank them, and set each one's
    threshold.

    Args:
        verdicts: every scored wiring; ``passed``, ``threshold`` and the ``rank`` note are set in
            place.
        margin: the least distance below the reference that still passes (``standalone.margin``).
        reference: the draft's training accuracy; None: the best verdict's accuracy (with its own
            error).

    Returns:
        The reference accuracy.

    Raises:
        BadInput: no verdicts.
    """
    if not verdicts:
        raise BadInput("the standalone gate needs at least one wiring")
    best = max(verdicts, key=lambda v: v.accuracy)
    ref, ref_sd = (best.accuracy, _sd(best.accuracy_sd)) if reference is None else (reference, 0.0)
    for v in verdicts:
        noise = GATE_Z * math.sqrt(ref_sd**2 + _sd(v.accuracy_sd) ** 2 + (PROXY_REL_SD * ref) ** 2)
        v.threshold = ref - max(margin, noise)
        v.passed = v.accuracy >= v.threshold
    for rank, v in enumerate(
        sorted((v for v in verdicts if v.passed), key=lambda v: -v.accuracy), start=1
    ):
        v.notes = [n for n in v.notes if not n.startswith("gate rank")] + [f"gate rank {rank}"]
    return ref


def record_gate(
    tracking: Tracking, verdicts: list[Verdict], *, reference: float, margin: float
) -> None:
    """Write the gate's decision onto each verdict's run: ``standalone.json`` and the ``verdict``
    tag rewritten with ``passed`` and ``threshold``, the tag ``gate`` (pass | reject), the metrics
    ``gate_reference``, ``gate_threshold`` and ``gate_distance`` (accuracy − threshold: how far
    inside or outside it is).

    Args:
        tracking: the study's store.
        verdicts: the verdicts :func:`apply_gate` decided; one without a run is skipped.
        reference: the reference accuracy :func:`apply_gate` returned.
        margin: the gate's margin (``standalone.margin``); a verdict without a threshold is judged
            against ``reference - margin``.
    """
    for v in verdicts:
        if v.run_id is None:
            continue
        threshold = v.threshold if v.threshold is not None else reference - margin
        body = {
            **v.to_json(),
            "gate": {"reference": reference, "margin": margin, "threshold": threshold},
        }
        tracking.log_texts(v.run_id, {"standalone.json": json.dumps(body, indent=2)})
        tracking.log(
            v.run_id,
            metrics={
                "gate_reference": reference,
                "gate_threshold": threshold,
                "gate_distance": v.accuracy - threshold,
            },
            tags={"gate": "pass" if v.passed else "reject", "verdict": json.dumps(v.to_json())},
        )
