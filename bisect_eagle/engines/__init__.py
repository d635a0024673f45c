"""Engines run live trials; :data:`ENGINE_KINDS` registers each by its spec name
(:class:`EngineKind`), :func:`make_engine` builds the one a spec asks for, :func:`engine_class`
names its class.

What an engine says about itself is read through the engine or its kind, never by comparing its
name: its class attributes and :meth:`~.base.Engine.export` (:attr:`~.base.Engine.benchmark`, the
throughput model that fits it; :attr:`~.base.Engine.reads_t2d`), and, without importing the engine,
:attr:`EngineKind.id_reader` (whose loader reads the draft's layer ids, and how).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from bisect_eagle.artifacts.layers import LOCAL_READER, SGLANG_READER, VLLM_READER, IdReader
from bisect_eagle.engines.base import Engine
from bisect_eagle.errors import BadInput
from bisect_eagle.perf.benchmark import Benchmark
from bisect_eagle.spec.schema import Spec


@dataclass(frozen=True)
class EngineKind:
    """One engine a spec's ``engine.kind`` names: where its class is (imported on first use: the
    local engine loads torch) and what it declares without being imported.

    ``id_reader``: whose loader reads the draft's layer ids, and how
    (:class:`~bisect_eagle.artifacts.layers.IdReader`).
    """

    name: str
    module: str
    class_name: str
    id_reader: IdReader

    def engine_class(self) -> type[Engine]:
        """The engine's class (its module imported now).

        Returns:
            The :class:`~.base.Engine` subclass.
        """
        return getattr(importlib.import_module(self.module), self.class_name)


# in-process PyTorch; then the two that run one server per trial
ENGINE_KINDS: dict[str, EngineKind] = {
    kind.name: kind
    for kind in (
        EngineKind("local", "bisect_eagle.engines.local", "LocalEngine", LOCAL_READER),
        EngineKind("sglang", "bisect_eagle.engines.sglang", "SglangEngine", SGLANG_READER),
        EngineKind("vllm", "bisect_eagle.engines.vllm", "VllmEngine", VLLM_READER),
    )
}


def default_log_dir(spec: Spec) -> Path:
    """Per-trial server logs of an experiment: ``./mlruns/logs/<spec name>``.

    Args:
        spec: the validated spec (its ``name`` names the directory).

    Returns:
        The directory, under the current working directory (not created).
    """
    return Path.cwd() / "mlruns" / "logs" / spec.name


def engine_kind(kind: str) -> EngineKind:
    """The registered engine of a spec's ``engine.kind`` (:data:`ENGINE_KINDS`).

    Args:
        kind: the engine's name.

    Returns:
        Its :class:`EngineKind`.

    Raises:
        BadInput: an unknown kind.
    """
    try:
        return ENGINE_KINDS[kind]
    except KeyError:
        raise BadInput(
            f"engine.kind {kind!r}: expected {', '.join(list(ENGINE_KINDS)[:-1])} or "
            f"{list(ENGINE_KINDS)[-1]}"
        ) from None


def engine_class(kind: str) -> type[Engine]:
    """The engine class of a spec's ``engine.kind`` (:meth:`EngineKind.engine_class`).

    Args:
        kind: the engine's name.

    Returns:
        The class, imported on first use.

    Raises:
        BadInput: an unknown kind.
    """
    return engine_kind(kind).engine_class()


def make_engine(spec: Spec, log_dir: Path | None = None) -> Engine:
    """The spec's engine (:func:`engine_class`).

    Args:
        spec: the validated spec.
        log_dir: where a server engine keeps its per-trial logs (default :func:`default_log_dir`).

    Building an engine is cheap and writes nothing; models load and servers start on the first run.

    Returns:
        An instance of the spec's engine class.

    Raises:
        BadInput: an unknown ``engine.kind``.
    """
    return engine_class(spec.engine.kind).from_spec(spec, log_dir or default_log_dir(spec))


def benchmark_of(engine: Engine | type[Engine] | str) -> Benchmark:
    """How ``engine`` measures a trial (:attr:`~.base.Engine.benchmark`), for its throughput model.

    Args:
        engine: the engine or its class, or an engine's name (an unknown name, e.g. a test engine's,
            is a server benchmarked in steady state: :attr:`Engine.benchmark`).

    Returns:
        The engine's :class:`Benchmark`.
    """
    if not isinstance(engine, str):
        return engine.benchmark
    try:
        return engine_class(engine).benchmark
    except BadInput:
        return Engine.benchmark
