"""Launches, the unit of a study's cost: one :meth:`Engine.run
<bisect_eagle.engines.base.Engine.run>` of a server engine starts one server (minutes to half an
hour for a large target), so a study or a bisect is priced in launches, not in live trials: a live
trial with ``search.repeats: 3`` is three launches, a confirmation of 6 pairs twelve. The local
engine runs in this process (:attr:`~bisect_eagle.spec.schema.EngineSpec.in_process`): its runs are
counted the same way and called *runs* (:func:`launch_unit`).

Where a count comes from:

- every child run that :func:`~bisect_eagle.trials.live.run_live_trial` records carries the metric
  :data:`LAUNCHES`, the engine runs it made (0 for a refused plan, which never runs);
  :func:`count_launches` sums them per stage tag (``baseline``, ``live``, ``confirm``), so every
  worker of a study and a resumed study see the same study-wide count. A run that never recorded its
  count (killed while its engine ran, or recorded before the metric existed) counts its ``repeats``
  metric if it has one, else 1;
- :class:`Meter`, shared by a :class:`~bisect_eagle.trials.context.TrialContext` and its copies,
  counts this process's engine runs through ``run_live_trial`` and the seconds inside them (the
  engine's time, which the tool's own overhead excludes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from bisect_eagle.spec.schema import Spec
from bisect_eagle.tracking.runs import Tracking

LAUNCHES = "launches"  # metric of a trial's child run: the engine runs it made
STAGES = ("live", "confirm", "baseline")  # the stage tags a study's launches are split by
LaunchUnit = Literal["launches", "runs"]


def launch_unit(spec: Spec) -> LaunchUnit:
    """What one engine run of ``spec``'s engine is called: ``runs`` in process (the local engine),
    else ``launches`` (a server started per run).

    Args:
        spec: the study's or bisect's spec.

    Returns:
        ``"runs"`` or ``"launches"``.
    """
    return "runs" if spec.engine.in_process else "launches"


@dataclass
class Meter:
    """This process's engine runs made through ``run_live_trial``, and the seconds spent inside
    them.

    Mutable and shared: ``dataclasses.replace`` of a trial context keeps the same meter, so a
    confirmation's one-repeat copy of the context counts into the study's meter.
    """

    runs: int = 0
    engine_s: float = 0.0
    # this process's CPU inside engine runs (an in-process engine's own work)
    engine_cpu_s: float = 0.0

    def add(self, seconds: float, *, cpu_s: float = 0.0) -> None:
        """One engine run that took ``seconds`` of wall time and ``cpu_s`` of this process's CPU.

        Args:
            seconds: its wall time.
            cpu_s: this process's CPU seconds during it.
        """
        self.runs += 1
        self.engine_s += seconds
        self.engine_cpu_s += cpu_s


@dataclass(frozen=True, kw_only=True)
class Launches:
    """A study's engine runs by stage, and what one is called (:func:`launch_unit`)."""

    live: int = 0  # the search's live trials (repeats included)
    confirm: int = 0  # re-measurements of candidates and the baseline beside them
    baseline: int = 0  # the baseline trial
    unit: LaunchUnit = "launches"

    @property
    def total(self) -> int:
        return self.live + self.confirm + self.baseline

    def to_json(self) -> dict[str, Any]:
        """``{"total", "live", "confirm", "baseline", "unit"}``: what the outcome and ``--json``
        carry.

        Returns:
            The counts as ints and the unit, ``total`` their sum.
        """
        return {
            "total": self.total,
            "live": self.live,
            "confirm": self.confirm,
            "baseline": self.baseline,
            "unit": self.unit,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Launches:
        """The inverse of :meth:`to_json` (``total`` is derived, not read).

        Args:
            data: a :meth:`to_json` mapping; a missing count is 0, a missing unit ``"launches"``.

        Returns:
            The launches.
        """
        return cls(
            live=int(data.get("live", 0)),
            confirm=int(data.get("confirm", 0)),
            baseline=int(data.get("baseline", 0)),
            unit=data.get("unit", "launches"),
        )

    def summary(self) -> str:
        """``17 launches (live 5, confirm 12, baseline 0)``: one line for a person.

        Returns:
            The total with its unit, then each stage's count.
        """
        return (
            f"{self.total} {self.unit} (live {self.live}, confirm {self.confirm}, baseline "
            f"{self.baseline})"
        )

    def metrics(self) -> dict[str, float]:
        """The parent run's metrics: ``launches``, ``launches_live``, ``launches_confirm``,
        ``launches_baseline`` (the same names for the local engine's runs; the unit is the outcome's
        ``launches.unit``).

        Returns:
            Metric name → count, as floats (MLflow's metric type).
        """
        return {
            LAUNCHES: float(self.total),
            f"{LAUNCHES}_live": float(self.live),
            f"{LAUNCHES}_confirm": float(self.confirm),
            f"{LAUNCHES}_baseline": float(self.baseline),
        }


def run_launches(metrics: Mapping[str, float]) -> int:
    """The engine runs one child run made, from its metrics (:data:`LAUNCHES`, else ``repeats``,
    else 1)."""
    if LAUNCHES in metrics:
        return int(metrics[LAUNCHES])
    return int(metrics.get("repeats", 1))


def count_launches(
    tracking: Tracking, parent_run_id: str, *, unit: LaunchUnit = "launches"
) -> Launches:
    """Every engine run recorded under ``parent_run_id`` (all workers), split by the child runs'
    stage tags; child runs of other stages are not counted.

    Args:
        tracking: the store the study logs to.
        parent_run_id: the study's (or bisect's) parent run.
        unit: what one engine run is called (:func:`launch_unit`).

    Returns:
        The counts by stage; a child run counts its ``launches`` metric, else ``repeats``, else 1.
    """
    counts = dict.fromkeys(STAGES, 0)
    for run in tracking.child_runs(parent_run_id):
        stage = run.data.tags.get("stage")
        if stage in counts:
            counts[stage] += run_launches(run.data.metrics)
    return Launches(**counts, unit=unit)
