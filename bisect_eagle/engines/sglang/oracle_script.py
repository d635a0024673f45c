"""Runs inside SGLang's own interpreter and answers with SGLang's own parser and settings resolution.

Started once per engine as ``<sglang python> oracle_script.py PARSER`` and kept alive: each line on stdin is
a JSON request, each answer one JSON line on stdout. It imports nothing from bisect-eagle (SGLang usually
lives in an environment of its own). ``PARSER`` is ``sglang`` (``sglang.srt.server_args``) or
``module:function`` returning an ``argparse.ArgumentParser`` (the stand-in ``bisect-eagle serve``).

Requests:

- ``{"op": "describe"}`` → the parser's prog, SGLang's version, and every option: flags, dest, default,
  choices, whether it takes a value, whether it is a ``--x/--no-x`` flag.
- ``{"op": "resolve", "argv": [...], "resolve": bool}`` → the argv parsed by SGLang's parser (its exact
  error on failure, as SGLang would print it) and, with ``resolve`` and real SGLang, ``ServerArgs`` built and
  resolved (``resolve_once``) with the resolved values of the speculative, attention, paging and scheduling
  fields, or the exception SGLang raised. When ``--speculative-adaptive`` was given and resolution turned it
  off (SGLang only logs a warning), ``resolved`` also carries SGLang's reason as ``ADAPTIVE_OFF``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import logging
import sys
import traceback

RESOLVED_FIELDS = (
    "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
    "speculative_adaptive", "attention_backend", "speculative_draft_attention_backend", "page_size",
    "max_running_requests", "cuda_graph_max_bs_decode", "disable_custom_all_reduce", "enable_nccl_nvls",
    "enable_symm_mem", "dtype", "device", "tp_size", "mem_fraction_static", "disable_overlap_schedule",
)
ADAPTIVE_OFF = "speculative_adaptive_off_reason"


class ParserError(Exception):
    """argparse's error, with the message exactly as the parser prints it."""


def _parser(spec: str) -> argparse.ArgumentParser:
    if spec == "sglang":
        from sglang.srt.server_args import ServerArgs

        parser = argparse.ArgumentParser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
        return parser
    module, _, func = spec.partition(":")
    return getattr(importlib.import_module(module), func)()


def _version(spec: str) -> str | None:
    if spec != "sglang":
        return None
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        return None


def _plain(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def describe(parser: argparse.ArgumentParser, spec: str) -> dict:
    options = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        options.append({
            "flags": list(action.option_strings),
            "dest": action.dest,
            "default": _plain(action.default),
            "choices": None if action.choices is None else [_plain(c) for c in action.choices],
            "takes_value": action.nargs != 0,
            "boolean_optional": isinstance(action, argparse.BooleanOptionalAction),
        })
    return {"ok": True, "prog": parser.prog, "version": _version(spec), "options": options}


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    def fail(message: str) -> None:
        raise ParserError(f"{parser.prog}: error: {message}")

    parser.error = fail  # type: ignore[method-assign]  # argparse would print and exit
    return parser.parse_args(argv)


def resolve(parser: argparse.ArgumentParser, spec: str, argv: list[str], want_resolution: bool) -> dict:
    try:
        ns = parse(parser, argv)
    except ParserError as e:
        return {"ok": False, "stage": "parse", "error": str(e)}
    out: dict = {"ok": True, "parsed": {k: _plain(v) for k, v in vars(ns).items()}, "resolved": None}
    if spec != "sglang" or not want_resolution:
        return out
    from sglang.srt.server_args import ServerArgs

    logging.disable(logging.CRITICAL)
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            args = ServerArgs.from_cli_args(ns)
            args.resolve_once()
            resolved = args.resolved_dict()
    except Exception as e:  # SGLang's own refusal: its exception, as it would end the server
        frames = traceback.extract_tb(e.__traceback__)
        where = next((f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in reversed(frames)
                      if "sglang" in f.filename), "")
        return {"ok": False, "stage": "resolve", "error": f"{type(e).__name__}: {e}", "where": where}
    out["resolved"] = {k: _plain(resolved.get(k)) for k in RESOLVED_FIELDS if k in resolved}
    if getattr(ns, "speculative_adaptive", False) and not resolved.get("speculative_adaptive"):
        out["resolved"][ADAPTIVE_OFF] = _adaptive_off_reason(args)
    return out


def _adaptive_off_reason(args) -> str | None:
    """Why SGLang's resolution turned ``--speculative-adaptive`` off (its own check, asked again)."""
    try:
        from sglang.srt.speculative.adaptive_spec_params import adaptive_unsupported_reason

        return adaptive_unsupported_reason(args)
    except Exception:  # a release without the check: the plan says adaptive is off without SGLang's reason
        return None


def main() -> int:
    spec = sys.argv[1] if len(sys.argv) > 1 else "sglang"
    try:
        parser = _parser(spec)
    except Exception as e:
        print(json.dumps({"ok": False, "stage": "import", "error": f"{type(e).__name__}: {e}"}), flush=True)
        return 0
    print(json.dumps({"ok": True, "ready": True}), flush=True)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            if req.get("op") == "describe":
                answer = describe(parser, spec)
            else:
                answer = resolve(_parser(spec), spec, list(req["argv"]), bool(req.get("resolve", True)))
        except Exception as e:  # the oracle never dies on one request
            answer = {"ok": False, "stage": "oracle", "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
