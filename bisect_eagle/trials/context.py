"""What every trial of one study (or bisect, or reproduction) shares: its spec, store, parent run,
engine, baseline and target, and the meter of this process's engine runs. The study fills the
baseline, target and stage-1 accuracies as they become known;
:func:`~bisect_eagle.trials.live.run_live_trial` reads them and notes the child run it is measuring
(:attr:`TrialContext.run_id`), so a caller whose trial raised still knows its run without a
callback.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bisect_eagle.engines.base import Engine
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.spec.schema import Spec
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.owner import owner_id
from bisect_eagle.tracking.runs import Tracking
from bisect_eagle.trials.launches import Meter


@dataclass
class TrialContext:
    """What every live trial of one study shares."""

    spec: Spec
    tracking: Tracking
    study: str
    parent_run_id: str
    engine: Engine | None = None  # set once stage 1 is done (live trials only)
    baseline: float | None = None  # the criterion metric without speculation
    target: float | None = None  # criterion ratio × baseline
    baseline_tok_s: float | None = None  # output tok/s without speculation (the headline ratio)
    # stage-1 accuracy per wiring
    wiring_accuracy: dict[tuple[int, ...], float] = field(default_factory=dict)
    owner: str = field(default_factory=owner_id)
    # this process's engine runs and their seconds (shared by copies)
    meter: Meter = field(default_factory=Meter)
    # the child run of the trial run_live_trial started last (None before any)
    run_id: str | None = None

    @property
    def metric(self) -> str:
        return self.spec.criterion.metric

    def plan(self, settings: LiveSettings) -> TrialPlan:
        """The engine's plan for ``settings`` (its fingerprint is the trial's identity).

        Args:
            settings: the trial's requested live settings.

        Returns:
            The engine's plan: effective settings, launch details, fingerprint, or a refusal.

        Raises:
            RuntimeError: the context has no engine yet (before stage 1 is done).
        """
        if self.engine is None:
            raise RuntimeError("planning a live trial needs an engine in the trial context")
        return self.engine.plan(settings)
