"""Engines run live trials; :func:`make_engine` builds the one a spec asks for, :func:`engine_class` names its class.

What an engine says about itself (its class attributes and :meth:`~.base.Engine.export`) is read through the
engine, never by comparing its name: :attr:`~.base.Engine.benchmark` (the throughput model that fits it),
:attr:`~.base.Engine.reads_t2d`, :meth:`~.base.Engine.export`.
"""

from __future__ import annotations

from pathlib import Path

from bisect_eagle.engines.base import Engine
from bisect_eagle.errors import BadInput
from bisect_eagle.perf.benchmark import Benchmark
from bisect_eagle.spec.schema import Spec


def default_log_dir(spec: Spec) -> Path:
    """Per-trial server logs of an experiment: ``./mlruns/logs/<spec name>``."""
    return Path.cwd() / "mlruns" / "logs" / spec.name


def engine_class(kind: str) -> type[Engine]:
    """The engine class of a spec's ``engine.kind``: ``local`` (in-process PyTorch), ``sglang`` or ``vllm`` (one
    server per trial). Imported on first use (the local engine loads torch).

    Raises:
        BadInput: an unknown kind.
    """
    if kind == "local":
        from bisect_eagle.engines.local import LocalEngine

        return LocalEngine
    if kind == "sglang":
        from bisect_eagle.engines.sglang import SglangEngine

        return SglangEngine
    if kind == "vllm":
        from bisect_eagle.engines.vllm import VllmEngine

        return VllmEngine
    raise BadInput(f"engine.kind {kind!r}: expected local, sglang or vllm")


def make_engine(spec: Spec, log_dir: Path | None = None) -> Engine:
    """The spec's engine (:func:`engine_class`).

    Args:
        spec: the validated spec.
        log_dir: where a server engine keeps its per-trial logs (default :func:`default_log_dir`).

    Building an engine is cheap and writes nothing; models load and servers start on the first run.
    """
    return engine_class(spec.engine.kind).from_spec(spec, log_dir or default_log_dir(spec))


def benchmark_of(engine: Engine | type[Engine] | str) -> Benchmark:
    """How ``engine`` measures a trial (:attr:`~.base.Engine.benchmark`), for its throughput model.

    Args:
        engine: the engine or its class, or an engine's name (an unknown name, e.g. a test engine's, is a server
            benchmarked in steady state: :attr:`Engine.benchmark`).
    """
    if not isinstance(engine, str):
        return engine.benchmark
    try:
        return engine_class(engine).benchmark
    except BadInput:
        return Engine.benchmark
