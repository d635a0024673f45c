"""How an engine measures a trial's throughput, which the throughput model must mirror
(:class:`Benchmark`).

Engines state it (:attr:`bisect_eagle.engines.base.Engine.benchmark`);
:class:`~bisect_eagle.perf.model.ThroughputModel` reads it. This module imports nothing outside the
standard library, so an engine can state its benchmark without loading the model's numerics.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Benchmark:
    """What a measured tok/s means for one engine.

    Attributes:
        finite_horizon: each measured request is timed whole, its prefill and ``max_new_tokens``
            decoded tokens (the local engine); False: steady-state decoding of a server, where
            prefills are amortised away.
        truncate_drafts: in a request's last cycles the engine drafts only what still fits in
            ``max_new_tokens`` (the local engine; :mod:`~bisect_eagle.perf.horizon`). Read only with
            ``finite_horizon``.
    """

    finite_horizon: bool = False
    truncate_drafts: bool = False


STEADY_STATE = Benchmark()  # a server's benchmark: steady-state decoding
