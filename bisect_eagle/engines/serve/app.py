"""The stand-in's launch: SGLang 0.5.23's flags (for what it supports), their checks, loading,
serving."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bisect_eagle import __version__
from bisect_eagle.engines.serve.api import DecoderBackend
from bisect_eagle.engines.serve.front import ServeHTTPServer, serve_until_signal
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.spec.settings import TORCH_DTYPE_NAMES

log = logging.getLogger("bisect_eagle.serve")
DTYPE_NAMES = TORCH_DTYPE_NAMES  # SGLang's --dtype names → the torch dtype this server runs in
ALGORITHMS = {"EAGLE3": "EAGLE3", "EAGLE": "EAGLE", "NEXTN": "EAGLE"}
# SGLang 0.5.23's choice when num_steps is unset; others (3, 1, 4)
AUTO_CHAIN = {"LlamaForCausalLM": (5, 4, 8)}
# NCCL_PROTO=LL: the wait added to every target forward (the cost-side fault, package docstring)
LL_DELAY_S = 0.05
SIMULATE_LEN, SIMULATE_METHOD, SIMULATE_TOKEN_MODE = (
    "SGLANG_SIMULATE_ACC_LEN",
    "SGLANG_SIMULATE_ACC_METHOD",
    "SGLANG_SIMULATE_ACC_TOKEN_MODE",
)


def build_parser(prog: str = "bisect-eagle serve") -> argparse.ArgumentParser:
    """SGLang's launch flags, for what this server supports."""
    p = argparse.ArgumentParser(
        prog=prog,
        allow_abbrev=False,
        description="Serve a Hugging Face target (+ an EAGLE-3 draft) over SGLang's HTTP API, on "
        "the local decoder.",
    )
    p.add_argument(
        "--model-path", required=True, help="Target model directory (Hugging Face layout)."
    )
    p.add_argument(
        "--speculative-algorithm",
        type=str.upper,
        default=None,
        help="Speculative decoding algorithm (any case; NEXTN = EAGLE); leave out for plain "
        "decoding.",
    )
    p.add_argument(
        "--speculative-draft-model-path",
        default=None,
        metavar="PATH",
        help="EAGLE-3 draft directory.",
    )
    p.add_argument(
        "--speculative-num-steps",
        type=int,
        default=None,
        metavar="N",
        help="Draft steps per verify.",
    )
    p.add_argument(
        "--speculative-eagle-topk",
        type=int,
        default=None,
        metavar="K",
        help="Branching per step (1 only).",
    )
    p.add_argument(
        "--speculative-num-draft-tokens",
        type=int,
        default=None,
        metavar="N",
        help="Verified tokens per step; topk 1 forces num_steps + 1 (as SGLang).",
    )
    p.add_argument("--host", default="127.0.0.1", help="Address to bind (default 127.0.0.1).")
    p.add_argument("--port", type=int, default=30000, help="Port to bind.")
    p.add_argument(
        "--tp-size",
        "--tensor-parallel-size",
        dest="tp_size",
        type=int,
        default=1,
        help="Tensor parallel size (1 only).",
    )
    p.add_argument("--device", default="cpu", help="Torch device (cpu, cuda, cuda:1 ...).")
    p.add_argument(
        "--dtype",
        choices=sorted(DTYPE_NAMES),
        default="auto",
        help="Model dtype (auto: float32 here).",
    )
    p.add_argument(
        "--enable-return-aux-hidden-states",
        action="store_true",
        help="Allow return_hidden_states in /generate: the prompt's concatenated aux states.",
    )
    p.add_argument(
        "--return-aux-hidden-state-layer-ids",
        type=int,
        nargs="+",
        default=None,
        metavar="ID",
        help="Aux layers (SGLang ids, >= 0) to capture and return; capture-only, no draft.",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="Require 'Authorization: Bearer KEY' (health checks excepted).",
    )
    p.add_argument("--version", action="version", version=__version__)
    return p


def draft_layer_ids(draft_dir: Path, num_layers: int) -> tuple[list[int], str | None]:
    """Capture ids as SGLang reads them (nested ``eagle_config`` only); (ids, a warning when
    defaulted)."""
    from bisect_eagle.artifacts import layers
    from bisect_eagle.artifacts.draft import read_draft_config

    cf = read_draft_config(draft_dir)
    if cf.nested_ids:
        return list(cf.nested_ids), None
    default = layers.CONVENTIONS["sglang"].defaults(num_layers)
    return default, (
        f"{cf.path}: no eagle_config.{IDS_KEY}; capturing SGLang's default layers {default} "
        "(SGLang does this without a warning)"
    )


