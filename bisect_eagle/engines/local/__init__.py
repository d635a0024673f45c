"""The ``local`` engine: EAGLE-3 speculative decoding in this process (:mod:`.decoder`), planned and
measured by :class:`~bisect_eagle.engines.local.engine.LocalEngine`."""

from bisect_eagle.engines.local.decoder import (
    DraftChain,
    Generation,
    Pin,
    SpeculativeDecoder,
    accept_rates,
)
from bisect_eagle.engines.local.engine import DTYPES, LocalEngine

__all__ = [
    "DTYPES",
    "DraftChain",
    "Generation",
    "LocalEngine",
    "Pin",
    "SpeculativeDecoder",
    "accept_rates",
]
