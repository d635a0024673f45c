"""Failure classes on vLLM 0.32's real output (fixtures/README.md says how each file was
produced)."""

from __future__ import annotations

import json

import pytest

from bisect_eagle.engines.vllm.client import RequestError, parse_completion
from bisect_eagle.engines.vllm.failures import classify_failure, engine_fatal


@pytest.mark.parametrize(
    "name,phase,cls,line",
    [
        (
            "bad-arguments-parse.log",
            "start",
            "bad_arguments",
            "api_server.py: error: argument --speculative-config/-sc: Value",
        ),
        (
            "bad-arguments-config.log",
            "start",
            "bad_arguments",
            "ValidationError: 1 validation error for SpeculativeConfig",
        ),
        (
            "engine-dead-first-request.log",
            "benchmark",
            "capture_error",
            "RuntimeError: shape '[-1, 576]' is invalid for input of size 24576",
        ),
        (
            "oom-kv-cache-space.log",
            "start",
            "out_of_memory",
            "is less than requested memory for kv (100.0 GiB)",
        ),
        (
            "oom-max-model-len.log",
            "start",
            "out_of_memory",
            "KV cache is needed, which is larger than the available KV cache memory",
        ),
        ("oom-kv-cache-space.log", "benchmark", "out_of_memory", "VLLM_CPU_KVCACHE_SPACE"),
        ("readiness-timeout.log", "ready_timeout", "readiness_timeout", "GET /health"),
        ("ready.log", "ready_timeout", "readiness_timeout", "GET /health"),
    ],
)
def test_real_vllm_output_is_classified(fixtures, name, phase, cls, line):
    got, why = classify_failure(phase, (fixtures / name).read_text())
    assert got == cls and line in why


def test_engine_dead_at_the_first_request(fixtures):
    """The HTTP 500 body says only that the engine died; the log holds why (the draft's fc got 2 of
    3 states)."""
    body = json.loads((fixtures / "engine-dead-first-request.http500.json").read_text())
    assert (
        body["status"] == 500
        and "EngineCore encountered an issue" in body["body"]["error"]["message"]
    )
    with pytest.raises(RequestError, match="usage.completion_tokens"):
        parse_completion("held-0", body["body"], latency_s=0.1)
    log = (fixtures / "engine-dead-first-request.log").read_text()
    frames, exc = engine_fatal(log)
    assert exc.startswith("RuntimeError: shape '[-1, 576]'")
    assert any("combine_hidden_states" in f for f in frames)
    assert "Using auxiliary layers from speculative config: (-1, 1, 5)" in log


def test_startup_argument_errors_only_before_ready(fixtures):
    """A parser error text in a log that was ready is not an argument problem of this launch."""
    text = (fixtures / "bad-arguments-parse.log").read_text()
    assert classify_failure("benchmark", text)[0] == "crash_during_benchmark"


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
            "ValueError: No available memory for the cache blocks. Try increasing "
            "`gpu_memory_utilization`",
            False,
            "out_of_memory",
        ),
        (
            "start",
            'Traceback (most recent call last):\n  File "x.py", line 1, in f\nImportError: no '
            "flashinfer",
            False,
            "launch_error",
        ),
        ("start", "", False, "launch_error"),
        ("benchmark", "", True, "hung_request"),
        (
            "benchmark",
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
            False,
            "crash_during_benchmark",
        ),
        ("benchmark", "", False, "crash_during_benchmark"),
    ],
)
def test_other_failures(phase, log, timed_out, cls):
    assert classify_failure(phase, log, timed_out=timed_out)[0] == cls


def test_a_real_completion_answer_parses(fixtures):
    answer = json.loads((fixtures / "completion-200.json").read_text())
    c = parse_completion(answer["id"], answer["body"], latency_s=answer["latency_s"])
    assert (c.prompt_tokens, c.completion_tokens, c.finish_reason) == (64, 64, "length")
