"""Waiting for the GPUs to let go of a server's memory: released, held on timeout, unchecked without GPU tools.

``gpu_memory_by_pid`` itself (read from a stand-in ``nvidia-smi``) is tested with the sglang engine's teardown.
"""

from __future__ import annotations

import time

import pytest

from bisect_eagle.engines import gpus


def usage_sequence(monkeypatch: pytest.MonkeyPatch, *answers: dict[int, int] | None) -> list[int]:
    """``gpu_memory_by_pid`` answers ``answers`` in turn (the last one from then on); returns the call log."""
    calls: list[int] = []

    def fake() -> dict[int, int] | None:
        calls.append(1)
        return answers[min(len(calls), len(answers)) - 1]

    monkeypatch.setattr(gpus, "gpu_memory_by_pid", fake)
    return calls


def test_released_once_no_pid_of_the_server_holds_memory(monkeypatch):
    calls = usage_sequence(monkeypatch, {1234: 500, 7: 10}, {1234: 20}, {7: 10})
    got = gpus.wait_gpu_release([1234, 99], 10)
    assert got.status == "released" and got.holders == {} and len(calls) == 3
    assert got.seconds is not None and 0.1 <= got.seconds < 2  # two pauses (0.05 s, then 0.1 s) before the third check


def test_held_when_the_time_is_up_with_the_pids_still_holding(monkeypatch):
    calls = usage_sequence(monkeypatch, {1234: 500, 4321: 0, 7: 10}, {1234: 300, 4321: 0, 7: 10})
    start = time.monotonic()
    got = gpus.wait_gpu_release([1234, 4321], 0.3)
    assert 0.3 <= time.monotonic() - start < 1.5
    assert got.status == "held" and got.seconds is None and got.holders == {1234: 300, 4321: 0}
    assert len(calls) >= 3


def test_a_zero_timeout_checks_once(monkeypatch):
    calls = usage_sequence(monkeypatch, {1234: 500})
    got = gpus.wait_gpu_release([1234], 0.0)
    assert got.status == "held" and got.holders == {1234: 500} and calls == [1]


def test_unchecked_at_once_without_gpu_tools(monkeypatch):
    calls = usage_sequence(monkeypatch, None)
    assert gpus.wait_gpu_release([1234], 10).status == "unchecked" and calls == [1]
