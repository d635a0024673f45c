"""Engines run live trials; :func:`make_engine` builds the one a spec asks for."""

from __future__ import annotations

from pathlib import Path

from bisect_eagle.engines.base import Engine
from bisect_eagle.spec.schema import Spec


def default_log_dir(spec: Spec) -> Path:
    """Per-trial server logs of an experiment: ``./mlruns/logs/<spec name>``."""
    return Path.cwd() / "mlruns" / "logs" / spec.name


def make_engine(spec: Spec, log_dir: Path | None = None) -> Engine:
    """The spec's engine: ``local`` (in-process PyTorch) or ``sglang`` (one server per trial).

    Building an engine is cheap and writes nothing; models load and servers start on the first run.
    """
    if spec.engine.kind == "local":
        from bisect_eagle.engines.local import LocalEngine

        p = spec.paths()
        return LocalEngine(p["target"], p["draft"], p["prompts"])
    from bisect_eagle.engines.sglang import SglangEngine

    return SglangEngine.from_spec(spec, log_dir or default_log_dir(spec))
