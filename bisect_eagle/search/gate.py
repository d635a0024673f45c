"""Stage 1's gate: from every candidate's standalone verdict (:mod:`bisect_eagle.trials.standalone`), which
wirings go live — within ``margin`` of the reference (the best candidate, or the draft's training accuracy) —
recorded on the study's parent run."""

from __future__ import annotations

import json

from bisect_eagle.errors import BadInput
from bisect_eagle.tracking.runs import Tracking
from bisect_eagle.trials.standalone import Verdict


def apply_gate(verdicts: list[Verdict], *, margin: float, reference: float | None) -> float:
    """Mark verdicts within ``margin`` of the reference (default: the best accuracy) as passed; returns it."""
    if not verdicts:
        raise BadInput("the standalone gate needs at least one wiring")
    ref = max(v.accuracy for v in verdicts) if reference is None else reference
    for v in verdicts:
        v.passed = v.accuracy >= ref - margin
    return ref


def record_gate(tracking: Tracking, verdicts: list[Verdict], *, reference: float, margin: float) -> None:
    """Write the gate's decision onto each verdict's run: ``standalone.json`` and the ``verdict`` tag rewritten
    with ``passed``, the tag ``gate`` (pass | reject), the metrics ``gate_reference`` and ``gate_threshold``."""
    for v in verdicts:
        if v.run_id is None:
            continue
        body = {**v.to_json(), "gate": {"reference": reference, "margin": margin, "threshold": reference - margin}}
        tracking.log_texts(v.run_id, {"standalone.json": json.dumps(body, indent=2)})
        tracking.log(
            v.run_id,
            metrics={"gate_reference": reference, "gate_threshold": reference - margin},
            tags={"gate": "pass" if v.passed else "reject", "verdict": json.dumps(v.to_json())},
        )
