"""Runs inside SGLang's own interpreter and answers with SGLang's own parser and settings
resolution.

Started once per engine as ``<sglang python> oracle_script.py PARSER`` and kept alive: each line on
stdin is a JSON request, each answer one JSON line on stdout. It imports nothing from bisect-eagle
(SGLang usually lives in an environment of its own). ``PARSER`` is ``sglang``
(``sglang.srt.server_args``) or ``module:function`` returning an ``argparse.ArgumentParser`` (the
stand-in ``bisect-eagle serve``).

Requests:

- ``{"op": "describe"}`` → the parser's prog, SGLang's version, and every option: flags, dest,
  default, choices, whether it takes a value, whether it is a ``--x/--no-x`` flag.
- ``{"op": "resolve", "argv": [...], "resolve": bool}`` → the argv parsed by SGLang's parser (its
  exact error on failure, as SGLang would print it) and, with ``resolve`` and real SGLang,
  ``ServerArgs`` built and resolved (``resolve_once``) with the resolved values of the speculative,
  attention, paging and scheduling fields, or the exception SGLang raised. When
  ``--speculative-adaptive`` was given and resolution turned it off (SGLang only logs a warning),
  ``resolved`` also carries SGLang's reason as ``ADAPTIVE_OFF``. Resolution runs only where this
  host has the accelerators the launch needs (``--device cpu``, or at least ``tp_size × pp_size /
  nnodes`` devices of the launch's kind): SGLang picks backends, page sizes and memory from the
  devices it sees, so resolving a node's launch on another host would answer for the wrong machine.
  Where they are missing (or SGLang stops on a missing accelerator), the answer is ``{"ok": true,
  "resolved": null, "unresolved": reason}``: SGLang did not refuse the config; it was not resolved
  here (:data:`NOT_RESOLVED_HERE`).
- ``{"op": "capture", "architecture": A, "config": {...}, "ids": [[...] | null, ...]}`` → which
  hidden states each id list captures on that target, by SGLang's own model class ``A`` (see
  :func:`capture`).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import inspect
import io
import json
import logging
import re
import sys
import textwrap
import traceback
from pathlib import Path
from types import SimpleNamespace

# the scripts' shared stdlib-only helpers, loaded by file path: this interpreter need not have
# bisect_eagle
_COMMON_SPEC = importlib.util.spec_from_file_location(
    "bisect_eagle_oracle_common", Path(__file__).resolve().parents[1] / "oracle_common.py"
)
_common = importlib.util.module_from_spec(_COMMON_SPEC)
_COMMON_SPEC.loader.exec_module(_common)

RESOLVED_FIELDS = (
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_adaptive",
    "attention_backend",
    "speculative_draft_attention_backend",
    "page_size",
    "max_running_requests",
    "cuda_graph_max_bs_decode",
    "disable_custom_all_reduce",
    "enable_nccl_nvls",
    "enable_symm_mem",
    "dtype",
    "device",
    "tp_size",
    "mem_fraction_static",
    "disable_overlap_schedule",
)
ADAPTIVE_OFF = "speculative_adaptive_off_reason"
NO_ACCELERATOR = re.compile(
    r"No accelerator|Found no NVIDIA driver|get_device_capability|Torch not compiled with CUDA"
    r"|CUDA driver|no CUDA GPUs|nvidia-smi",
    re.IGNORECASE,
)
NOT_RESOLVED_HERE = "resolution needs the node's GPUs: not resolved here"
# the kinds SGLang's device auto-detection tries
ACCELERATORS = ("cuda", "xpu", "npu", "hpu", "musa", "mps")


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


_plain = _common.plain


def describe(parser: argparse.ArgumentParser, spec: str) -> dict:
    """The ``describe`` answer: the parser's name, SGLang's version and every option.

    Args:
        parser: the server's parser.
        spec: ``sglang`` or the stand-in's name (which version to report).

    Returns:
        ``{"ok": True, "prog", "version", "options"}``.
    """
    return {
        "ok": True,
        "prog": parser.prog,
        "version": _version(spec),
        "options": _common.parser_options(parser),
    }


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed by ``parser``, a parse error raised instead of printed and exited.

    Args:
        parser: the server's parser (its ``error`` is replaced).
        argv: the arguments after the launch command.

    Returns:
        The parsed namespace.

    Raises:
        ParserError: argparse refused ``argv``.
    """

    def fail(message: str) -> None:
        raise ParserError(f"{parser.prog}: error: {message}")

    parser.error = fail  # type: ignore[method-assign]  # argparse would print and exit
    return parser.parse_args(argv)


