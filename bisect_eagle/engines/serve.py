"""``bisect-eagle serve``: the part of an SGLang server the ``sglang`` engine uses, over the local decoder.

Launch flags are SGLang's names for what it supports (``--help`` lists them, so the engine's flag probe
works unchanged): ``--model-path``, ``--speculative-algorithm`` (EAGLE3, EAGLE), ``--speculative-draft-model-path``,
``--speculative-num-steps``, ``--speculative-eagle-topk`` (1 only: chain drafts), ``--speculative-num-draft-tokens``,
``--host`` (127.0.0.1), ``--port``, ``--tp-size``/``--tp`` (1 only), ``--device``, ``--dtype``,
``--enable-return-aux-hidden-states``, ``--return-aux-hidden-state-layer-ids``. Like SGLang it reads the
capture ids from the draft directory's ``config.json`` (``eagle_config.eagle_aux_hidden_state_layer_ids``;
when absent it captures SGLang's default layers, with a warning that SGLang does not give), applies
SGLang's ``topk == 1`` rule (``num_draft_tokens = num_steps + 1``, a warning in the log) and reports the
effective values in ``/server_info``.

HTTP (stdlib ``http.server``): ``/health`` and ``/health_generate`` (a one-token generation),
``/server_info`` and ``/get_server_info``, ``/flush_cache`` (400 while requests run; resets the accept-length
counters) and ``/generate`` with SGLang's ``meta_info`` (prompt_tokens, completion_tokens, spec_verify_ct,
spec_accept_length, spec_correct_drafts_histogram, plus the per-step lists ``bisect_eagle_accepted_per_step``
and ``bisect_eagle_drafted_per_step``). ``return_hidden_states: true`` answers with the prompt's concatenated
aux states in ``meta_info.hidden_states`` (list of lists), as SGLang's ``--enable-return-aux-hidden-states``.
The decoder serves one request at a time (``max_running_requests`` = 1), greedily (temperature 0 only).

Why stdlib and not FastAPI/uvicorn: the model call is blocking and serialised anyway, so an event loop
buys nothing; the standard server starts faster, and its shutdown path is explicit: SIGTERM stops
accepting, waits for requests in flight and exits 0. The ready line is SGLang's:
"The server is fired up and ready to roll!".
"""

from __future__ import annotations

import abc
import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bisect_eagle import __version__
from bisect_eagle.errors import BadInput

log = logging.getLogger("bisect_eagle.serve")
READY_LINE = "The server is fired up and ready to roll!"
SAMPLING_KEYS = {"max_new_tokens", "temperature", "ignore_eos"}
SGLANG_DEFAULT_MAX_NEW_TOKENS = 128
SGLANG_DEFAULT_TEMPERATURE = 1.0


def build_parser(prog: str = "bisect-eagle serve") -> argparse.ArgumentParser:
    """SGLang's launch flags, for what this server supports."""
    p = argparse.ArgumentParser(
        prog=prog, allow_abbrev=False,
        description="Serve a Hugging Face target (+ an EAGLE-3 draft) over SGLang's HTTP API, on the local decoder.",
    )
    p.add_argument("--model-path", required=True, help="Target model directory (Hugging Face layout).")
    p.add_argument("--speculative-algorithm", choices=["EAGLE3", "EAGLE"], default=None,
                   help="Speculative decoding algorithm; leave out for plain decoding.")
    p.add_argument("--speculative-draft-model-path", default=None, help="EAGLE-3 draft directory.")
    p.add_argument("--speculative-num-steps", type=int, default=None, help="Draft steps per verify.")
    p.add_argument("--speculative-eagle-topk", type=int, default=None, help="Branching per step (1 only).")
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None,
                   help="Verified tokens per step; topk 1 forces num_steps + 1 (as SGLang).")
    p.add_argument("--host", default="127.0.0.1", help="Address to bind (default 127.0.0.1).")
    p.add_argument("--port", type=int, default=30000, help="Port to bind.")
    p.add_argument("--tp-size", "--tp", dest="tp_size", type=int, default=1, help="Tensor parallel size (1 only).")
    p.add_argument("--device", default="cpu", help="Torch device (cpu, cuda, cuda:1 ...).")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32", help="Model dtype.")
    p.add_argument("--enable-return-aux-hidden-states", action="store_true",
                   help="Allow return_hidden_states in /generate: the prompt's concatenated aux states.")
    p.add_argument("--return-aux-hidden-state-layer-ids", type=int, nargs="+", default=None,
                   help="Aux layers (SGLang ids) to return when no draft is served.")
    p.add_argument("--version", action="version", version=__version__)
    return p


