"""The HTTP client base shared by the engines that measure a server over HTTP (``sglang``,
``vllm``).

Both talk to one server the same way: one ``httpx`` client (bearer key when set, the request timeout
with a short connect timeout, no proxy from the environment), readiness by polling a health route
while checking that the process lives, and a batch of requests with at most ``concurrency`` in
flight whose first failure is raised. :class:`HttpClient` holds that; each engine's ``client``
module subclasses it with its own routes and answer parsing. Shared so both engines time, poll and
fail their requests in one way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx

from bisect_eagle.poll import wait_until


class RequestError(Exception):
    """A request that got no usable answer; ``timed_out`` when the client gave up waiting;
    ``status``: the HTTP status of a refused request, where the client records it."""

    def __init__(self, message: str, timed_out: bool = False, status: int | None = None):
        super().__init__(message)
        self.timed_out = timed_out
        self.status = status


@dataclass
class BatchResult:
    """A batch of answered requests and its client-timed window."""

    completions: list[Any]
    wall_s: float


class HttpClient:
    """Talks to one server at ``base_url``; requests give up after ``request_timeout_s``.

    A server's client sets :attr:`health_path` (the endpoint that answers 200 once the server can
    generate) and :attr:`poll_s` (the most seconds between its probes).
    """

    health_path: ClassVar[str]
    poll_s: ClassVar[float]

    def __init__(self, base_url: str, request_timeout_s: float, *, api_key: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.request_timeout_s = request_timeout_s
        self._http = httpx.Client(
            base_url=self.base_url,
            # the server's --api-key
            headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
            timeout=httpx.Timeout(request_timeout_s, connect=min(10.0, request_timeout_s)),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=256),
            trust_env=False,  # never route 127.0.0.1 through a proxy from the environment
        )

    def close(self) -> None:
        self._http.close()

    def get(self, path: str) -> httpx.Response:
        """``GET path``, whatever its status.

        Args:
            path: the path on the server.

        Returns:
            The server's answer.

        Raises:
            RequestError: a transport error (``timed_out`` on a timeout).
        """
        try:
            return self._http.get(path)
        except httpx.HTTPError as e:
            raise RequestError(
                f"GET {path}: {type(e).__name__}: {e}",
                timed_out=isinstance(e, httpx.TimeoutException),
            ) from None

    def wait_ready(
        self, exited: Callable[[], bool], *, timeout_s: float, poll_s: float | None = None
    ) -> str:
        """Poll ``GET`` :attr:`health_path` until 200: ``ready``, or ``exited`` when the process
        died, or ``timeout``.

        ``exited`` is checked before every probe, so a dead process is reported even once the time
        is up. Probes start quickly and come at most ``poll_s`` apart; none is sent past the
        deadline.

        Args:
            exited: whether the server's process has ended.
            timeout_s: the most seconds to wait.
            poll_s: the most seconds between probes; None: the client's :attr:`poll_s`.

        Returns:
            ``ready``, ``exited`` or ``timeout``.
        """
        path, poll_s = self.health_path, self.poll_s if poll_s is None else poll_s
        deadline = time.monotonic() + timeout_s

        def state() -> str | None:
            """One probe: "exited", "timeout" or "ready"; None to probe again.

            Returns:
                The final state, or None while the server is not ready yet.
            """
            if exited():
                return "exited"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            try:
                r = self._http.get(path, timeout=max(0.1, min(remaining, 30.0)))
            except httpx.HTTPError:
                return None
            return "ready" if r.status_code == 200 else None

        # wait_until's own deadline falls a hair after ours, so ``state`` ends the wait; a None is a
        # timeout too
        return (
            wait_until(
                state, timeout_s=timeout_s, max_interval_s=poll_s, what=f"{self.base_url}{path}"
            )
            or "timeout"
        )

    @staticmethod
    def _concurrent(
        requests: Sequence[tuple[str, list[int]]],
        send: Callable[[str, list[int]], Any],
        *,
        concurrency: int,
        thread_name_prefix: str,
    ) -> BatchResult:
        """``send(id, token ids)`` for each request with at most ``concurrency`` in flight; the
        first failure is raised. ``wall_s`` is the window from the first submission to the last
        answer."""
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        stop = threading.Event()

        def one(rid: str, ids: list[int]) -> Any:
            if stop.is_set():
                return None
            return send(rid, ids)

        pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=thread_name_prefix)
        start = time.perf_counter()
        futures = [pool.submit(one, rid, ids) for rid, ids in requests]
        wait(futures, return_when=FIRST_EXCEPTION)
        wall = time.perf_counter() - start
        failure = next(
            (f.exception() for f in futures if f.done() and f.exception() is not None), None
        )
        if failure is not None:
            stop.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise failure
        pool.shutdown(wait=True)
        return BatchResult([f.result() for f in futures], wall)
