"""The stand-in's request contract and backends: SGLang's ``/generate`` body and ``meta_info``, over
the decoder."""

from __future__ import annotations

import abc
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from bisect_eagle import __version__

SAMPLING_KEYS = {"max_new_tokens", "temperature", "ignore_eos"}
SGLANG_DEFAULT_MAX_NEW_TOKENS = 128
SGLANG_DEFAULT_TEMPERATURE = 1.0


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
    if ids is not None and not (
        isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids)
    ):
        raise Rejected(
            "input_ids must be one non-empty list of integers (batches are not supported)"
        )
    if text is not None and not (isinstance(text, str) and text):
        raise Rejected("text must be one non-empty string (batches are not supported)")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise Rejected(f"sampling_params must be an object, got {sp!r:.80}")
    unknown = set(sp) - SAMPLING_KEYS
    if unknown:
        raise Rejected(
            f"sampling_params {sorted(unknown)} are not supported; supported: "
            f"{sorted(SAMPLING_KEYS)}"
        )
    temperature = sp.get("temperature", SGLANG_DEFAULT_TEMPERATURE)
    if not isinstance(temperature, (int, float)) or temperature != 0:
        raise Rejected(
            "bisect-eagle serve decodes greedily: send sampling_params.temperature 0 (got "
            f"{temperature!r})"
        )
    max_new = sp.get("max_new_tokens", SGLANG_DEFAULT_MAX_NEW_TOKENS)
    if not isinstance(max_new, int) or max_new < 1:
        raise Rejected(
            f"sampling_params.max_new_tokens must be a positive integer, got {max_new!r}"
        )
    return GenerateRequest(
        str(body.get("rid", f"req-{counter}")),
        ids,
        text,
        max_new,
        bool(sp.get("ignore_eos")),
        bool(body.get("return_hidden_states")),
    )


class Backend(abc.ABC):
    """What the HTTP front calls; counts accept length since the last flush and requests in
    flight."""

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
        """The /generate answer for one request.

        Args:
            req: the parsed request.

        Returns:
            SGLang's answer: ``text``, ``output_ids`` and ``meta_info`` (``completion_tokens``...).
        """

    def generate(self, req: GenerateRequest) -> dict[str, Any]:
        """:meth:`decode` one request, counted in flight and in the accept-length counters.

        Args:
            req: the parsed request.

        Returns:
            :meth:`decode`'s answer, unchanged.
        """
        with self._lock:
            self._running += 1
        try:
            start = time.perf_counter()
            out = self.decode(req)
            meta = out["meta_info"]
            with self._lock:
                self._tokens += meta["completion_tokens"]
                self._verify += meta.get("spec_verify_ct", meta["completion_tokens"])
                self._last_tok_s = meta["completion_tokens"] / max(
                    time.perf_counter() - start, 1e-9
                )
            return out
        finally:
            with self._lock:
                self._running -= 1

    def next_id(self) -> int:
        with self._lock:
            self._served += 1
            return self._served

    def flush_cache(self) -> bool:
        """Reset the counters; refused (False) while requests run, as SGLang.

        Returns:
            True when the counters were reset; False while a request runs.
        """
        with self._lock:
            if self._running:
                return False
            self._tokens = self._verify = 0
            return True

    def server_info(self) -> dict[str, Any]:
        """SGLang's /get_server_info: the settings with the running accept length and speed.

        Returns:
            ``info`` plus ``version`` and one ``internal_states`` entry: ``last_gen_throughput``
            (tokens/s, None before a request) and, when speculative, ``avg_spec_accept_length``
            since the last flush.
        """
        state: dict[str, Any] = {"last_gen_throughput": self._last_tok_s}
        if self._verify and self.info.get("speculative_algorithm"):
            state["avg_spec_accept_length"] = self._tokens / self._verify
        return {**self.info, "internal_states": [state], "version": __version__}


class DecoderBackend(Backend):
    """The local engine's :class:`SpeculativeDecoder` behind the SGLang API."""

    def __init__(
        self,
        decoder,
        tokenizer,
        info: dict[str, Any],
        return_aux: bool,
        pinned: list[float] | None = None,
    ):
        super().__init__(info)
        self.decoder = decoder
        # SGLang's simulated acceptance as a profile (the package docstring), or None
        self.pinned = pinned
        self.tokenizer = tokenizer
        self.return_aux = return_aux
        self._model_lock = threading.Lock()

    def health(self) -> bool:
        with self._model_lock:
            self.decoder.generate([0], max_new_tokens=1, eos_token_id=None)
        return True

    def decode(self, req: GenerateRequest) -> dict[str, Any]:
        """Decode one request with the loaded models, under the model lock.

        Args:
            req: the parsed request (``input_ids`` win over ``text``).

        Returns:
            The answer in SGLang's shape; speculative servers add the ``spec_*`` counts and the
            accepted and drafted tokens per step, ``return_hidden_states`` adds ``hidden_states``.

        Raises:
            Rejected: hidden states asked of a server started without
                ``--enable-return-aux-hidden-states``.
        """
        # torch: loaded with the models, not with the CLI
        from bisect_eagle.engines.local.decoder import Pin

        if req.return_hidden_states and not self.return_aux:
            raise Rejected(
                "return_hidden_states needs the server started with "
                "--enable-return-aux-hidden-states"
            )
        ids = (
            req.input_ids if req.input_ids is not None else list(self.tokenizer(req.text).input_ids)
        )
        eos = None if req.ignore_eos else self.tokenizer.eos_token_id
        start = time.perf_counter()
        with self._model_lock:
            pin = None if self.pinned is None else Pin.seeded(self.pinned, ids)
            g = self.decoder.generate(
                ids, max_new_tokens=req.max_new_tokens, eos_token_id=eos, pin=pin
            )
            hidden = (
                self.decoder.aux_hidden_states(ids).float().tolist()
                if req.return_hidden_states
                else None
            )
        meta: dict[str, Any] = {
            "id": req.rid,
            "prompt_tokens": len(ids),
            "completion_tokens": len(g.tokens),
            "finish_reason": (
                {"type": "stop", "matched": eos}
                if g.finished_by_eos
                else {"type": "length", "length": len(g.tokens)}
            ),
            "e2e_latency": time.perf_counter() - start,
        }
        if self.info.get("speculative_algorithm"):
            counts = Counter(a - 1 for a in g.accepted_per_step)
            meta.update(
                {
                    "spec_verify_ct": g.verify_steps,
                    "spec_accept_length": len(g.tokens) / g.verify_steps if g.verify_steps else 0.0,
                    "spec_correct_drafts_histogram": [
                        counts.get(k, 0) for k in range(max(counts, default=0) + 1)
                    ],
                    "bisect_eagle_accepted_per_step": g.accepted_per_step,
                    "bisect_eagle_drafted_per_step": g.drafted_per_step,
                }
            )
        if hidden is not None:
            meta["hidden_states"] = hidden
        return {"text": self.tokenizer.decode(g.tokens), "output_ids": g.tokens, "meta_info": meta}