def check_args(parser: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """What argparse cannot check, with SGLang 0.5.23's rules; errors exit like argparse (code 2,
    usage line)."""
    if a.tp_size != 1:
        parser.error(f"argument --tp-size: bisect-eagle serve runs on one device; got {a.tp_size}")
    if a.enable_return_aux_hidden_states:
        _check_capture_only(parser, a)
        return
    if a.return_aux_hidden_state_layer_ids is not None:
        parser.error(
            "--return-aux-hidden-state-layer-ids requires --enable-return-aux-hidden-states"
        )
    if a.speculative_algorithm is None:
        given = [
            f
            for f in (
                "speculative_draft_model_path",
                "speculative_num_steps",
                "speculative_eagle_topk",
                "speculative_num_draft_tokens",
            )
            if getattr(a, f) is not None
        ]
        if given:
            parser.error(f"--{given[0].replace('_', '-')} needs --speculative-algorithm")
        return
    if a.speculative_algorithm not in ALGORITHMS:
        parser.error(
            f"argument --speculative-algorithm: {a.speculative_algorithm!r} is not served here; "
            f"choose from {sorted(ALGORITHMS)}"
        )
    a.speculative_algorithm = ALGORITHMS[a.speculative_algorithm]
    if a.speculative_draft_model_path is None:
        parser.error("--speculative-algorithm needs --speculative-draft-model-path")
    if a.speculative_num_steps is None:
        arch = _architecture(a.model_path)
        steps, topk, ndt = AUTO_CHAIN.get(arch, (3, 1, 4))
        log.info(
            "speculative settings chosen automatically for %s: num_steps %d, topk %d, draft tokens "
            "%d",
            arch,
            steps,
            topk,
            ndt,
        )
        a.speculative_num_steps = steps
        a.speculative_eagle_topk = a.speculative_eagle_topk or topk
        a.speculative_num_draft_tokens = a.speculative_num_draft_tokens or ndt
    if a.speculative_eagle_topk is None:
        a.speculative_eagle_topk = 1
    if a.speculative_eagle_topk != 1:
        parser.error(
            "argument --speculative-eagle-topk: only 1 is supported (chain drafts); got "
            f"{a.speculative_eagle_topk}"
        )


def _check_capture_only(parser: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """0.5.23's capture-only mode: EAGLE3 names the convention, no draft, ids >= 0 and distinct."""
    if (a.speculative_algorithm or "") != "EAGLE3":
        parser.error(
            "--enable-return-aux-hidden-states needs --speculative-algorithm EAGLE3 to name the "
            f"capture convention, got {a.speculative_algorithm!r}"
        )
    if a.speculative_draft_model_path is not None:
        parser.error(
            "--enable-return-aux-hidden-states captures without a draft; drop "
            "--speculative-draft-model-path"
        )
    ids = a.return_aux_hidden_state_layer_ids
    if ids is not None and any(i < 0 for i in ids):
        parser.error(f"--return-aux-hidden-state-layer-ids must be non-negative, got {ids}")
    if ids is not None and len(set(ids)) != len(ids):
        parser.error(f"--return-aux-hidden-state-layer-ids must not repeat a layer, got {ids}")


def _architecture(model_path: str) -> str:
    import json

    try:
        archs = json.loads((Path(model_path) / "config.json").read_text()).get("architectures") or [
            ""
        ]
    except (OSError, ValueError):
        return ""
    return str(archs[0])


def simulation(
    environ: Mapping[str, str], num_steps: int | None
) -> tuple[list[float] | None, float]:
    """(the pinned acceptance profile or None, the per-forward delay) the environment asks of this
    server.

    Args:
        environ: the server's environment.
        num_steps: draft steps per verify (None: no speculative decoding, where SGLang simulates
            nothing).

    Raises:
        BadInput: a simulation SGLang would refuse, or one the stand-in does not serve (package
            docstring).
    """
    from bisect_eagle.spec.settings import profile_for_accept_length

    delay = LL_DELAY_S if environ.get("NCCL_PROTO", "").strip() == "LL" else 0.0
    raw = environ.get(SIMULATE_LEN, "").strip()
    if not raw:
        return None, delay
    try:
        length = float(raw)
    except ValueError:
        raise BadInput(
            f"env {SIMULATE_LEN}={raw!r}: expected a number (the mean accept length)"
        ) from None
    if length <= 0 or not num_steps:  # SGLang: turned off when < 0; only a verify step simulates
        return None, delay
    method = environ.get(SIMULATE_METHOD, "match-expected")
    if method != "match-expected":
        raise BadInput(
            f"env {SIMULATE_METHOD}={method!r}: bisect-eagle serve simulates 'match-expected' only "
            "(SGLang 0.5.23 also has 'multinomial', a clamped normal draw)"
        )
    mode = environ.get(SIMULATE_TOKEN_MODE, "fixed")
    if mode != "real-draft-token":
        raise BadInput(
            f"env {SIMULATE_TOKEN_MODE}={mode!r}: bisect-eagle serve simulates 'real-draft-token' "
            f"only (set it with {SIMULATE_LEN}; SGLang's default 'fixed' emits token id 100 for "
            "every token)"
        )
    return profile_for_accept_length(max(1.0, min(num_steps + 1.0, length)), num_steps), delay


def build_backend(
    a: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> DecoderBackend:
    """Load the target (and draft) and wrap the decoder, with the simulation ``environ`` (default
    ``os.environ``) asks for (:func:`simulation`); raises BadInput for unusable inputs."""

    from bisect_eagle.artifacts import layers
    from bisect_eagle.artifacts.draft import load_draft
    from bisect_eagle.artifacts.target import decoder_layers, load_target
    from bisect_eagle.engines.local import DTYPES, SpeculativeDecoder
    from bisect_eagle.engines.sglang.rules import apply_speculative_rules
    from bisect_eagle.spec.settings import LiveSettings

    dtype = DTYPE_NAMES[a.dtype]
    model, tokenizer = load_target(a.model_path, device=a.device, dtype=DTYPES[dtype])
    n = len(decoder_layers(model))
    info: dict[str, Any] = {
        "model_path": a.model_path,
        "tokenizer_path": a.model_path,
        "host": a.host,
        "port": a.port,
        "tp_size": 1,
        "dp_size": 1,
        "device": a.device,
        "dtype": a.dtype,
        "max_running_requests": 1,
        "speculative_algorithm": a.speculative_algorithm,
        "speculative_draft_model_path": None,
        "speculative_num_steps": None,
        "speculative_eagle_topk": None,
        "speculative_num_draft_tokens": None,
        IDS_KEY: None,
        "aux_hidden_state_indices": None,
        "enable_return_aux_hidden_states": a.enable_return_aux_hidden_states,
    }
    draft, ids = None, a.return_aux_hidden_state_layer_ids
    if a.enable_return_aux_hidden_states:  # capture-only: the algorithm only named the convention
        info["speculative_algorithm"] = None
        if ids is None:
            ids = layers.CONVENTIONS["sglang"].defaults(n)
    elif a.speculative_algorithm is not None:
        draft_dir = Path(a.speculative_draft_model_path)
        ids, warning = draft_layer_ids(draft_dir, n)
        if warning:
            log.warning(warning)
        draft = load_draft(draft_dir, target=a.model_path, device=a.device)
        draft.model.to(DTYPES[dtype])
        requested = LiveSettings(
            speculative_algorithm=a.speculative_algorithm,
            num_steps=a.speculative_num_steps,
            topk=a.speculative_eagle_topk,
            num_draft_tokens=a.speculative_num_draft_tokens,
        )
        effective, notes = apply_speculative_rules(requested)
        for note in notes:
            log.warning(note)
        info.update(
            speculative_draft_model_path=str(draft_dir),
            speculative_num_steps=effective.num_steps,
            speculative_eagle_topk=effective.topk,
            speculative_num_draft_tokens=effective.num_draft_tokens,
        )
    rates, delay = simulation(
        os.environ if environ is None else environ,
        a.speculative_num_steps if draft is not None else None,
    )
    if rates is not None:
        log.info(
            "acceptance pinned (%s): unconditional rates %s per draft position, accept length %.3g",
            SIMULATE_LEN,
            rates,
            1 + sum(rates),
        )
    if delay:
        log.info(
            "NCCL_PROTO=LL: every target forward waits %g s (the stand-in's cost-side fault)", delay
        )
    info.update(bisect_eagle_pinned_acceptance=rates, bisect_eagle_cycle_delay_s=delay)
    decoder = SpeculativeDecoder(
        model,
        draft,
        ids,
        a.speculative_num_steps or 0,
        a.device,
        info["speculative_algorithm"] or "EAGLE3",
        cycle_delay_s=delay,
    )
    if decoder.layer_ids is not None:
        info[IDS_KEY] = decoder.layer_ids
        info["aux_hidden_state_indices"] = decoder.indices
        log.info(
            "capturing aux hidden states of SGLang layer ids %s (hidden_states indices %s, "
            "%d-layer target)",
            decoder.layer_ids,
            layers.ids_to_canonical(decoder.layer_ids, "sglang", num_layers=n),
            n,
        )
    return DecoderBackend(decoder, tokenizer, info, a.enable_return_aux_hidden_states, pinned=rates)


def main(argv: list[str] | None = None) -> int:
    """Parse SGLang-style flags, load, serve until SIGTERM; 0 on a clean shutdown, 1 when startup
    fails.

    Args:
        argv: the flags; None parses ``sys.argv[1:]``.

    Returns:
        The exit code: 0 after a clean shutdown, 1 when the backend or the socket cannot start (bad
        flags exit 2 from the parser).
    """
    parser = build_parser()
    a = parser.parse_args(argv)
    check_args(parser, a)
    logging.basicConfig(
        stream=sys.stdout,
        level=logging.INFO,
        format="[%(asctime)s] %(levelname)s %(message)s",
        force=True,
    )
    log.info("bisect-eagle serve %s: %s", __version__, " ".join(sys.argv))
    try:
        backend = build_backend(a)
        httpd = ServeHTTPServer((a.host, a.port), backend, api_key=a.api_key)
    except (BadInput, OSError) as e:
        log.error("error: %s", e)
        return 1
    serve_until_signal(httpd)
    return 0
