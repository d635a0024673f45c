"""The staged search of one study: stage 1 gates wirings, stage 2 runs live trials with Optuna, with
resume.

Modules, in the order a study meets them:

- :mod:`.storage`: the Optuna storage URL (default ``sqlite:///mlruns/optuna.db``; PostgreSQL for
  several nodes), its SQLAlchemy options, loading a study.
- :mod:`.parent`: the study's parent MLflow run (the spec as written and resolved, versions, the
  outcome).
- :mod:`.sampler`: the live search space (the gate's wirings plus the spec's space) and the Optuna
  sampler.
- :mod:`.claims`: the claims table in the same database: a live trial's plan fingerprint is inserted
  under a unique constraint before it runs, so two workers never measure the same effective config;
  the loser of the race waits for the winner's result and tells Optuna that value without running
  anything.
- :mod:`.loop`: :class:`StudyRun`, one process's part of a study: stage 1, the baseline, the stage-2
  loop and its stop reasons. Crashed configs are told as PRUNED with an infeasibility constraint
  (TPE ignores FAIL trials and would propose them again); interrupted trials are told FAIL and
  measured again after ``--resume``.
- :mod:`.guide`: the throughput model's decisions (forecasts, expected improvement, identification,
  the vetoes it has earned); the loop keeps the sampler's turns and hands off when the model is
  stuck.
- :mod:`.model_summary`: the model at the study's end (its errors, what it skipped, its best per
  concurrency).
- :mod:`.confirm`: before "target reached", the candidate re-measured (with the baseline's launches
  where they are needed) until a one-sided confidence bound on their ratio clears the target, falls
  below it, or the budget is spent.
- :mod:`.resume`: what a killed process left running, cleaned up on ``--resume`` (trials, claims and
  the recorded servers of dead controllers), and trials whose worker stopped heart-beating, reaped
  by whichever node looks next (Optuna's RDB heartbeats).
- :mod:`.state`: :class:`StudyState`, what a study's process knows of its study (read by the
  candidates and the outcome), and its :class:`StudyProgress` events.
- :mod:`.outcome`: the :class:`StudyOutcome` that ``run --json`` prints.
- :mod:`.api`: :func:`run_study`, :func:`join_study` and their :class:`Options`.

Several nodes, one study (PostgreSQL): ``bisect-eagle run spec.yaml --storage
postgresql://user@db/optuna --tracking-uri http://mlflow-host:5000`` on one node creates the study,
runs stage 1 and the baseline and starts searching; ``bisect-eagle worker spec.yaml --storage <same
URL>`` on any other node joins it (it waits for stage 1, then shares the budget, the claims and the
stop condition). Log to one ``mlflow server`` over HTTP from several nodes: a SQLite MLflow store is
for one machine (docs/multinode.md).
"""

from bisect_eagle.search.study.api import (
    WORKER_WAIT_S,
    EngineFactory,
    Options,
    join_study,
    run_study,
)
from bisect_eagle.search.study.claims import Claim, Claims, ClaimState
from bisect_eagle.search.study.loop import DUPLICATE_LIMIT, StudyRun, TrialKind
from bisect_eagle.search.study.outcome import StudyOutcome
from bisect_eagle.search.study.sampler import AskTellGridSampler, live_space, make_sampler
from bisect_eagle.search.study.state import ProgressStage, StudyProgress
from bisect_eagle.search.study.storage import (
    default_storage,
    latest_study,
    open_storage,
    resolve_storage,
)

__all__ = [
    "DUPLICATE_LIMIT",
    "WORKER_WAIT_S",
    "AskTellGridSampler",
    "Claim",
    "ClaimState",
    "Claims",
    "EngineFactory",
    "Options",
    "ProgressStage",
    "StudyOutcome",
    "StudyProgress",
    "StudyRun",
    "TrialKind",
    "default_storage",
    "join_study",
    "latest_study",
    "live_space",
    "make_sampler",
    "open_storage",
    "resolve_storage",
    "run_study",
]