def resolve(
    parser: argparse.ArgumentParser, spec: str, argv: list[str], want_resolution: bool
) -> dict:
    """The ``resolve`` answer: ``argv`` parsed and, for SGLang, resolved by its own ``ServerArgs``.

    Args:
        parser: the server's parser.
        spec: ``sglang`` or the stand-in's name (only ``sglang`` resolves).
        argv: the arguments after the launch command.
        want_resolution: whether to resolve after parsing.

    Returns:
        ``ok`` with ``parsed`` and ``resolved`` (None when not resolved; ``unresolved`` says why
        when this host cannot), or ``ok: False`` with ``stage`` (``parse``/``resolve``), ``error``
        and, for SGLang's refusal, ``where``.
    """
    try:
        ns = parse(parser, argv)
    except ParserError as e:
        return {"ok": False, "stage": "parse", "error": str(e)}
    out: dict = {
        "ok": True,
        "parsed": {k: _plain(v) for k, v in vars(ns).items()},
        "resolved": None,
    }
    if spec != "sglang" or not want_resolution:
        return out
    from sglang.srt.server_args import ServerArgs

    missing = missing_devices(ns)
    if missing is not None:
        out["unresolved"] = missing
        return out
    logging.disable(logging.CRITICAL)
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            args = ServerArgs.from_cli_args(ns)
            args.resolve_once()
            resolved = args.resolved_dict()
    except Exception as e:  # SGLang's own refusal: its exception, as it would end the server
        if NO_ACCELERATOR.search(f"{type(e).__name__}: {e}"):  # this host, not the config
            out["unresolved"] = (
                f"{NOT_RESOLVED_HERE}; SGLang stopped on this host: {type(e).__name__}: {e}"
            )
            return out
        frames = traceback.extract_tb(e.__traceback__)
        where = next(
            (
                f"{f.filename.split('site-packages/')[-1]}:{f.lineno}"
                for f in reversed(frames)
                if "sglang" in f.filename
            ),
            "",
        )
        return {
            "ok": False,
            "stage": "resolve",
            "error": f"{type(e).__name__}: {e}",
            "where": where,
        }
    out["resolved"] = {k: _plain(resolved.get(k)) for k in RESOLVED_FIELDS if k in resolved}
    if getattr(ns, "speculative_adaptive", False) and not resolved.get("speculative_adaptive"):
        out["resolved"][ADAPTIVE_OFF] = _adaptive_off_reason(args)
    return out


def device_count(kind: str) -> int:
    """How many ``kind`` devices (``cuda``, ``xpu`` …) this interpreter's torch sees; 0 when it has
    none.

    Args:
        kind: the torch backend's attribute name.

    Returns:
        The count (1 for a backend without ``device_count``).
    """
    import torch

    module = getattr(torch, kind, None)
    try:
        if module is None or not module.is_available():
            return 0
        count = getattr(module, "device_count", None)
        return int(count()) if callable(count) else 1
    except Exception:  # a backend that cannot even be queried here has no device here
        return 0


def missing_devices(ns: argparse.Namespace) -> str | None:
    """Why this host cannot resolve the launch as its node would (None: it can): fewer devices of
    the launch's kind than ``tp_size × pp_size`` per node. ``--device cpu`` needs none; no
    ``--device`` is SGLang's auto-detection, which takes the first accelerator kind present."""
    device = getattr(ns, "device", None)
    if device == "cpu":
        return None
    nnodes = max(1, int(getattr(ns, "nnodes", 1) or 1))
    world = max(1, int(getattr(ns, "tp_size", 1) or 1)) * max(
        1, int(getattr(ns, "pp_size", 1) or 1)
    )
    need = (world + nnodes - 1) // nnodes
    kinds = (device,) if device else ACCELERATORS
    have, kind = next(
        ((n, k) for k in kinds if (n := device_count(k)) > 0), (0, device or "accelerator")
    )
    if have >= need:
        return None
    return (
        f"{NOT_RESOLVED_HERE}; the launch needs {need} {kind} device(s) per node (tp_size × "
        f"pp_size), this host has {have}"
    )


