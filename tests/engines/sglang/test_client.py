"""The client's two waits, against an in-process transport: readiness (ready, exited, timeout, never
a probe past the deadline) and the cache flush (retried while the server answers non-200, the last
answer in the error on timeout, a transport error raised at once).
"""

from __future__ import annotations

import time

import httpx
import pytest

from bisect_eagle.engines.sglang.client import RequestError, SglangClient


def client_answering(handler) -> SglangClient:
    """A client whose requests go to ``handler(request) -> httpx.Response`` instead of the
    network."""
    client = SglangClient("http://127.0.0.1:1", 5)
    client._http.close()
    client._http = httpx.Client(base_url=client.base_url, transport=httpx.MockTransport(handler))
    return client


def test_wait_ready_probes_until_the_health_check_answers_200():
    probes: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        probes.append(request.url.path)
        return httpx.Response(200 if len(probes) == 3 else 503)

    assert client_answering(handler).wait_ready(lambda: False, timeout_s=10) == "ready"
    assert probes == ["/health_generate"] * 3


def test_wait_ready_times_out_and_sends_no_probe_past_the_deadline():
    probes: list[int] = []
    checks: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        probes.append(1)
        if len(probes) % 2:
            # not listening yet counts as not ready
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(503)

    def exited() -> bool:
        checks.append(1)
        return False

    client = client_answering(handler)
    start = time.monotonic()
    assert client.wait_ready(exited, timeout_s=0.3, poll_s=0.1) == "timeout"
    assert 0.3 <= time.monotonic() - start < 1.5
    # the last check, at the deadline, sends none
    assert len(probes) >= 3 and len(probes) == len(checks) - 1


def test_wait_ready_reports_a_process_that_exited_even_after_the_deadline():
    probes: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        probes.append(1)
        return httpx.Response(503)

    client = client_answering(handler)
    assert client.wait_ready(lambda: len(probes) >= 2, timeout_s=10) == "exited"
    assert len(probes) == 2
    assert client.wait_ready(lambda: True, timeout_s=0) == "exited" and len(probes) == 2


def test_flush_cache_is_retried_while_the_server_answers_400():
    answers = iter([400, 400, 200])
    posts: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posts.append(f"{request.method} {request.url.path}")
        return httpx.Response(next(answers), text="busy")

    client_answering(handler).flush_cache(timeout_s=10)
    assert posts == ["POST /flush_cache"] * 3


def test_flush_cache_gives_up_after_its_timeout_with_the_last_answer():
    posts: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posts.append(1)
        return httpx.Response(400 if len(posts) < 3 else 503, text=f"busy {len(posts)}")

    start = time.monotonic()
    with pytest.raises(RequestError, match=r"^POST /flush_cache: HTTP 503 for 0 s: busy \d+$") as e:
        client_answering(handler).flush_cache(timeout_s=0.4)
    assert 0.4 <= time.monotonic() - start < 1.5
    assert len(posts) >= 3 and str(e.value).endswith(f"busy {len(posts)}") and not e.value.timed_out


@pytest.mark.parametrize(
    ("error", "timed_out"), [(httpx.ConnectError, False), (httpx.ReadTimeout, True)]
)
def test_flush_cache_raises_a_transport_error_at_once(error, timed_out):
    posts: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posts.append(1)
        raise error("no answer", request=request)

    with pytest.raises(
        RequestError, match=rf"^POST /flush_cache: {error.__name__}: no answer$"
    ) as e:
        client_answering(handler).flush_cache(timeout_s=10)
    assert e.value.timed_out is timed_out and posts == [1]
