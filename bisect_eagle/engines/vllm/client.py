"""HTTP client of a vLLM OpenAI-compatible server: readiness, models, version, ``/metrics`` and the
benchmark.

vLLM binds its port before the engine starts but serves HTTP only once the engine is up, so ``GET
/health`` refuses connections while vLLM loads and answers 200 when the server is ready
(``tests/engines/vllm/fixtures/readiness.json``). ``GET /v1/models`` names the served model (the
``model`` of every request) and its ``max_model_len``.

The benchmark sends token ids (``prompt`` as a list of ints to ``POST /v1/completions``), so the
server sees exactly the tokens the other engines decode, with ``max_tokens`` fixed, EOS honoured and
``temperature`` from the settings. Throughput is client-timed; the speculative metrics come from
``/metrics`` deltas (:mod:`.metrics`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from bisect_eagle.engines.httpclient import BatchResult, HttpClient, RequestError
from bisect_eagle.engines.vllm.metrics import MetricsError, SpecCounters, spec_counters
from bisect_eagle.poll import wait_until

__all__ = ["BatchResult", "Completion", "RequestError", "VllmClient", "parse_completion"]


@dataclass
class Completion:
    """One answered ``/v1/completions`` request."""

    id: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    latency_s: float
    # Δ vllm:spec_decode_num_drafts_total over this request (sequential runs only)
    drafts: int | None = None
    # the generated token ids (``return_token_ids``), for greedy equality
    output_ids: list[int] | None = None


def parse_completion(rid: str, body: Any, *, latency_s: float) -> Completion:
    """A ``/v1/completions`` answer → :class:`Completion`; an answer without ``usage`` is a
    :class:`RequestError`."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict) or not isinstance(usage.get("completion_tokens"), int):
        raise RequestError(
            f"request {rid}: answer without usage.completion_tokens: {str(body)[:200]}"
        )
    choices = body.get("choices") if isinstance(body.get("choices"), list) else []
    first = choices[0] if choices and isinstance(choices[0], dict) else {}
    ids = first.get("token_ids")
    return Completion(
        rid,
        int(usage.get("prompt_tokens") or 0),
        int(usage["completion_tokens"]),
        first.get("finish_reason"),
        latency_s,
        output_ids=[int(i) for i in ids] if isinstance(ids, list) else None,
    )