def _adaptive_off_reason(args) -> str | None:
    """Why SGLang's resolution turned ``--speculative-adaptive`` off (its own check, asked
    again)."""
    try:
        from sglang.srt.speculative.adaptive_spec_params import adaptive_unsupported_reason

        return adaptive_unsupported_reason(args)
    # a release without the check: the plan says adaptive is off without SGLang's reason
    except Exception:
        return None


# -- layer capture, by SGLang's own model class
# ------------------------------------------------------------


def model_class(architecture: str):
    """SGLang's class for a config's ``architectures[0]``: the module of ``sglang.srt.models``
    defining it."""
    import sglang.srt.models as models

    pattern = re.compile(rf"^class {re.escape(architecture)}\b", re.MULTILINE)
    for path in sorted(Path(models.__path__[0]).glob("*.py")):
        if pattern.search(path.read_text(errors="replace")):
            return getattr(importlib.import_module(f"sglang.srt.models.{path.stem}"), architecture)
    raise LookupError(f"no class {architecture} in sglang.srt.models")


def _inner_class(cls, attr: str):
    """The class ``cls.__init__`` (or a base's) assigns to ``self.<attr>`` (``self.model =
    DeepseekV2Model(...)``)."""
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None or not hasattr(init, "__code__"):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
        except (OSError, TypeError, SyntaxError):
            continue
        names = sys.modules[klass.__module__].__dict__
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
                continue
            func = node.value.func
            for t in node.targets:
                if (
                    isinstance(t, ast.Attribute)
                    and t.attr == attr
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                    and isinstance(func, ast.Name)
                    and isinstance(names.get(func.id), type)
                ):
                    return names[func.id]
    return None


class _Cfg(SimpleNamespace):
    """A config.json as attributes; a key missing here is looked up in ``text_config`` (multimodal
    wrappers)."""

    def __getattr__(self, name):
        text = self.__dict__.get("text_config")
        if isinstance(text, _Cfg) and name in text.__dict__:
            return getattr(text, name)
        raise AttributeError(name)


def _cfg(value):
    if isinstance(value, dict):
        return _Cfg(**{str(k): _cfg(v) for k, v in value.items()})
    return value


_UNSET: list = []


def _standin(cls, cfg, n: int, pp, made: list, depth: int = 0):
    """A weightless stand-in of ``cls``: a real instance (no ``__init__``) holding only what the
    capture hook reads (config, pp_group, layers, layers_to_capture) and stand-ins of its ``model``
    / ``language_model``."""
    import torch

    obj = cls.__new__(cls)
    with contextlib.suppress(Exception):
        torch.nn.Module.__init__(obj)
    for name, value in (
        ("config", cfg),
        ("pp_group", pp),
        ("capture_aux_hidden_states", False),
        ("layers_to_capture", _UNSET),
        ("layers", [SimpleNamespace() for _ in range(n)]),
        ("start_layer", 0),
        ("end_layer", n),
    ):
        with contextlib.suppress(AttributeError, TypeError):
            setattr(obj, name, value)
    made.append(obj)
    for attr in ("model", "language_model"):
        inner = _inner_class(cls, attr) if depth < 3 else None
        inner_cfg = cfg.__dict__.get("text_config", cfg) if attr == "language_model" else cfg
        if inner is not None:
            stub = _standin(inner, inner_cfg, n, pp, made, depth + 1)
        elif attr == "model":
            stub = SimpleNamespace(
                config=cfg,
                layers_to_capture=_UNSET,
                layers=[SimpleNamespace() for _ in range(n)],
                start_layer=0,
                end_layer=n,
            )
            made.append(stub)
        else:
            continue
        with contextlib.suppress(AttributeError, TypeError):
            setattr(obj, attr, stub)
    return obj


def _source(fn) -> str:
    try:
        return " ".join(inspect.getsource(fn).split())
    except (OSError, TypeError):
        return ""


