"""``bisect-eagle serve``: the part of an SGLang server the ``sglang`` engine uses, over the local
decoder.

Launch flags are SGLang 0.5.23's names for what it supports, with SGLang's behaviour where the
engine relies on it (``docs/sglang-facts.md#argument-parser``): ``--model-path``,
``--speculative-algorithm`` (any case; NEXTN is EAGLE; EAGLE3 and EAGLE served),
``--speculative-draft-model-path``, ``--speculative-num-steps``, ``--speculative-eagle-topk`` (1
only: chain drafts), ``--speculative-num-draft-tokens`` (all three chosen as SGLang does when left
out), ``--host`` (127.0.0.1), ``--port``, ``--tp-size``/``--tensor-parallel-size`` (1 only),
``--device``, ``--dtype`` (auto, half, float, float16, bfloat16, float32; auto is float32 here),
``--enable-return-aux-hidden-states`` with ``--return-aux-hidden-state-layer-ids`` (capture-only, as
0.5.23: ``--speculative-algorithm EAGLE3`` names the convention, no draft, ids ≥ 0). Like SGLang it
reads the capture ids from the draft directory's ``config.json``
(``eagle_config.eagle_aux_hidden_state_layer_ids``; when absent it captures SGLang's default layers,
with a warning that SGLang does not give), applies SGLang's ``topk == 1`` rule (``num_draft_tokens =
num_steps + 1``, a warning in the log) and reports the effective values in ``/server_info``.

HTTP (stdlib ``http.server``): ``/health`` and ``/health_generate`` (a one-token generation),
``/server_info`` and ``/get_server_info``, ``/flush_cache`` (400 while requests run; resets the
accept-length counters) and ``/generate`` with SGLang's ``meta_info`` (prompt_tokens,
completion_tokens, spec_verify_ct, spec_accept_length, spec_correct_drafts_histogram, plus the
per-step lists ``bisect_eagle_accepted_per_step`` and ``bisect_eagle_drafted_per_step``).
``return_hidden_states: true`` answers with the prompt's concatenated aux states in
``meta_info.hidden_states`` (list of lists), as SGLang's ``--enable-return-aux-hidden-states``. The
decoder serves one request at a time (``max_running_requests`` = 1), greedily (temperature 0 only).

Environment the stand-in reads (the server inherits the trial's ``env``):

- **Pinned acceptance, SGLang's way**: ``SGLANG_SIMULATE_ACC_LEN`` (> 0; SGLang clamps it to ``[1,
  num_steps + 1]`` and so does the stand-in) pins the mean accept length, drawn per verify step as
  SGLang's ``match-expected`` method does (the floor or the ceiling of the length: the
  minimum-variance profile, :func:`~bisect_eagle.spec.settings.profile_for_accept_length`), seeded
  by the request's tokens. ``SGLANG_SIMULATE_ACC_TOKEN_MODE`` must be ``real-draft-token`` (what the
  sglang engine's plan sets): accepted drafts are emitted as the draft proposed them and the bonus
  token is the target's, as in SGLang, because a server cannot know a request's greedy continuation
  before decoding it (the local engine, which decodes it first, keeps the target's tokens instead).
  Every draft and verify forward runs as in a natural round. SGLang's default ``fixed`` mode (token
  id 100 everywhere) and ``SGLANG_SIMULATE_ACC_METHOD=multinomial`` are refused at start-up.
  ``/server_info`` reports ``bisect_eagle_pinned_acceptance`` (the profile, or null).
- **The cost-side fault**: ``NCCL_PROTO=LL`` makes every target forward (prefill, verify step, plain
  decode step) wait :data:`~bisect_eagle.engines.serve.app.LL_DELAY_S` more, inside the model clock,
  without changing a token or an accept length, the way a slow collective protocol would on a
  multi-GPU server (on one device NCCL is not used at all: the delay is the stand-in's documented
  stand-in for it). ``/server_info`` reports ``bisect_eagle_cycle_delay_s``. Tests and tiny
  scenarios use it to hold a culprit on the cost side, next to a wiring fault on the acceptance
  side.

Why stdlib and not FastAPI/uvicorn: the model call is blocking and serialised anyway, so an event
loop buys nothing; the standard server starts faster, and its shutdown path is explicit: SIGTERM
stops accepting, waits for requests in flight and exits 0. The ready line is SGLang's:
"The server is fired up and ready to roll!".
"""

from bisect_eagle.engines.serve.api import (
    Backend,
    DecoderBackend,
    GenerateRequest,
    Rejected,
    parse_generate,
)
from bisect_eagle.engines.serve.app import (
    LL_DELAY_S,
    build_backend,
    build_parser,
    check_args,
    draft_layer_ids,
    main,
    simulation,
)
from bisect_eagle.engines.serve.front import READY_LINE, ServeHTTPServer, serve_until_signal

__all__ = [
    "LL_DELAY_S",
    "READY_LINE",
    "Backend",
    "DecoderBackend",
    "GenerateRequest",
    "Rejected",
    "ServeHTTPServer",
    "build_backend",
    "build_parser",
    "check_args",
    "draft_layer_ids",
    "main",
    "parse_generate",
    "serve_until_signal",
    "simulation",
]