class VllmClient(HttpClient):
    """Talks to one vLLM server at ``base_url``; requests give up after ``request_timeout_s``."""

    health_path = "/health"
    poll_s = 0.5

    def _get(self, path: str) -> httpx.Response:
        r = self.get(path)
        if r.status_code != 200:
            raise RequestError(
                f"GET {path}: HTTP {r.status_code}: {r.text[:200]}", status=r.status_code
            )
        return r

    def models(self) -> list[dict]:
        """``GET /v1/models``: the served models (``id``, ``max_model_len``, …)."""
        body = self._get("/v1/models").json()
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or not data:
            raise RequestError(f"GET /v1/models: no model listed: {str(body)[:200]}")
        return [m for m in data if isinstance(m, dict)]

    def version(self) -> str | None:
        """``GET /version`` (None when the server has no such route).

        Returns:
            The version string; None also when the request or its JSON fails, or it names none.
        """
        try:
            body = self._get("/version").json()
        except (RequestError, ValueError):
            return None
        return str(body.get("version")) if isinstance(body, dict) and body.get("version") else None

    def reset_prefix_cache(self) -> bool:
        """``POST /reset_prefix_cache``: True when vLLM reset its prefix cache; False when it
        answers otherwise (the route is vLLM's dev API, served only with ``VLLM_SERVER_DEV_MODE=1``)
        or refuses while blocks are held.
        """
        try:
            r = self._http.post("/reset_prefix_cache")
        except httpx.HTTPError:
            return False
        try:
            return r.status_code == 200 and bool(r.json().get("success", True))
        except (ValueError, AttributeError):
            return r.status_code == 200

    def metrics_text(self) -> str:
        """``GET /metrics``: the Prometheus text."""
        return self._get("/metrics").text

    def counters(self, *, finished_at_least: int, timeout_s: float) -> tuple[SpecCounters, str]:
        """vLLM's counters once they count at least ``finished_at_least`` finished requests:
        (counters, text).

        vLLM records a step's statistics after it has sent the answers of that step, so a scrape
        right after the last answer may miss it; the finished-requests counter, recorded in the same
        call, says when it is in. Raises :class:`RequestError` when the counters do not get there
        within ``timeout_s``.
        """
        last: list[tuple[SpecCounters, str]] = []

        def settled() -> tuple[SpecCounters, str] | None:
            text = self.metrics_text()
            try:
                counters = spec_counters(text)
            except MetricsError as e:
                raise RequestError(f"GET /metrics: {e}") from None
            last[:] = [(counters, text)]
            return (counters, text) if counters.finished >= finished_at_least else None

        got = wait_until(
            settled, timeout_s=timeout_s, max_interval_s=0.2, what=f"{self.base_url}/metrics"
        )
        if got is None:
            seen = last[0][0].finished if last else "no answer"
            raise RequestError(
                f"GET /metrics: vllm:request_success_total reached {seen}, not "
                f"{finished_at_least}, within {timeout_s:g} s"
            )
        return got

    def complete(self, rid: str, input_ids: list[int], *, model: str, sampling: dict) -> Completion:
        """One ``POST /v1/completions`` with token ids; the parsed answer or
        :class:`RequestError`."""
        payload = {"model": model, "prompt": list(input_ids), "return_token_ids": True, **sampling}
        start = time.perf_counter()
        try:
            r = self._http.post("/v1/completions", json=payload)
        except httpx.TimeoutException:
            raise RequestError(
                f"request {rid}: no answer within {self.request_timeout_s:.0f} s", timed_out=True
            ) from None
        except httpx.HTTPError as e:
            raise RequestError(f"request {rid}: {type(e).__name__}: {e}") from None
        latency = time.perf_counter() - start
        if r.status_code != 200:
            raise RequestError(
                f"request {rid}: HTTP {r.status_code}: {r.text[:300]}", status=r.status_code
            )
        try:
            body = r.json()
        except ValueError:
            raise RequestError(f"request {rid}: answer is not JSON: {r.text[:200]}") from None
        return parse_completion(rid, body, latency_s=latency)

    def run_sequential(
        self,
        requests: Sequence[tuple[str, list[int]]],
        *,
        model: str,
        sampling: dict,
        finished_before: int,
        metrics_timeout_s: float,
    ) -> tuple[BatchResult, SpecCounters, SpecCounters]:
        """One request at a time, ``/metrics`` read around each: (batch, counters before, counters
        after).

        Each completion's ``drafts`` is vLLM's draft-step count for it. ``wall_s`` is the sum of the
        requests' client-timed latencies (the scrapes between them are not in it).
        ``finished_before``: requests the server finished before these.
        """
        before, _ = self.counters(finished_at_least=finished_before, timeout_s=metrics_timeout_s)
        prev, done = before, []
        for n, (rid, ids) in enumerate(requests, start=1):
            c = self.complete(rid, ids, model=model, sampling=sampling)
            now, _ = self.counters(
                finished_at_least=finished_before + n, timeout_s=metrics_timeout_s
            )
            c.drafts = int(round(now.drafts - prev.drafts))
            done.append(c)
            prev = now
        return BatchResult(done, sum(c.latency_s for c in done)), before, prev

    def run_batch(
        self,
        requests: Sequence[tuple[str, list[int]]],
        *,
        model: str,
        sampling: dict,
        concurrency: int,
    ) -> BatchResult:
        """Send ``requests`` (id, token ids) with at most ``concurrency`` in flight; the first
        failure is raised.

        ``wall_s`` is the window from the first submission to the last answer.

        Args:
            requests: (request id, token ids) pairs.
            model: the served model's name, sent with each request.
            sampling: the completion request's sampling fields, the same for every request.
            concurrency: the most requests in flight (≥ 1; less raises ``ValueError``).

        Returns:
            The completions and ``wall_s``; the first request that failed raises its
            ``RequestError`` instead.
        """
        return self._concurrent(
            requests,
            lambda rid, ids: self.complete(rid, ids, model=model, sampling=sampling),
            concurrency=concurrency,
            thread_name_prefix="vllm-bench",
        )