def capture(architecture: str, config: dict, grid: list) -> dict:
    """What SGLang's own ``set_eagle3_layers_to_capture`` of ``architecture`` makes of each id list
    of ``grid``.

    The hook runs on a weightless stand-in; the decoder model it set ``layers_to_capture`` on is
    then read: its ``forward`` captures the *input* of layer ``e`` (``hidden_states[e]``) for each
    entry ``0 <= e < N``, the final pre-norm state (``hidden_states[N]``) for ``e == N`` only where
    it checks ``end_layer in layers_to_capture``, and nothing else. Per list:
    ``{"layers_to_capture": [...], "captures": [index or null per entry]}`` or ``{"error": ...}``
    (an exception of the hook itself, e.g. ``IndexError`` on ``self.layers[N]``).

    Args:
        architecture: the target's model class name.
        config: the target's config.json.
        grid: id lists (None for the hook's default).

    Returns:
        ``class``, ``num_layers`` and ``answers`` keyed by each list's JSON; with an answer, also
        ``model``, ``final_captured``, ``counted`` and ``flags``.
    """
    cls = model_class(architecture)
    cfg = _cfg(config)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    n = int(config.get("num_hidden_layers") or text.get("num_hidden_layers"))
    pp = SimpleNamespace(is_last_rank=True, is_first_rank=True, world_size=1, rank_in_group=0)
    patched = []
    for klass in cls.__mro__:
        module = sys.modules.get(klass.__module__)
        for name, fake in (
            ("get_parallel", lambda: SimpleNamespace(pp_group=pp)),
            ("get_pp_group", lambda: pp),
        ):
            if module is not None and name in vars(module):
                patched.append((module, name, vars(module)[name]))
                setattr(module, name, fake)
    out: dict = {"class": f"{cls.__module__}.{cls.__qualname__}", "num_layers": n, "answers": {}}
    try:
        for ids in grid:
            made: list = []
            obj = _standin(cls, cfg, n, pp, made)
            try:
                cls.set_eagle3_layers_to_capture(obj, None if ids is None else list(ids))
            except Exception as e:
                where = next(
                    (
                        f"{f.filename.split('site-packages/')[-1]}:{f.lineno}"
                        for f in reversed(traceback.extract_tb(e.__traceback__))
                        if "sglang" in f.filename
                    ),
                    "",
                )
                out["answers"][json.dumps(ids)] = {
                    "error": f"{type(e).__name__}: {e}",
                    "where": where,
                }
                continue
            model = next(
                (
                    m
                    for m in reversed(made)
                    if getattr(m, "layers_to_capture", _UNSET) is not _UNSET
                ),
                None,
            )
            if model is None:
                out["answers"][json.dumps(ids)] = {
                    "error": "the hook set no layers_to_capture",
                    "where": "",
                }
                continue
            forward = _source(getattr(type(model), "forward", None))
            final = bool(re.search(r"end_layer in self\.layers_to_capture", forward))
            flags = "_is_layer_to_capture" in forward
            flagged = [
                i
                for i, layer in enumerate(model.layers)
                if getattr(layer, "_is_layer_to_capture", False)
            ]
            entries = [int(e) for e in model.layers_to_capture]
            captures = []
            for e in entries:
                hit = (
                    (e % n if -n <= e < n and e % n in flagged else None)
                    if flags
                    else e
                    if 0 <= e < n
                    else None
                )
                captures.append(n if e == n and final else hit)
            out["answers"][json.dumps(ids)] = {"layers_to_capture": entries, "captures": captures}
            out["model"] = f"{type(model).__module__}.{type(model).__qualname__}"
            out["final_captured"] = final
            # fewer states than ids: 'captured k of n'
            out["counted"] = "AuxHiddenStatePacker" in forward
            out["flags"] = flags
    finally:
        for module, name, value in patched:
            setattr(module, name, value)
    return out


def main() -> int:
    """Answer JSON-line requests on stdin (``describe``, ``capture``, else ``resolve``).

    Returns:
        0; a parser that cannot be built is reported once (``stage: import``) before returning.
    """
    spec = sys.argv[1] if len(sys.argv) > 1 else "sglang"
    try:
        parser = _parser(spec)
    except Exception as e:
        print(
            json.dumps({"ok": False, "stage": "import", "error": f"{type(e).__name__}: {e}"}),
            flush=True,
        )
        return 0
    print(json.dumps({"ok": True, "ready": True}), flush=True)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            if req.get("op") == "describe":
                answer = describe(parser, spec)
            elif req.get("op") == "capture":
                with (
                    contextlib.redirect_stdout(io.StringIO()),
                    contextlib.redirect_stderr(io.StringIO()),
                ):
                    answer = {
                        "ok": True,
                        **capture(str(req["architecture"]), dict(req["config"]), list(req["ids"])),
                    }
            else:
                answer = resolve(
                    _parser(spec), spec, list(req["argv"]), bool(req.get("resolve", True))
                )
        except Exception as e:  # the oracle never dies on one request
            answer = {"ok": False, "stage": "oracle", "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
