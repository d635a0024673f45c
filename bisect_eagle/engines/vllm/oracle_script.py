"""Runs inside vLLM's own interpreter and answers with vLLM's own parser and engine-args resolution.

Run as ``<vllm python> oracle_script.py [--ready]``. It imports nothing from bisect-eagle (vLLM
lives in an environment of its own, ``.vllm-venv``): only the standard library and vLLM. Each line
on stdin is one JSON request, each answer one JSON line on stdout, so one process answers every plan
of a study (importing vLLM and resolving the first config takes about half a minute on 2 cores;
later answers take seconds). With ``--ready`` the first line it prints is ``{"ok": true, "ready":
true, "vllm_version": ...}`` once vLLM is imported (or ``{"ok": false, "stage": "import", ...}``).
Anything vLLM prints (its logger writes to stdout) goes to stderr: stdout carries the answers only.

Requests:

- ``{"op": "describe"}`` → ``prog``, ``vllm_version`` and every option of the api_server's parser
  (vLLM's ``make_arg_parser``: ``FrontendArgs`` + ``AsyncEngineArgs``): flags, dest, default,
  choices, whether it takes a value, whether it is a ``--x/--no-x`` flag.
- ``{"argv": [...], "env": {...}, "draft": {...}}`` (``op`` ``judge``, the default): the arguments
  after ``python -m vllm.entrypoints.openai.api_server``, judged the way that entry point starts
  (``vllm/entrypoints/launchers/api_server/entry.py`` ``main`` → ``run_server`` → ``setup_server`` →
  ``build_async_engine_client``), with ``env`` set on top of this process's environment for the
  request and restored afterwards (vLLM reads its variables from ``os.environ`` when asked,
  ``vllm/envs.py`` ``__getattr__``; its CPU platform also writes some, which are undone):

  1. ``FlexibleArgumentParser`` + ``make_arg_parser``, ``parse_args`` (stage ``parse``: the exact
     ``api_server.py: error: …`` text vLLM prints before it exits with status 2);
  2. ``validate_parsed_serve_args`` and ``validate_api_server_args`` (stage ``validate``);
  3. ``AsyncEngineArgs.from_cli_args`` and ``create_engine_config(usage_context=OPENAI_API_SERVER)``
     (stage ``config``): the whole ``VllmConfig``, built without starting an engine (it reads the
     target's and the draft's ``config.json``; it loads no weights). vLLM's exception, with the vLLM
     ``file:line`` that raised it.

  ``draft`` (optional) is ``{"source": DIR, "top_level_ids": [...] or null, "placeholder": TEXT}``:
  the trial's per-trial draft copy, which does not exist yet when a plan is made. The oracle builds
  a throwaway copy of ``source`` in a temporary directory (files symlinked, ``config.json`` with
  ``top_level_ids`` at the top level when given), puts its path where ``placeholder`` stands in the
  argv, and removes it afterwards; answers name the placeholder, never the temporary path.
  ``"resolve": false`` stops after step 2 (for a launch whose target or draft is not readable here:
  resolution would read them, or try to download a model).

  The answer: ``{"ok", "stage", "error", "where", "vllm_version", "resolved", "log"}``. ``resolved``
  holds what the engine would run: ``dtype``, ``max_model_len``, the target's
  ``architectures``/``model_type``/``num_hidden_layers``, parallel, scheduler and cache settings,
  the platform's ``device_type``, ``speculative`` (method, ``num_speculative_tokens``, draft path
  and architecture, and ``aux_layer_ids``: the EAGLE-3 aux layer ids vLLM's model runner will
  capture, from its own ``GPUModelRunner._get_eagle3_aux_layers_from_config``
  (``vllm/v1/worker/gpu_model_runner.py``: top-level ids, else ``eagle_config``'s, verbatim), else
  the target model class's own ``get_eagle3_default_aux_hidden_state_layers``; ``aux_layer_source``
  says which), and ``env``: the request's variables that vLLM knows
  (``vllm.envs.environment_variables``) and those it does not. ``log`` holds the warnings vLLM
  logged while resolving.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import time
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

# the prog vLLM's parser prints when started as ``python -m vllm.entrypoints.openai.api_server``
PROG = "api_server.py"
USAGE_CONTEXT = "OPENAI_API_SERVER"
# replaced in main() by a private copy of fd 1; fd 1 itself then points at stderr
_ANSWERS = sys.stdout


def _plain(value):
    """A JSON-safe copy of ``value`` (torch dtypes and enums as their names, other objects as
    ``str``)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    text = str(value)
    return text[len("torch.") :] if text.startswith("torch.") else text