# ---------------------------------------------------------------------------------------------------
# requests and backends


class Rejected(Exception):
    """A request this server refuses (HTTP 400)."""


@dataclass
class GenerateRequest:
    rid: str
    input_ids: list[int] | None
    text: str | None
    max_new_tokens: int
    ignore_eos: bool
    return_hidden_states: bool


def parse_generate(body: Any, counter: int) -> GenerateRequest:
    """Validate a /generate body; what this server cannot do is refused, never approximated."""
    if not isinstance(body, dict):
        raise Rejected("expected a JSON object")
    if body.get("stream"):
        raise Rejected("stream is not supported by bisect-eagle serve")
    ids, text = body.get("input_ids"), body.get("text")
    if (ids is None) == (text is None):
        raise Rejected("give exactly one of input_ids (a list of token ids) or text (a string)")
    if ids is not None and not (isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids)):
        raise Rejected("input_ids must be one non-empty list of integers (batches are not supported)")
    if text is not None and not (isinstance(text, str) and text):
        raise Rejected("text must be one non-empty string (batches are not supported)")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise Rejected(f"sampling_params must be an object, got {sp!r:.80}")
    unknown = set(sp) - SAMPLING_KEYS
    if unknown:
        raise Rejected(f"sampling_params {sorted(unknown)} are not supported; supported: {sorted(SAMPLING_KEYS)}")
    temperature = sp.get("temperature", SGLANG_DEFAULT_TEMPERATURE)
    if not isinstance(temperature, (int, float)) or temperature != 0:
        raise Rejected(f"bisect-eagle serve decodes greedily: send sampling_params.temperature 0 (got {temperature!r})")
    max_new = sp.get("max_new_tokens", SGLANG_DEFAULT_MAX_NEW_TOKENS)
    if not isinstance(max_new, int) or max_new < 1:
        raise Rejected(f"sampling_params.max_new_tokens must be a positive integer, got {max_new!r}")
    return GenerateRequest(str(body.get("rid", f"req-{counter}")), ids, text, max_new, bool(sp.get("ignore_eos")),
                           bool(body.get("return_hidden_states")))


class Backend(abc.ABC):
    """What the HTTP front calls; counts accept length since the last flush and requests in flight."""

    def __init__(self, info: dict[str, Any]):
        self.info = info
        self.exiting = False
        self._lock = threading.Lock()
        self._running = 0
        self._served = 0
        self._tokens = 0
        self._verify = 0
        self._last_tok_s: float | None = None

    @abc.abstractmethod
    def health(self) -> bool:
        """One-token generation, as SGLang's /health_generate."""

    @abc.abstractmethod
    def decode(self, req: GenerateRequest) -> dict[str, Any]:
        """The /generate answer for one request."""

    def generate(self, req: GenerateRequest) -> dict[str, Any]:
        with self._lock:
            self._running += 1
        try:
            start = time.perf_counter()
            out = self.decode(req)
            meta = out["meta_info"]
            with self._lock:
                self._tokens += meta["completion_tokens"]
                self._verify += meta.get("spec_verify_ct", meta["completion_tokens"])
                self._last_tok_s = meta["completion_tokens"] / max(time.perf_counter() - start, 1e-9)
            return out
        finally:
            with self._lock:
                self._running -= 1

    def next_id(self) -> int:
        with self._lock:
            self._served += 1
            return self._served

    def flush_cache(self) -> bool:
        """Reset the counters; refused (False) while requests run, as SGLang."""
        with self._lock:
            if self._running:
                return False
            self._tokens = self._verify = 0
            return True

    def server_info(self) -> dict[str, Any]:
        state: dict[str, Any] = {"last_gen_throughput": self._last_tok_s}
        if self._verify and self.info.get("speculative_algorithm"):
            state["avg_spec_accept_length"] = self._tokens / self._verify
        return {**self.info, "internal_states": [state], "version": __version__}


