"""Failure classes on SGLang 0.5.23's real messages (fixtures/README.md says how each was
produced)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bisect_eagle.engines.sglang.failures import classify_failure

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.parametrize(
    "name,phase,cls,line",
    [
        (
            "invalid-choice.log",
            "start",
            "bad_arguments",
            "sglang serve: error: argument --attention-backend",
        ),
        ("ambiguous-option.log", "start", "bad_arguments", "sglang serve: error: ambiguous option"),
        (
            "resolution-valueerror.log",
            "start",
            "bad_arguments",
            "ValueError: speculative_eagle_topk > 1",
        ),
        ("capture-error.log", "start", "capture_error", "captured 2 of 3 aux hidden states"),
        ("oom-pool.log", "start", "out_of_memory", "Not enough memory"),
        ("oom-pool.log", "benchmark", "out_of_memory", "Not enough memory"),
    ],
)
def test_real_sglang_output_is_classified(name, phase, cls, line):
    got, why = classify_failure(phase, (FIXTURES / name).read_text())
    assert got == cls and line in why


@pytest.mark.parametrize(
    "phase,log,timed_out,cls",
    [
        (
            "start",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            False,
            "out_of_memory",
        ),
        (
            "start",
            "ValueError: bad eagle_aux_hidden_state_layer_ids in config",
            False,
            "capture_error",
        ),
        (
            "start",
            "INFO using eagle_aux_hidden_state_layer_ids [1, 5]\nImportError: no flashinfer",
            False,
            "launch_error",
        ),
        ("ready_timeout", "loading weights...", False, "readiness_timeout"),
        ("benchmark", "", True, "hung_request"),
        ("benchmark", "", False, "crash_during_benchmark"),
    ],
)
def test_other_phases(phase, log, timed_out, cls):
    assert classify_failure(phase, log, timed_out=timed_out)[0] == cls