def _version() -> str | None:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:
        return None


def _parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(
        prog=PROG, description="vLLM OpenAI-Compatible RESTful API server."
    )
    return make_arg_parser(parser)


def describe() -> dict:
    """The api_server parser's options as vLLM builds them.

    Returns:
        ``{"ok": True, "prog", "vllm_version", "options"}``.
    """
    parser = _parser()
    return {
        "ok": True,
        "prog": parser.prog,
        "vllm_version": _version(),
        "options": _common.parser_options(parser, to_json=_plain),
    }


class _Collect(logging.Handler):
    """vLLM's WARNING and ERROR records while one request is resolved."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep one record as a line (level, file:line, message); never raises.

        Args:
            record: the log record.
        """
        with contextlib.suppress(Exception):
            where = f"{record.filename}:{record.lineno}"
            self.lines.append(f"{record.levelname} [{where}] {record.getMessage()}")


@contextlib.contextmanager
def _environment(env: dict[str, str]):
    """``env`` on top of ``os.environ`` for the request; ``os.environ`` restored exactly
    afterwards."""
    saved = dict(os.environ)
    os.environ.update({str(k): str(v) for k, v in env.items()})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _where(exc: BaseException) -> str:
    """The innermost vLLM ``file:line`` of the traceback (where vLLM raised)."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = frame.filename.replace(os.sep, "/")
        if "/vllm/" in path:
            return f"vllm/{path.rsplit('/vllm/', 1)[1]}:{frame.lineno}"
    return ""


def _error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _parse(parser, argv: list[str]) -> tuple[argparse.Namespace | None, str | None]:
    """(namespace, None) or (None, what vLLM's parser prints before it exits: ``api_server.py:
    error: …``)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(argv), None
    except SystemExit:
        text = err.getvalue()
        marker = f"{parser.prog}: error: "
        cut = text.find(marker)
        return None, (text[cut:] if cut >= 0 else text).strip() or "the parser exited"


def _aux_layers(vllm_config) -> tuple[list[int] | None, str, str]:
    """(ids, source, how): the EAGLE-3 aux layers vLLM's model runner will capture, asked from
    vLLM's own code.

    ``GPUModelRunner._setup_eagle3_aux_hidden_state_outputs``
    (``vllm/v1/worker/gpu_model_runner.py``) takes ``_get_eagle3_aux_layers_from_config()`` (it
    reads only ``self.speculative_config``), else the target model's
    ``get_eagle3_default_aux_hidden_state_layers()`` (``vllm/model_executor/models/interfaces.py``:
    it reads only the number of decoder layers). The CPU model runner inherits both.
    """
    spec = vllm_config.speculative_config
    if spec is None or spec.draft_model_config is None:
        return None, "none", ""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    getter = GPUModelRunner._get_eagle3_aux_layers_from_config
    how = (
        f"vllm/v1/worker/gpu_model_runner.py:{getter.__code__.co_firstlineno} "
        "_get_eagle3_aux_layers_from_config"
    )
    ids = getter(SimpleNamespace(speculative_config=spec))
    hf = spec.draft_model_config.hf_config
    if ids:
        top = getattr(hf, "eagle_aux_hidden_state_layer_ids", None)
        eagle = getattr(hf, "eagle_config", None)
        nested = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
        source = "top-level" if top else ("eagle_config" if nested else "dflash_config")
        return [int(i) for i in ids], source, how
    try:
        model_cls, _ = vllm_config.model_config.registry.resolve_model_cls(
            vllm_config.model_config.architectures, model_config=vllm_config.model_config
        )
        method = model_cls.get_eagle3_default_aux_hidden_state_layers
        n = vllm_config.model_config.hf_text_config.num_hidden_layers
        fake = SimpleNamespace(model=SimpleNamespace(layers=[None] * int(n)))
        ids = method(fake)
        how = (
            f"{model_cls.__name__}.get_eagle3_default_aux_hidden_state_layers ({n} decoder layers)"
        )
        return [int(i) for i in ids], "default", how
    # a model whose default needs more than its layer count: not reproducible here
    except Exception as e:
        return (
            None,
            "default",
            f"the target model's own default, not reproducible without the model ({_error(e)})",
        )