class DecoderBackend(Backend):
    """The local engine's :class:`SpeculativeDecoder` behind the SGLang API."""

    def __init__(self, decoder, tokenizer, info: dict[str, Any], return_aux: bool):
        super().__init__(info)
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.return_aux = return_aux
        self._model_lock = threading.Lock()

    def health(self) -> bool:
        with self._model_lock:
            self.decoder.generate([0], 1, None)
        return True

    def decode(self, req: GenerateRequest) -> dict[str, Any]:
        if req.return_hidden_states and not self.return_aux:
            raise Rejected("return_hidden_states needs the server started with --enable-return-aux-hidden-states")
        ids = req.input_ids if req.input_ids is not None else list(self.tokenizer(req.text).input_ids)
        eos = None if req.ignore_eos else self.tokenizer.eos_token_id
        start = time.perf_counter()
        with self._model_lock:
            g = self.decoder.generate(ids, req.max_new_tokens, eos)
            hidden = self.decoder.aux_hidden_states(ids).float().tolist() if req.return_hidden_states else None
        meta: dict[str, Any] = {
            "id": req.rid,
            "prompt_tokens": len(ids),
            "completion_tokens": len(g.tokens),
            "finish_reason": ({"type": "stop", "matched": eos} if g.finished_by_eos
                              else {"type": "length", "length": len(g.tokens)}),
            "e2e_latency": time.perf_counter() - start,
        }
        if self.info.get("speculative_algorithm"):
            counts = Counter(a - 1 for a in g.accepted_per_step)
            meta.update({
                "spec_verify_ct": g.verify_steps,
                "spec_accept_length": len(g.tokens) / g.verify_steps if g.verify_steps else 0.0,
                "spec_correct_drafts_histogram": [counts.get(k, 0) for k in range(max(counts, default=0) + 1)],
                "bisect_eagle_accepted_per_step": g.accepted_per_step,
                "bisect_eagle_drafted_per_step": g.drafted_per_step,
            })
        if hidden is not None:
            meta["hidden_states"] = hidden
        return {"text": self.tokenizer.decode(g.tokens), "output_ids": g.tokens, "meta_info": meta}


# ---------------------------------------------------------------------------------------------------
# HTTP front


class _Handler(BaseHTTPRequestHandler):
    server: ServeHTTPServer  # HTTP/1.0: one request per connection, so no idle connection delays shutdown

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: Any) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
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
        try:
            if path in ("/health", "/health_generate") and method == "GET":
                ok = not backend.exiting and backend.health()
                self._send(200 if ok else 503, "")
            elif path in ("/server_info", "/get_server_info") and method == "GET":
                self._send(200, backend.server_info())
            elif path == "/flush_cache" and method in ("GET", "POST"):
                ok = backend.flush_cache()
                self._send(200 if ok else 400, "Cache flushed.\n" if ok else "Requests are running; not flushed.\n")
            elif path == "/generate" and method in ("POST", "PUT"):
                if backend.exiting:
                    self._send(503, {"error": {"message": "the server is shutting down"}})
                    return
                req = parse_generate(self._body(), backend.next_id())
                self._send(200, backend.generate(req))
            else:
                self._send(404, {"error": {"message": f"{method} {path} is not served by bisect-eagle serve"}})
        except Rejected as e:
            self._send(400, {"error": {"message": str(e)}})
        except (BadInput, RuntimeError, ValueError) as e:
            log.exception("request failed")
            self._send(500, {"error": {"message": f"{type(e).__name__}: {e}"}})


class ServeHTTPServer(ThreadingHTTPServer):
    """Threads per connection; closing waits for requests in flight (graceful shutdown)."""

    daemon_threads = False
    block_on_close = True

    def __init__(self, address: tuple[str, int], backend: Backend):
        super().__init__(address, _Handler)
        self.backend = backend


def serve_until_signal(httpd: ServeHTTPServer) -> None:
    """Serve until SIGTERM or SIGINT, then stop accepting, finish requests in flight and return."""

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s, shutting down gracefully", signal.Signals(signum).name)
        httpd.backend.exiting = True
        threading.Thread(target=httpd.shutdown, daemon=True).start()  # shutdown() blocks; not from this thread

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(READY_LINE)
    httpd.serve_forever(poll_interval=0.1)
    httpd.server_close()
    log.info("shutdown complete")


# ---------------------------------------------------------------------------------------------------
# startup


def draft_layer_ids(draft_dir: Path, num_layers: int) -> tuple[list[int], str | None]:
    """Capture ids as SGLang reads them (nested ``eagle_config`` only); (ids, a warning when defaulted)."""
    from bisect_eagle import layers
    from bisect_eagle.draft import read_draft_config

    cf = read_draft_config(draft_dir)
    if cf.nested_ids:
        return list(cf.nested_ids), None
    default = layers.CONVENTIONS["sglang"].defaults(num_layers)
    return default, (f"{cf.path}: no eagle_config.eagle_aux_hidden_state_layer_ids; capturing SGLang's default "
                     f"layers {default} (SGLang does this without a warning)")


