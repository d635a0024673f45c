"""HTTP client of an SGLang-compatible server: readiness, server info, cache flush and the benchmark
batch.

The benchmark sends token ids (``input_ids``), so the server sees exactly the tokens the local
engine decodes, with ``max_new_tokens`` fixed, EOS honoured and ``temperature`` from the settings.
Throughput is wall-clock: completion tokens of the measured requests over the time from the first
submission to the last answer. Accept length comes from each answer's ``meta_info``
(``completion_tokens / spec_verify_ct``, the only ratio that compares across SGLang versions), its
per-step distribution from ``spec_correct_drafts_histogram`` (older name ``spec_accept_histogram``;
index = correct drafts in a step).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from bisect_eagle.engines.httpclient import BatchResult, HttpClient, RequestError
from bisect_eagle.poll import wait_until

__all__ = ["BatchResult", "Completion", "RequestError", "SglangClient", "parse_completion"]

HISTOGRAM_KEYS = ("spec_correct_drafts_histogram", "spec_accept_histogram")


@dataclass
class Completion:
    """One answered /generate request."""

    id: str
    prompt_tokens: int
    completion_tokens: int
    verify_ct: int | None  # None: the server reported no speculative counters
    histogram: list[int] | None  # verify steps by number of correct drafts
    latency_s: float
    meta: dict[str, Any]


def parse_completion(rid: str, body: dict, *, latency_s: float) -> Completion:
    """A /generate answer → :class:`Completion`; missing token counts are a
    :class:`RequestError`."""
    meta = body.get("meta_info") if isinstance(body, dict) else None
    if not isinstance(meta, dict) or "completion_tokens" not in meta:
        raise RequestError(
            f"request {rid}: answer without meta_info.completion_tokens: {str(body)[:200]}"
        )
    hist = next((meta[k] for k in HISTOGRAM_KEYS if isinstance(meta.get(k), list)), None)
    verify = meta.get("spec_verify_ct")
    kept = {k: v for k, v in meta.items() if k != "hidden_states"}
    return Completion(
        rid,
        int(meta.get("prompt_tokens", 0)),
        int(meta["completion_tokens"]),
        int(verify) if isinstance(verify, (int, float)) else None,
        [int(c) for c in hist] if hist is not None else None,
        latency_s,
        kept,
    )


class SglangClient(HttpClient):
    """Talks to one server at ``base_url``; requests give up after ``request_timeout_s``."""

    health_path = "/health_generate"
    poll_s = 0.25

    def server_info(self) -> dict:
        """GET /server_info (``/get_server_info`` on servers that predate it).

        Returns:
            The server's JSON answer.

        Raises:
            RequestError: a transport error (``timed_out`` on a timeout), an answer other than 200
                or 404, or neither path on the server.
        """
        for path in ("/server_info", "/get_server_info"):
            r = self.get(path)
            if r.status_code == 404:
                continue
            if r.status_code != 200:
                raise RequestError(f"GET {path}: HTTP {r.status_code}: {r.text[:200]}")
            return r.json()
        raise RequestError("neither /server_info nor /get_server_info exists on this server")

    def flush_cache(self, timeout_s: float = 30.0) -> None:
        """POST /flush_cache, retried while the server is still busy (SGLang answers 400 until
        idle).

        Any answer but 200 is retried until ``timeout_s`` has passed, then raised as
        :class:`RequestError` with the last answer; a transport error is raised at once.

        Args:
            timeout_s: the most seconds to keep retrying.

        Raises:
            RequestError: a transport error, or no 200 within ``timeout_s``.
        """
        last: list[httpx.Response] = []  # the latest answer, for the error message

        def flushed() -> bool:
            try:
                r = self._http.post("/flush_cache")
            except httpx.HTTPError as e:
                raise RequestError(
                    f"POST /flush_cache: {type(e).__name__}: {e}",
                    timed_out=isinstance(e, httpx.TimeoutException),
                ) from None
            last[:] = [r]
            return r.status_code == 200

        if not wait_until(
            flushed, timeout_s=timeout_s, max_interval_s=0.2, what=f"{self.base_url}/flush_cache"
        ):
            r = last[0]
            raise RequestError(
                f"POST /flush_cache: HTTP {r.status_code} for {timeout_s:.0f} s: {r.text[:200]}"
            )

    def generate(
        self, rid: str, input_ids: list[int], *, sampling_params: dict, extra: dict | None = None
    ) -> Completion:
        """One /generate request; returns the parsed answer or raises :class:`RequestError`.

        Args:
            rid: the request's id, for errors and the completion.
            input_ids: the prompt's token ids.
            sampling_params: SGLang's ``sampling_params``.
            extra: more top-level payload fields; None adds none.

        Returns:
            The parsed completion, with its client-timed latency in seconds.

        Raises:
            RequestError: no answer in time (``timed_out``), a transport error, or not 200.
        """
        payload = {
            "input_ids": list(input_ids),
            "sampling_params": sampling_params,
            **(extra or {}),
        }
        start = time.perf_counter()
        try:
            r = self._http.post("/generate", json=payload)
        except httpx.TimeoutException:
            msg = f"request {rid}: no answer within {self.request_timeout_s:.0f} s"
            raise RequestError(msg, timed_out=True) from None
        except httpx.HTTPError as e:
            raise RequestError(f"request {rid}: {type(e).__name__}: {e}") from None
        latency = time.perf_counter() - start
        if r.status_code != 200:
            raise RequestError(f"request {rid}: HTTP {r.status_code}: {r.text[:300]}")
        return parse_completion(rid, r.json(), latency_s=latency)

    def run_batch(
        self, requests: Sequence[tuple[str, list[int]]], sampling_params: dict, *, concurrency: int
    ) -> BatchResult:
        """Send ``requests`` (id, token ids) with at most ``concurrency`` in flight; the first
        failure is raised.

        Args:
            requests: (request id, token ids) pairs.
            sampling_params: SGLang's ``sampling_params``, the same for every request.
            concurrency: the most requests in flight (≥ 1).

        Returns:
            The completions and the batch's wall time in seconds.

        Raises:
            RequestError: the first request that failed.
            ValueError: ``concurrency < 1``.
        """
        return self._concurrent(
            requests,
            lambda rid, ids: self.generate(rid, ids, sampling_params=sampling_params),
            concurrency=concurrency,
            thread_name_prefix="bench",
        )