def _resolved(vllm_config, env: dict[str, str]) -> dict:
    from vllm import envs
    from vllm.platforms import current_platform

    mc, pc, sc, cc = (
        vllm_config.model_config,
        vllm_config.parallel_config,
        vllm_config.scheduler_config,
        vllm_config.cache_config,
    )
    text = mc.hf_text_config
    out = {
        "model": mc.model,
        "served_model_name": _plain(mc.served_model_name),
        "architectures": _plain(mc.architectures),
        "model_type": getattr(text, "model_type", None),
        "num_hidden_layers": getattr(text, "num_hidden_layers", None),
        "dtype": _plain(mc.dtype),
        "max_model_len": mc.max_model_len,
        "seed": getattr(mc, "seed", None),
        "enforce_eager": getattr(mc, "enforce_eager", None),
        "device_type": current_platform.device_type,
        "tensor_parallel_size": pc.tensor_parallel_size,
        "pipeline_parallel_size": pc.pipeline_parallel_size,
        "data_parallel_size": pc.data_parallel_size,
        "distributed_executor_backend": _plain(pc.distributed_executor_backend),
        "max_num_seqs": sc.max_num_seqs,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "async_scheduling": getattr(sc, "async_scheduling", None),
        "block_size": cc.block_size,
        "enable_prefix_caching": cc.enable_prefix_caching,
        "kv_cache_memory_bytes": getattr(cc, "kv_cache_memory_bytes", None),
        "gpu_memory_utilization": cc.gpu_memory_utilization,
        "speculative": None,
    }
    spec = vllm_config.speculative_config
    if spec is not None:
        draft = spec.draft_model_config
        ids, source, how = _aux_layers(vllm_config)
        out["speculative"] = {
            "method": spec.method,
            "num_speculative_tokens": spec.num_speculative_tokens,
            "model": spec.model,
            "draft_architectures": _plain(getattr(draft, "architectures", None))
            if draft is not None
            else None,
            "draft_max_model_len": getattr(draft, "max_model_len", None)
            if draft is not None
            else None,
            "draft_tensor_parallel_size": getattr(spec, "draft_tensor_parallel_size", None),
            "aux_layer_ids": ids,
            "aux_layer_source": source,
            "aux_layer_how": how,
        }
    known = set(getattr(envs, "environment_variables", {}))
    out["env"] = {
        "known": sorted(k for k in env if k in known),
        "unknown": sorted(k for k in env if k not in known),
    }
    return out


@contextlib.contextmanager
def _draft_copy(draft: dict | None):
    """(placeholder, path of a throwaway draft copy) for the request's ``draft``, removed
    afterwards."""
    if not draft:
        yield None, None
        return
    source = str(draft["source"])
    tmp = tempfile.mkdtemp(prefix="bisect-eagle-vllm-oracle-")
    try:
        copy = os.path.join(tmp, "draft")
        os.mkdir(copy)
        for name in sorted(os.listdir(source)):
            if name != "config.json":
                os.symlink(os.path.realpath(os.path.join(source, name)), os.path.join(copy, name))
        with open(os.path.join(source, "config.json")) as f:
            config = json.load(f)
        if draft.get("top_level_ids") is not None:
            config["eagle_aux_hidden_state_layer_ids"] = [int(i) for i in draft["top_level_ids"]]
        with open(os.path.join(copy, "config.json"), "w") as f:
            json.dump(config, f)
        yield str(draft["placeholder"]), copy
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def judge(
    argv: list[str], env: dict[str, str], draft: dict | None = None, resolve: bool = True
) -> dict:
    """vLLM's verdict on one api_server argv under ``env`` (see the module docstring).

    Args:
        argv: the api_server arguments.
        env: the trial's variables, set for this request only.
        draft: ``{"source", "top_level_ids", "placeholder"}`` to judge with a throwaway draft copy;
            None uses ``argv`` as it is.
        resolve: False checks the parser and the entry point only.

    Returns:
        The verdict with ``vllm_version``, vLLM's last 40 warning lines (``log``), ``seconds``
        and ``resolved`` (None when not resolved).
    """
    collect = _Collect()
    start = time.perf_counter()
    try:
        with _draft_copy(draft) as (placeholder, copy), _environment(env):
            if placeholder is not None:
                argv = [a.replace(placeholder, copy) for a in argv]
            answer = _judge(list(argv), env, collect, resolve)
            if placeholder is not None:
                answer = json.loads(
                    json.dumps(answer).replace(
                        json.dumps(copy)[1:-1], json.dumps(placeholder)[1:-1]
                    )
                )
    finally:
        logging.getLogger("vllm").removeHandler(collect)
    answer.update(
        {
            "vllm_version": _version(),
            "log": collect.lines[-40:],
            "seconds": round(time.perf_counter() - start, 3),
        }
    )
    answer.setdefault("resolved", None)
    return answer


