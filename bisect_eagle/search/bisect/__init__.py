"""Bisect a good and a bad configuration: which changes break the good one, which reverted repair the bad one.

One concept per module, in the order a bisect uses them:

- :mod:`.endpoints`: the good and bad configurations (spec files or MLflow run ids) and their deployment;
- :mod:`.changes`: the changes between them, decided by the engine's plans (:func:`list_changes`);
- :mod:`.ddmin`: isolating delta debugging, a pure module (standard library only);
- :mod:`.judge`: verdicts from samples with a sequential one-sided bound (GOOD, BAD, UNRESOLVED);
- :mod:`.prober`: a set of applied changes -> a plan -> samples -> a verdict, one measurement per fingerprint;
- :mod:`.log`: the replayable bisect log;
- :mod:`.run`: :func:`run_bisect`, its options and its report.
"""

from bisect_eagle.search.bisect.changes import Change, apply_changes, flat_settings, list_changes
from bisect_eagle.search.bisect.ddmin import (
    Answer,
    BisectProgress,
    BisectStatus,
    Culprits,
    Probe,
    ProbeMemo,
    ProbeOutcome,
    find_culprits,
    isolate,
    probe_bound,
)
from bisect_eagle.search.bisect.endpoints import Endpoint, load_endpoint
from bisect_eagle.search.bisect.judge import Judge, NoisePool
from bisect_eagle.search.bisect.log import BisectLog, ParsedLog, parse_log
from bisect_eagle.search.bisect.prober import Measurement, Prober, ProbeRecord
from bisect_eagle.search.bisect.run import BisectOptions, BisectReport, run_bisect

__all__ = [
    "Answer", "BisectLog", "BisectOptions", "BisectProgress", "BisectReport", "BisectStatus", "Change", "Culprits",
    "Endpoint", "Judge", "Measurement", "NoisePool", "ParsedLog", "Probe", "ProbeMemo", "ProbeOutcome", "ProbeRecord",
    "Prober", "apply_changes", "find_culprits", "flat_settings", "isolate", "list_changes", "load_endpoint",
    "parse_log", "probe_bound", "run_bisect",
]
