"""What a study spends: server launches (study-wide, against ``search.max_launches``) and the tool's
own seconds.

Launches (:mod:`bisect_eagle.trials.launches`) are counted from the study's child runs, so every
worker sees the launches of all of them: the baseline, each live trial's repeats and every
confirmation's re-measurements. Reading the runs costs a query of the tracking store, so
:meth:`Spend.launches` reads them again only when something that launches may have happened since
the last look: this process ran the engine, or the study's claims or confirmations changed (another
worker's trial started, finished or was confirmed). Another worker's confirmation still in progress
is seen once it is stored; a budget shared by workers can therefore be overrun by the launches in
flight when it is reached, as ``max_live_trials`` can be by the trials in flight.

The tool's own time (:meth:`Spend.tool_time`) is the wall time of each step of the loop minus the
seconds the engine ran within it (:class:`~bisect_eagle.trials.launches.Meter`): deciding whether to
stop (confirmation bookkeeping included), steering with the throughput model (its forecasts of every
untried config), asking Optuna, planning, claiming and recording. ``tool_overhead_s_per_trial`` is
that total over the live trials this process measured. Wall time grows with whatever else the
machine runs, so the same steps are also measured as this process's CPU time less the CPU an
in-process engine spent in its runs: ``tool_cpu_s_per_trial``, the cost of the tool itself (a server
engine's CPU is its own processes', never this one's).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field

from bisect_eagle.tracking.runs import Tracking
from bisect_eagle.trials.launches import Launches, LaunchUnit, Meter, count_launches


@dataclass(kw_only=True)
class Spend:
    """One process's account of its study's cost (module docstring)."""

    meter: Meter  # the trial context's: this process's engine runs and their seconds
    unit: LaunchUnit = "launches"
    tool_s: float = 0.0  # the tool's own seconds in the loop
    tool_cpu_s: float = 0.0  # this process's CPU seconds in the loop, less an in-process engine's
    measured: int = 0  # live trials this process measured
    _seen: tuple[Hashable, int] | None = field(default=None, repr=False)
    _count: Launches | None = field(default=None, repr=False)

    @contextlib.contextmanager
    def tool_time(self) -> Iterator[None]:
        """Adds the block's wall time, less the engine's seconds within it, to :attr:`tool_s`."""
        t0, engine0 = time.perf_counter(), self.meter.engine_s
        cpu0, engine_cpu0 = time.process_time(), self.meter.engine_cpu_s
        try:
            yield
        finally:
            self.tool_s += time.perf_counter() - t0 - (self.meter.engine_s - engine0)
            self.tool_cpu_s += time.process_time() - cpu0 - (self.meter.engine_cpu_s - engine_cpu0)

    def per_trial(self) -> float | None:
        """The tool's own wall seconds per live trial measured here; None before the first."""
        return self.tool_s / self.measured if self.measured else None

    def cpu_per_trial(self) -> float | None:
        """The tool's own CPU seconds per live trial measured here; None before the first."""
        return self.tool_cpu_s / self.measured if self.measured else None

    def launches(self, tracking: Tracking, parent_run_id: str, *, state: Hashable) -> Launches:
        """The study's launches so far (all workers). ``state`` is what others change when they
        launch (the study's claims and confirmations): the runs are read again only when it or this
        process's engine-run count changed since the last call.

        Args:
            tracking: the tracking store.
            parent_run_id: the study's parent run.
            state: what others change when they launch.

        Returns:
            The launches counted (:func:`count_launches`), cached while ``state`` and the
            count stay the same.
        """
        seen = (state, self.meter.runs)
        if self._count is None or seen != self._seen:
            self._count = count_launches(tracking, parent_run_id, unit=self.unit)
            self._seen = seen
        return self._count
