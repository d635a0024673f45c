"""What a study's process knows of its study, apart from how it runs trials: the spec, the Optuna
study and its claims, the trial context, the budgets, the launches spent, and the progress events it
emits.

:class:`StudyState` is the part of a study's process that the candidates' confirmation
(:mod:`~bisect_eagle.search.study.candidates`) and the outcome
(:mod:`~bisect_eagle.search.study.outcome`) read; the loop's
:class:`~bisect_eagle.search.study.loop.StudyRun` extends it with stage 1, the baseline and the
stage-2 loop. It has a module of its own so that those readers need not import the loop that calls
them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import optuna

from bisect_eagle.search.study.claims import Claims
from bisect_eagle.search.study.spend import Spend
from bisect_eagle.spec.schema import Spec
from bisect_eagle.trials.context import TrialContext
from bisect_eagle.trials.launches import Launches, launch_unit

ProgressStage = Literal[
    "plan", "standalone", "baseline", "waiting", "resume", "live", "confirm", "done"
]


@dataclass(kw_only=True)
class StudyProgress:
    """One progress event for a display."""

    stage: ProgressStage
    message: str
    done: int = 0  # live trials measured (all workers)
    total: int = 0  # max live trials
    best: float | None = None
    target: float | None = None
    elapsed_s: float = 0.0
    max_wall_s: float = 0.0


@dataclass(kw_only=True)
class StudyState:
    """One process's view of its study: what it was given, what it spent, and its progress
    events."""

    spec: Spec
    study: optuna.Study
    claims: Claims
    ctx: TrialContext
    storage_url: str
    max_live_trials: int
    max_wall_s: float
    progress: Callable[[StudyProgress], None]
    seed: int = 0
    started: float = field(default_factory=time.monotonic)
    max_launches: int | None = None  # search.max_launches: engine runs of the whole study
    # launches and the tool's own seconds (set from ctx in __post_init__)
    spend: Spend = field(init=False)

    def __post_init__(self) -> None:
        self.spend = Spend(meter=self.ctx.meter, unit=launch_unit(self.spec))

    @property
    def name(self) -> str:
        """The Optuna study's name."""
        return self.study.study_name

    def attr(self, key: str) -> Any:
        """A study user attribute (shared by all workers): gate, baseline, target, baseline_run_id,
        ...

        Args:
            key: the attribute's name.

        Returns:
            Its value, or None when the study has none.
        """
        return self.study.user_attrs.get(key)

    def elapsed(self) -> float:
        """Seconds since this process started its part of the study.

        Returns:
            The seconds (monotonic clock).
        """
        return time.monotonic() - self.started

    def emit(self, stage: ProgressStage, message: str) -> None:
        """A progress event for the display: ``message`` with the measured count, best value and
        clock."""
        done = self.claims.all()
        best = max((c.value for c in done if c.state == "ok" and c.value is not None), default=None)
        self.progress(
            StudyProgress(
                stage=stage,
                message=message,
                done=len(done),
                total=self.max_live_trials,
                best=best,
                target=self.ctx.target,
                elapsed_s=self.elapsed(),
                max_wall_s=self.max_wall_s,
            )
        )

    def launches(self) -> Launches:
        """The study's launches so far, all workers (:meth:`Spend.launches`).

        Returns:
            The launches counted.
        """
        state = (
            tuple((c.fingerprint, c.state) for c in self.claims.all()),
            tuple(self.attr("confirmations") or ()),
        )
        return self.spend.launches(self.ctx.tracking, self.ctx.parent_run_id, state=state)