def check_args(parser: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """What argparse cannot check; errors exit like argparse (code 2, usage line)."""
    if a.tp_size != 1:
        parser.error(f"argument --tp-size: bisect-eagle serve runs on one device; got {a.tp_size}")
    if a.enable_return_aux_hidden_states and not (a.speculative_algorithm or a.return_aux_hidden_state_layer_ids):
        parser.error("--enable-return-aux-hidden-states needs a draft or --return-aux-hidden-state-layer-ids")
    if a.speculative_algorithm is None:
        given = [f for f in ("speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
                             "speculative_num_draft_tokens") if getattr(a, f) is not None]
        if given:
            parser.error(f"--{given[0].replace('_', '-')} needs --speculative-algorithm")
        return
    if a.speculative_draft_model_path is None:
        parser.error("--speculative-algorithm needs --speculative-draft-model-path")
    if a.speculative_num_steps is None or a.speculative_eagle_topk is None:
        parser.error("--speculative-num-steps and --speculative-eagle-topk are required (no automatic choice here)")
    if a.speculative_eagle_topk != 1:
        parser.error(f"argument --speculative-eagle-topk: only 1 is supported (chain drafts); got "
                     f"{a.speculative_eagle_topk}")


def build_backend(a: argparse.Namespace) -> DecoderBackend:
    """Load the target (and draft) and wrap the decoder; raises BadInput for unusable inputs."""

    from bisect_eagle import layers
    from bisect_eagle.draft import load_draft
    from bisect_eagle.engines.local import DTYPES, SpeculativeDecoder
    from bisect_eagle.settings import LiveSettings, apply_speculative_rules
    from bisect_eagle.target import decoder_layers, load_target

    model, tokenizer = load_target(a.model_path, device=a.device, dtype=DTYPES[a.dtype])
    n = len(decoder_layers(model))
    info: dict[str, Any] = {
        "model_path": a.model_path, "tokenizer_path": a.model_path, "host": a.host, "port": a.port,
        "tp_size": 1, "dp_size": 1, "device": a.device, "dtype": a.dtype, "max_running_requests": 1,
        "speculative_algorithm": a.speculative_algorithm, "speculative_draft_model_path": None,
        "speculative_num_steps": None, "speculative_eagle_topk": None, "speculative_num_draft_tokens": None,
        "eagle_aux_hidden_state_layer_ids": None, "aux_hidden_state_indices": None,
        "enable_return_aux_hidden_states": a.enable_return_aux_hidden_states,
    }
    draft, ids = None, a.return_aux_hidden_state_layer_ids
    if a.speculative_algorithm is not None:
        draft_dir = Path(a.speculative_draft_model_path)
        ids, warning = draft_layer_ids(draft_dir, n)
        if warning:
            log.warning(warning)
        draft = load_draft(draft_dir, target=a.model_path, device=a.device)
        draft.model.to(DTYPES[a.dtype])
        requested = LiveSettings(speculative_algorithm=a.speculative_algorithm, num_steps=a.speculative_num_steps,
                                 topk=a.speculative_eagle_topk, num_draft_tokens=a.speculative_num_draft_tokens)
        effective, notes = apply_speculative_rules(requested)
        for note in notes:
            log.warning(note)
        info.update(speculative_draft_model_path=str(draft_dir), speculative_num_steps=effective.num_steps,
                    speculative_eagle_topk=effective.topk, speculative_num_draft_tokens=effective.num_draft_tokens)
    decoder = SpeculativeDecoder(model, draft, ids, a.speculative_num_steps or 0, a.device,
                                 a.speculative_algorithm or "EAGLE3")
    if decoder.layer_ids is not None:
        info["eagle_aux_hidden_state_layer_ids"] = decoder.layer_ids
        info["aux_hidden_state_indices"] = decoder.indices
        log.info("capturing aux hidden states of SGLang layer ids %s (hidden_states indices %s, %d-layer target)",
                 decoder.layer_ids, layers.ids_to_canonical(decoder.layer_ids, "sglang", n), n)
    return DecoderBackend(decoder, tokenizer, info, a.enable_return_aux_hidden_states)


def main(argv: list[str] | None = None) -> int:
    """Parse SGLang-style flags, load, serve until SIGTERM; 0 on a clean shutdown, 1 when startup fails."""
    parser = build_parser()
    a = parser.parse_args(argv)
    check_args(parser, a)
    logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="[%(asctime)s] %(levelname)s %(message)s",
                        force=True)
    log.info("bisect-eagle serve %s: %s", __version__, " ".join(sys.argv))
    try:
        backend = build_backend(a)
        httpd = ServeHTTPServer((a.host, a.port), backend)
    except (BadInput, OSError) as e:
        log.error("error: %s", e)
        return 1
    serve_until_signal(httpd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
