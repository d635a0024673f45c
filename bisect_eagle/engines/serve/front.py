"""The stand-in's HTTP front (stdlib ``http.server``): SGLang's endpoints, graceful SIGTERM
shutdown."""

from __future__ import annotations

import json
import logging
import signal
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bisect_eagle.engines.serve.api import Backend, Rejected, parse_generate
from bisect_eagle.errors import BadInput

log = logging.getLogger("bisect_eagle.serve")
READY_LINE = "The server is fired up and ready to roll!"


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so no idle connection delays shutdown
    server: ServeHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: Any) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header(
            "Content-Type", "text/plain" if isinstance(body, str) else "application/json"
        )
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"{}")
        except json.JSONDecodeError as e:
            raise Rejected(f"body is not valid JSON ({e.msg})") from None

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._route("PUT")

    def _route(self, method: str) -> None:
        backend = self.server.backend
        path = self.path.split("?", 1)[0]
        key = self.server.api_key
        if (
            key
            and path not in ("/health", "/health_generate")
            and self.headers.get("Authorization") != f"Bearer {key}"
        ):
            self._send(
                401,
                {"error": {"message": "a valid API key is required (Authorization: Bearer ...)"}},
            )
            return
        try:
            if path in ("/health", "/health_generate") and method == "GET":
                ok = not backend.exiting and backend.health()
                self._send(200 if ok else 503, "")
            elif path in ("/server_info", "/get_server_info") and method == "GET":
                self._send(200, backend.server_info())
            elif path == "/flush_cache" and method in ("GET", "POST"):
                ok = backend.flush_cache()
                self._send(
                    200 if ok else 400,
                    "Cache flushed.\n" if ok else "Requests are running; not flushed.\n",
                )
            elif path == "/generate" and method in ("POST", "PUT"):
                if backend.exiting:
                    self._send(503, {"error": {"message": "the server is shutting down"}})
                    return
                req = parse_generate(self._body(), backend.next_id())
                self._send(200, backend.generate(req))
            else:
                self._send(
                    404,
                    {"error": {"message": f"{method} {path} is not served by bisect-eagle serve"}},
                )
        except Rejected as e:
            self._send(400, {"error": {"message": str(e)}})
        except (BadInput, RuntimeError, ValueError) as e:
            log.exception("request failed")
            self._send(500, {"error": {"message": f"{type(e).__name__}: {e}"}})


class ServeHTTPServer(ThreadingHTTPServer):
    """Threads per connection; closing waits for requests in flight (graceful shutdown)."""

    daemon_threads = False
    block_on_close = True

    def __init__(self, address: tuple[str, int], backend: Backend, *, api_key: str | None = None):
        super().__init__(address, _Handler)
        self.backend = backend
        self.api_key = api_key


def serve_until_signal(httpd: ServeHTTPServer) -> None:
    """Serve until SIGTERM or SIGINT, then stop accepting, finish requests in flight and return."""

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s, shutting down gracefully", signal.Signals(signum).name)
        httpd.backend.exiting = True
        # shutdown() blocks; not from this thread
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(READY_LINE)
    httpd.serve_forever(poll_interval=0.1)
    httpd.server_close()
    log.info("shutdown complete")
