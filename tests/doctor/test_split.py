"""Doctor's throughput-split finding: its severity, message and where it says to look."""

from __future__ import annotations

from bisect_eagle.doctor.split import ACCEPTANCE_FIX, COST_FIX, split_finding
from bisect_eagle.perf.split import explain


def finding(accept_length: float, cycles_s: float):
    s = explain(
        accept_length=accept_length,
        tok_s=accept_length * cycles_s,
        needed_tok_s=90.0,
        need="the target",
        predicted=3.6,
        source="the dump (stage 1)",
    )
    return split_finding(s, where="study s, live 003 (run 7ca37e03)")


def test_a_side_that_explains_a_gap_is_a_warning_with_that_sides_places_to_look():
    f = finding(2.1, 40.0)
    assert (f.code, f.severity, f.where) == (
        "throughput-split",
        "warning",
        "study s, live 003 (run 7ca37e03)",
    )
    assert f.message.startswith("accept length 2.1 where the dump (stage 1) predicts 3.6")
    assert f.message.endswith(": the acceptance side") and f.fix == ACCEPTANCE_FIX
    cost = finding(3.5, 20.0)
    assert cost.severity == "warning" and cost.fix == COST_FIX and "NCCL" in cost.fix
    both = finding(2.1, 20.0)
    assert both.severity == "warning" and ACCEPTANCE_FIX in both.fix and COST_FIX in both.fix


def test_no_gap_or_no_side_is_a_note():
    met = finding(3.5, 30.0)
    assert met.severity == "info" and met.fix.startswith("nothing")
    headroom = finding(2.1, 50.0)  # meets the need with an accept length below its floor
    assert headroom.severity == "info" and headroom.fix.endswith(ACCEPTANCE_FIX)
    assert finding(3.3, 26.0).severity == "info"  # within the noise
    none = split_finding(None, where="study s")
    assert none.severity == "info" and "nothing to split" in none.message
