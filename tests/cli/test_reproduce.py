"""`reproduce`'s verdict: a ratio to a fresh baseline against the logged one, in the one ratio notation."""

from __future__ import annotations

from bisect_eagle.cli.reproduce import verdict


def test_the_verdict_reads_ratios_as_times_the_baseline():
    same = verdict(metric="accept_length", old_ratio=4.6, new_ratio=4.6, tolerance=0.1)
    assert same["reproduced"] and same["diff"] == 0
    assert same["text"] == ("reproduced within 0.0 % (accept_length 4.60× baseline now, 4.60× baseline when "
                            "logged)")
    off = verdict(metric="output_tok_s", old_ratio=1.0, new_ratio=1.52, tolerance=0.1)
    assert not off["reproduced"]
    assert off["text"] == ("not reproduced: off by +52.0 %, more than 10 % (output_tok_s 1.52× baseline now, "
                           "1.00× baseline when logged)")
    missing = verdict(metric="output_tok_s", old_ratio=None, new_ratio=1.2, tolerance=0.1)
    assert not missing["reproduced"] and missing["diff"] is None
