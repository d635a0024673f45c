"""The poll helper: first truthy value, None on timeout, capped doubling pauses, never past the
deadline."""

from __future__ import annotations

import time

import pytest

from bisect_eagle.poll import wait_until


class FakeClock:
    """A clock that only moves when the code under test sleeps; records every pause."""

    def __init__(self) -> None:
        self.now = 100.0
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.pauses.append(s)
        self.now += s


def test_returns_the_first_truthy_value_without_sleeping_when_ready():
    clock = FakeClock()
    assert wait_until(lambda: "ready", timeout_s=5, clock=clock, sleep=clock.sleep) == "ready"
    assert clock.pauses == []


def test_pauses_double_up_to_the_cap_and_the_value_comes_back():
    clock = FakeClock()
    answers = iter([None, 0, False, "", None, None, {"done": 1}])
    got = wait_until(
        lambda: next(answers),
        timeout_s=60,
        interval_s=0.1,
        max_interval_s=0.5,
        clock=clock,
        sleep=clock.sleep,
    )
    assert got == {"done": 1}
    assert clock.pauses == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5, 0.5])


def test_timeout_gives_none_after_a_last_check_at_the_deadline():
    clock = FakeClock()
    calls: list[float] = []

    def never() -> None:
        calls.append(clock.now)

    assert (
        wait_until(
            never, timeout_s=1.0, interval_s=0.3, max_interval_s=10, clock=clock, sleep=clock.sleep
        )
        is None
    )
    # the last pause is cut to end exactly at the deadline
    assert sum(clock.pauses) == pytest.approx(1.0)
    assert clock.pauses[-1] == pytest.approx(0.1)
    assert calls[-1] == pytest.approx(101.0)  # checked once more at the deadline


def test_zero_timeout_checks_once():
    calls = []
    assert wait_until(lambda: calls.append(1), timeout_s=0) is None
    assert calls == [1]


def test_a_predicate_may_raise_to_give_up():
    def broken() -> bool:
        raise RuntimeError("the process exited")

    with pytest.raises(RuntimeError, match="exited"):
        wait_until(broken, timeout_s=5)


def test_real_clock_waits_roughly_the_timeout():
    start = time.monotonic()
    assert wait_until(lambda: None, timeout_s=0.3, max_interval_s=0.05) is None
    assert 0.3 <= time.monotonic() - start < 2.0
    with pytest.raises(ValueError):
        wait_until(lambda: True, timeout_s=1, interval_s=0)