def _judge(argv: list[str], env: dict[str, str], collect: _Collect, resolve: bool) -> dict:
    from vllm.logger import configure_logging_from_args

    parser = _parser()
    args, message = _parse(parser, argv)
    if args is None:
        return {"ok": False, "stage": "parse", "error": message, "where": ""}
    # as the server's main() does; it may replace the vllm logger's handlers
    configure_logging_from_args(args)
    logging.getLogger("vllm").addHandler(collect)
    try:
        from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
        from vllm.entrypoints.launchers.launcher import validate_api_server_args

        validate_parsed_serve_args(args)
        validate_api_server_args(args)
    except Exception as e:
        return {"ok": False, "stage": "validate", "error": _error(e), "where": _where(e)}
    if not resolve:
        return {"ok": True, "stage": "", "error": None, "where": "", "resolved": None}
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext

        engine_args = AsyncEngineArgs.from_cli_args(args)
        vllm_config = engine_args.create_engine_config(
            usage_context=getattr(UsageContext, USAGE_CONTEXT)
        )
        resolved = _resolved(vllm_config, env)
    except Exception as e:
        return {"ok": False, "stage": "config", "error": _error(e), "where": _where(e)}
    return {"ok": True, "stage": "", "error": None, "where": "", "resolved": resolved}


def _answer(obj: dict) -> None:
    _ANSWERS.write(json.dumps(obj) + "\n")
    _ANSWERS.flush()


def main() -> int:
    """Answer JSON-line requests on stdin (``describe``, else ``judge``) on the real stdout.

    Returns:
        0; failed imports are answered once (``stage: import``) before returning.
    """
    global _ANSWERS
    ready = "--ready" in sys.argv[1:]
    sys.stdout.flush()
    _ANSWERS = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever vLLM (or a C library) prints to stdout lands on stderr
    sys.stdout = sys.stderr
    try:
        # the imports are the slow part (an error here is fatal); done before the first request, so
        # that the logging set-up they run does not drop the first request's log handler
        import vllm.engine.arg_utils  # noqa: F401
        import vllm.entrypoints.launchers.cli_args  # noqa: F401
        import vllm.entrypoints.launchers.launcher  # noqa: F401
        import vllm.usage.usage_lib  # noqa: F401
        import vllm.v1.worker.gpu_model_runner  # noqa: F401
    except Exception as e:
        _answer({"ok": False, "stage": "import", "error": _error(e), "where": _where(e)})
        return 0
    if ready:
        _answer({"ok": True, "ready": True, "vllm_version": _version()})
    for line in sys.stdin:
        if not line.strip():
            continue
        req = None
        try:
            req = json.loads(line)
            if req.get("op") == "describe":
                answer = describe()
            else:
                answer = judge(
                    list(req.get("argv") or []),
                    dict(req.get("env") or {}),
                    req.get("draft"),
                    bool(req.get("resolve", True)),
                )
        except Exception as e:  # the oracle never dies on one request
            answer = {"ok": False, "stage": "oracle", "error": _error(e), "where": _where(e)}
        if isinstance(req, dict) and "id" in req:
            answer["id"] = req["id"]
        _answer(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
