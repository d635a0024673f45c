"""A stand-in for ``python -m vllm.entrypoints.openai.api_server`` (stdlib only), for fast engine
tests.

It takes vLLM's launch flags (``--model``, ``--host``, ``--port``, ``--speculative-config``; others
ignored), reads the draft's aux layer ids the way vLLM 0.32 does and logs them with vLLM's line, and
serves ``/health``, ``/v1/models``, ``/version``, ``/metrics`` and ``/v1/completions``. Its
speculative counters follow a fixed rule: every request takes 16 draft steps with 15, 14 and 13
accepted drafts at positions 0, 1 and 2 (accept length ``1 + 42/16``), and they are recorded 0.3 s
after the answer is sent, as vLLM may record a step's statistics after its answers went out.
``FAKE_VLLM_MODE`` replays vLLM's real failures from ``fixtures/``: ``bad_args`` (the parser's
error, exit 2), ``oom`` (the KV-cache error, exit 1), ``dead`` (HTTP 500 at the first request, then
exit) and ``slow`` (never ready).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
STEPS, PER_POS = 16, (15, 14, 13)
RECORD_DELAY_S = 0.3


def aux_ids(draft: str) -> list[int] | None:
    cfg = json.loads((Path(draft) / "config.json").read_text())
    return cfg.get("eagle_aux_hidden_state_layer_ids") or (cfg.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids"
    )


class State:
    def __init__(self, model: str, spec: dict | None):
        self.model, self.spec = model, spec
        self.lock = threading.Lock()
        self.drafts = self.accepted = self.finished = 0
        self.per_pos = [0, 0, 0]

    def record(self) -> None:
        with self.lock:
            self.finished += 1
            if self.spec:
                self.drafts += STEPS
                self.accepted += sum(PER_POS)
                self.per_pos = [a + b for a, b in zip(self.per_pos, PER_POS, strict=True)]

    def metrics(self) -> str:
        labels = f'engine="0",model_name="{self.model}"'
        with self.lock:
            lines = [
                f'vllm:request_success_total{{{labels},finished_reason="length"}} '
                f"{float(self.finished)}"
            ]
            if self.spec:
                lines += [
                    f"vllm:spec_decode_num_drafts_total{{{labels}}} {float(self.drafts)}",
                    f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {float(self.drafts * 3)}",
                    f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} "
                    f"{float(self.accepted)}",
                ]
                lines += [
                    "vllm:spec_decode_num_accepted_tokens_per_pos_total"
                    f'{{{labels},position="{k}"}} {float(v)}'
                    for k, v in enumerate(self.per_pos)
                ]
        return (
            "# HELP vllm:request_success_total Count of successfully processed requests.\n"
            + "\n".join(lines)
            + "\n"
        )


def main() -> int:
    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    parser = argparse.ArgumentParser(prog="api_server.py")
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--speculative-config", type=json.loads, default=None)
    args, _ = parser.parse_known_args()
    print(
        f"(APIServer pid={os.getpid()}) INFO 12-01 00:00:00 [api_utils.py:347] version 0.32.0 "
        "(fake)",
        flush=True,
    )
    if mode == "bad_args":
        sys.stdout.write((FIXTURES / "bad-arguments-parse.log").read_text())
        return 2
    if mode == "oom":
        sys.stdout.write((FIXTURES / "oom-kv-cache-space.log").read_text())
        return 1
    if mode == "slow":
        time.sleep(3600)
    spec = args.speculative_config
    if spec:
        ids = aux_ids(spec["model"])
        print(
            f"(EngineCore pid={os.getpid()}) INFO 12-01 00:00:01 [gpu_model_runner.py:5243] Using "
            f"auxiliary layers from speculative config: ({', '.join(map(str, ids))})",
            flush=True,
        )
    state = State(args.model, spec)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:  # quiet
            pass

        def _send(self, code: int, body: str, ctype: str = "application/json") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, "")
            elif self.path == "/v1/models":
                self._send(
                    200,
                    json.dumps(
                        {"object": "list", "data": [{"id": state.model, "max_model_len": 512}]}
                    ),
                )
            elif self.path == "/version":
                self._send(200, json.dumps({"version": "0.32.0"}))
            elif self.path == "/metrics":
                self._send(200, state.metrics(), "text/plain")
            else:
                self._send(404, "{}")

        def do_POST(self) -> None:
            # vLLM's dev API: served only with VLLM_SERVER_DEV_MODE=1
            if self.path == "/reset_prefix_cache":
                if os.environ.get("VLLM_SERVER_DEV_MODE") == "1":
                    print("INFO [api_router.py:38] Resetting prefix cache...", flush=True)
                    self._send(200, json.dumps({"success": True}))
                else:
                    self._send(404, json.dumps({"detail": "Not Found"}))
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if mode == "dead":
                answer = json.loads(
                    (FIXTURES / "engine-dead-first-request.http500.json").read_text()
                )
                self._send(answer["status"], json.dumps(answer["body"]))
                # vLLM's order: the API server answers 500 while the EngineCore's traceback is still
                # being written
                time.sleep(0.3)
                sys.stdout.write((FIXTURES / "engine-dead-first-request.log").read_text())
                sys.stdout.flush()
                threading.Thread(target=lambda: (time.sleep(0.2), os._exit(0)), daemon=True).start()
                return
            n = int(body["max_tokens"])
            self._send(
                200,
                json.dumps(
                    {
                        "id": "cmpl-fake",
                        "object": "text_completion",
                        "model": state.model,
                        "choices": [{"index": 0, "text": "x" * n, "finish_reason": "length"}],
                        "usage": {
                            "prompt_tokens": len(body["prompt"]),
                            "completion_tokens": n,
                            "total_tokens": len(body["prompt"]) + n,
                        },
                    }
                ),
            )
            threading.Timer(RECORD_DELAY_S, state.record).start()

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(
        f"(APIServer pid={os.getpid()}) INFO 12-01 00:00:02 [entry.py:140] Starting vLLM server on "
        f"http://{args.host}:{args.port}",
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
