"""The one way to wait for something: poll a predicate on a monotonic clock with capped backoff.

``wait_until(ready, timeout_s=30)`` calls ``ready()`` at once, then after 0.05 s, 0.1 s, 0.2 s, ...
(doubling, at most ``max_interval_s`` apart), never sleeping past the deadline, and once more at the
deadline. It returns the first truthy value ``ready()`` gives, or None when the time is up. A
predicate whose answer may legitimately be falsy (a result of 0, an object that was deleted) returns
it wrapped, e.g. in a 1-tuple.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

INTERVAL_S = 0.05  # the first pause: short, so a condition that is nearly met costs almost nothing
MAX_INTERVAL_S = 1.0  # the longest pause between two checks


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout_s: float,
    interval_s: float = INTERVAL_S,
    max_interval_s: float = MAX_INTERVAL_S,
    what: str = "a condition",
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T | None:
    """The first truthy value of ``predicate()``, polled until ``timeout_s`` has passed; None on
    timeout.

    Exceptions from ``predicate`` propagate (a predicate may raise to give up early, e.g. when the
    process it waits for has exited).

    Args:
        predicate: called with no arguments, at once and after every pause; a truthy result ends
            the wait.
        timeout_s: seconds to keep polling (a negative value is 0: one call, then once more).
        interval_s: the first pause in seconds (> 0).
        max_interval_s: the longest pause in seconds (> 0); pauses double up to it.
        what: names the condition in the debug log line written on timeout.
        clock: the monotonic clock, in seconds (for tests).
        sleep: the sleep function, in seconds (for tests).

    Returns:
        The first truthy value of ``predicate()``; None when ``timeout_s`` has passed without one.

    Raises:
        ValueError: ``interval_s`` or ``max_interval_s`` is not positive.
    """
    if interval_s <= 0 or max_interval_s <= 0:
        raise ValueError("wait_until: interval_s and max_interval_s must be positive")
    deadline = clock() + max(0.0, timeout_s)
    pause = min(interval_s, max_interval_s)
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - clock()
        if left <= 0:
            log.debug("gave up waiting for %s after %g s", what, timeout_s)
            return None
        sleep(min(pause, left))
        pause = min(pause * 2, max_interval_s)
