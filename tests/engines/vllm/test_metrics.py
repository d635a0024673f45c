"""vLLM's Prometheus counters (fixtures from a real vLLM 0.32 server) → accept length and
per-position rates."""

from __future__ import annotations

import math

import pytest

from bisect_eagle.engines.vllm.metrics import (
    MetricsError,
    SpecCounters,
    parse_prometheus,
    spec_counters,
    spec_stats,
)


def test_real_metrics_deltas_give_the_reference_accept_length(fixtures):
    """The fixtures bracket the 8 measured requests of the tiny pair with vLLM ids [2, 6, 10] (after
    2 warm-ups):
    142 draft steps, 372 of 426 drafts accepted: the 3.62 of the reference measurement."""
    before = spec_counters((fixtures / "metrics-before.txt").read_text())
    after = spec_counters((fixtures / "metrics-after.txt").read_text())
    assert before.finished == 2 and after.finished == 10
    delta = after.minus(before)
    stats = spec_stats(delta, num_speculative_tokens=3)
    assert (stats.drafts, stats.accepted, stats.draft_tokens) == (142, 372, 426)
    assert (
        stats.accept_length == pytest.approx(1 + 372 / 142)
        and round(stats.accept_length, 2) == 3.62
    )
    assert [round(r, 3) for r in stats.rates] == [0.923, 0.954, 0.928]  # 131/142, 125/131, 116/125
    assert stats.hist == {1: 11, 2: 6, 3: 9, 4: 116}
    assert sum(stats.hist.values()) == stats.drafts
    assert sum((k - 1) * n for k, n in stats.hist.items()) == stats.accepted


def test_counters_sum_over_label_sets():
    text = "\n".join(
        [
            "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0',
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 5.0',
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0',
            "vllm:spec_decode_num_accepted_tokens_per_pos_total"
            '{engine="0",model_name="m",position="1"} 7.0',
            "vllm:spec_decode_num_accepted_tokens_per_pos_total"
            '{engine="0",model_name="m",position="0"} 9.0',
            'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 1.0',
            'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 2.0',
        ]
    )
    c = spec_counters(text)
    assert (c.drafts, c.accepted, c.per_pos, c.finished, c.present) == (
        15.0,
        20.0,
        (9.0, 7.0),
        3.0,
        True,
    )


def test_no_spec_counters_and_no_drafts():
    c = spec_counters('vllm:request_success_total{finished_reason="length"} 4.0\n')
    assert not c.present and c.finished == 4
    stats = spec_stats(c.minus(SpecCounters()), num_speculative_tokens=3)
    assert (
        math.isnan(stats.accept_length)
        and stats.hist == {}
        and all(math.isnan(r) for r in stats.rates)
    )


def test_a_broken_metrics_line_is_an_error():
    with pytest.raises(MetricsError, match="line 2"):
        parse_prometheus("vllm:a_total 1\nthis is not a sample line at all\n")
    with pytest.raises(MetricsError, match="not a number"):
        parse_prometheus("vllm:a_total one\n")
