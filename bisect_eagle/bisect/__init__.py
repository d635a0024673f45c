"""Bisect a good and a bad configuration: which changes break the good one, which reverted repair
the bad one.

One concept per module, in the order a bisect uses them:

- :mod:`.endpoints`: the good and bad configurations (spec files or MLflow run ids) and their
  deployment;
- :mod:`.changes`: the changes between them, decided by the engine's plans (:func:`list_changes`):
  what differs from either end, a change masked at one end saying by what;
- :mod:`.ddmin`: isolating delta debugging, a pure module (standard library only);
- :mod:`.culprits`: the answers, each verified by a probe before it is reported as isolated (pure as
  well);
- :mod:`.judge`: verdicts from samples with a sequential one-sided bound (GOOD, BAD, UNRESOLVED);
- :mod:`.measurement`: one plan fingerprint's samples, shared by every probe that plans to it;
- :mod:`.prober`: a set of applied changes -> a plan -> samples -> a verdict, one measurement per
  fingerprint;
- :mod:`.sides`: which side of the throughput each breaking set acts on (acceptance or cost), by a
  probe with acceptance pinned;
- :mod:`.log`: the replayable bisect log;
- :mod:`.run`: :func:`run_bisect` and its options; :mod:`.report`: the report, its JSON and its
  MLflow run.

The package itself loads nothing: ``import bisect_eagle.bisect.ddmin`` stays standard-library only.
"""
