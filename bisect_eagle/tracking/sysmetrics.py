"""System metrics of the runs that measure an engine, when asked for: MLflow's own monitor, one per
run, stopped with the run.

Off unless ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING=true`` (MLflow's own switch, and MLflow's own
default): MLflow 3.17's run page lists every ``system/*`` metric in a group before the run's own
metrics (below), so a trial whose page opened on eight system metrics before its ``accept_length``
is a trial whose page opens on its own metrics now. On a GPU node, turn it on to see each trial's
GPU utilization, memory and power beside its tok/s.

MLflow samples CPU and system memory, disk and network (psutil) and, when NVML is importable
(``pip install nvidia-ml-py``), every GPU's utilization, memory and power, and logs them as metrics
named ``system/cpu_utilization_percentage``, ``system/system_memory_usage_megabytes``,
``system/gpu_0_utilization_percentage`` ... with ``step`` = sample number: the "System metrics" tab
of a run. ``mlflow.start_run(log_system_metrics=True)`` wires
:class:`mlflow.system_metrics.system_metrics_monitor.SystemMetricsMonitor` to the fluent API's
active run; bisect-eagle creates runs with ``MlflowClient`` (several can be open at once), so it
starts that public class itself with the run's id and tracking URI: its samples go to that run
whatever else is open.

A trial of the tiny scenario lasts a second or less, MLflow's default interval is 10 s, and its
monitor logs nothing for a period cut short by the end of the run. So the interval here is
:data:`SAMPLING_INTERVAL_S`, and :meth:`SystemMetrics.stop` joins the monitor's thread, takes one
last sample and logs the period it closes: every monitored run has at least one sample, taken at its
end. ``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` (seconds) overrides the interval.

Where MLflow 3.17's UI shows them: the run page's "System metrics" tab; its chart view, in a "System
metrics" section after the model metrics (``bisect-eagle ui``'s saved view opens it on the criterion
metric); and the run page's "Metrics" table, which lists every ``system/*`` metric in a group before
the "Model metrics" group whenever a run has both (fixed in that page's code: no metric name,
logging order, tag or view changes it short of dropping the ``system/`` prefix, which would also
empty that tab and section).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

# a trial of the tiny scenario lasts about a second, an SGLang trial minutes
SAMPLING_INTERVAL_S = 1.0
PREFIX = "system/"  # MLflow's prefix of every system metric
# MLflow's monitor logs four INFO lines per run ("Started monitoring system metrics." ...): noise on
# a terminal that shows one line per trial. Its warnings and errors still show.
logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)


def enabled() -> bool:
    """Whether to monitor: only when ``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING`` is set true (MLflow's
    switch).

    Returns:
        True when the switch is set true.
    """
    from mlflow.environment_variables import MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING as SWITCH

    return SWITCH.is_set() and bool(SWITCH.get())


class SystemMetrics:
    """The running system-metrics monitors of the runs one tracking object started, by run id
    (thread-safe)."""

    def __init__(self) -> None:
        self._monitors: dict[str, Any] = {}
        self._lock = threading.Lock()

    def start(self, run_id: str, *, tracking_uri: str) -> None:
        """Sample the system into ``run_id`` every :data:`SAMPLING_INTERVAL_S` until :meth:`stop`; a
        monitor that cannot start is logged and skipped (the run goes on without system metrics).

        Args:
            run_id: the MLflow run.
            tracking_uri: the tracking store the samples go to.
        """
        if not enabled():
            return
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        try:
            monitor = SystemMetricsMonitor(
                run_id, sampling_interval=SAMPLING_INTERVAL_S, tracking_uri=tracking_uri
            )
            monitor.start()
        # psutil or the store missing: the trial matters more than its system metrics
        except Exception as e:
            log.warning("run %s: system metrics not monitored (%s)", run_id, e, exc_info=e)
            return
        with self._lock:
            self._monitors[run_id] = monitor

    def stop(self, run_id: str) -> None:
        """End ``run_id``'s monitor (none: nothing to do): join its thread, then log one last sample
        with the samples of the period it cuts short.

        Args:
            run_id: the MLflow run.
        """
        with self._lock:
            monitor = self._monitors.pop(run_id, None)
        if monitor is None:
            return
        monitor.finish()
        try:
            monitor.collect_metrics()
            tail = monitor.aggregate_metrics()
            if tail:
                monitor.publish_metrics(tail)
                monitor.mlflow_logger.flush()
        except Exception as e:  # the store went away: the run ends without its last sample
            log.warning("run %s: last system-metrics sample not logged (%s)", run_id, e, exc_info=e)

    def running(self) -> list[str]:
        """The run ids whose monitors run.

        Returns:
            The run ids.
        """
        with self._lock:
            return list(self._monitors)
