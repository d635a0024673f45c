"""`reproduce`'s verdict: a ratio to a fresh baseline against the logged one, in the one ratio
notation."""

from __future__ import annotations

from bisect_eagle.cli.reproduce import verdict


def test_the_verdict_reads_ratios_as_times_the_baseline():
    same = verdict(metric="accept_length", old_ratio=4.6, new_ratio=4.6, tolerance=0.1)
    assert same["reproduced"] and same["diff"] == 0
    assert same["text"] == (
        "reproduced within 0.0 % (accept_length 4.60× baseline now, 4.60× baseline when logged)"
    )
    off = verdict(metric="output_tok_s", old_ratio=1.0, new_ratio=1.52, tolerance=0.1)
    assert not off["reproduced"]
    assert off["text"] == (
        "not reproduced: off by +52.0 %, more than 10 % (output_tok_s 1.52× baseline now, 1.00× "
        "baseline when logged)"
    )
    missing = verdict(metric="output_tok_s", old_ratio=None, new_ratio=1.2, tolerance=0.1)
    assert not missing["reproduced"] and missing["diff"] is None


def test_every_metric_gets_a_verdict_and_a_tok_s_change_beyond_tolerance_is_said():
    from bisect_eagle.cli.reproduce import changed_beyond, compare

    rows = compare(
        {"accept_length": 4.6, "output_tok_s": 100.0, "failed_requests": 0.0},
        {"accept_length": 4.6, "output_tok_s": 152.0, "failed_requests": 0.0},
        tolerance=0.1,
    )
    assert {r["metric"]: r["within"] for r in rows} == {
        "accept_length": True,
        "output_tok_s": False,
        "failed_requests": None,
    }
    assert changed_beyond(rows, tolerance=0.1) == "changed by more than 10 %: output_tok_s +52.0%"
    assert changed_beyond(rows[:1], tolerance=0.1) is None
