"""What dead processes left behind: failed, released and closed, on this host at ``--resume`` and on
any node live.

A process killed outright (SIGKILL, a lost node) leaves an Optuna trial RUNNING, an MLflow child run
RUNNING, a claim ``running`` and, with the sglang engine, maybe a server. Two ways clean that up:

- **Live, from any node** (:class:`Liveness`): every process of a study beats Optuna's heartbeat for
  the RUNNING trials it owns and, once per heartbeat interval, fails the trials of the study whose
  beats stopped for the grace period (``optuna.storages.fail_stale_trials``; one process wins each
  trial, decided by :meth:`Claims.take_reap`). The winner releases the trial's claim (the config is
  measured again, exactly once: the claims table's unique constraint) and closes its MLflow run
  KILLED, tagged ``outcome=interrupted`` and ``reaped_by``. SQLite and PostgreSQL alike
  (:func:`bisect_eagle.search.study.storage.liveness` sets the interval and the grace).
- **At ``run --resume``, on this host**: first :func:`reap_dead_servers` ends the recorded servers
  of dead controllers (:func:`bisect_eagle.engines.procs.server.reap_servers`) and closes their runs
  KILLED; then :func:`reap_dead_trials` fails what dead processes of this host (``host:pid:start``)
  left RUNNING, without waiting for the grace period. Trials owned by another host are left to
  :class:`Liveness`.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
import time
import warnings
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from bisect_eagle.engines.procs.server import reap_servers
from bisect_eagle.search.study.claims import Claims
from bisect_eagle.tracking.owner import owner_alive
from bisect_eagle.tracking.runs import Tracking

log = logging.getLogger(__name__)

# a trial without an owner yet may be a live process's, just asked
UNNAMED_GRACE = datetime.timedelta(minutes=1)
# how often Liveness looks for new trials of its own (their first beat comes at most this late)
TICK_S = 1.0


def _trial_runs(tracking: Tracking, parent_run_id: str, trial: FrozenTrial) -> list[str]:
    """The MLflow runs of one Optuna trial: its ``mlflow_run_id``, or the children tagged with its
    number."""
    if "mlflow_run_id" in trial.user_attrs:
        return [trial.user_attrs["mlflow_run_id"]]
    return [
        r.info.run_id
        for r in tracking.child_runs(parent_run_id)
        if r.data.tags.get("trial_number") == str(trial.number)
    ]


class Liveness:
    """This process's heartbeats for the trials it runs, and the reaping of silent trials of any
    process.

    Use as a context manager around the search; a daemon thread does the work and stops on exit.
    ``notes`` collects one line per trial this process reaped.
    """

    def __init__(
        self,
        storage: optuna.storages.RDBStorage,
        *,
        study_name: str,
        owner: str,
        claims: Claims,
        tracking: Tracking,
        parent_run_id: str,
    ):
        self.storage = storage
        self.study_name = study_name
        self.owner = owner
        self.claims = claims
        self.tracking = tracking
        self.parent_run_id = parent_run_id
        self.interval = float(storage.heartbeat_interval or 1)
        self.notes: list[str] = []
        self._stop = threading.Event()
        self._beaten: dict[int, float] = {}  # trial id -> monotonic time of its last beat
        self._reaped_at = 0.0
        self._thread = threading.Thread(target=self._run, name="bisect-eagle-liveness", daemon=True)
        storage.heartbeat_stale_trial_callback = self._reaped

    def __enter__(self) -> Liveness:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        # a cache of its own
        study = optuna.load_study(storage=self.storage, study_name=self.study_name)
        while not self._stop.is_set():
            try:
                self.beat(study)
                if time.monotonic() - self._reaped_at >= self.interval:
                    self._reaped_at = time.monotonic()
                    self.reap(study)
            except Exception as e:  # a store hiccup: beat again at the next tick
                log.warning(
                    "heartbeat of %s: %s",
                    self.owner,
                    str(e).splitlines()[0] if str(e) else type(e).__name__,
                    exc_info=e,
                )
            self._stop.wait(min(TICK_S, self.interval))

    def beat(self, study: optuna.Study) -> None:
        """Record a heartbeat for each RUNNING trial of this owner not beaten within the
        interval."""
        now = time.monotonic()
        mine = [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.user_attrs.get("owner") == self.owner
        ]
        for t in mine:
            if now - self._beaten.get(t._trial_id, -self.interval) >= self.interval:
                self.storage.record_heartbeat(t._trial_id)
                self._beaten[t._trial_id] = now
        self._beaten = {k: v for k, v in self._beaten.items() if k in {t._trial_id for t in mine}}

    def beat_trial(self, trial_id: int) -> None:
        """Record a heartbeat now for a trial this process has just asked (its first: a trial Optuna
        holds no heartbeat for is never stale, so a process killed before the thread's next tick
        would leave it RUNNING)."""
        self.storage.record_heartbeat(trial_id)
        self._beaten[trial_id] = time.monotonic()

    def reap(self, study: optuna.Study) -> None:
        """Fail the study's trials whose heartbeats stopped for the grace period (``_reaped`` runs
        for each)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)

    def _reaped(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """A trial this process just failed for silence: release its claim, close its MLflow run
        KILLED.

        Only the process that wins :meth:`Claims.take_reap` for the trial acts (on SQLite two may
        have failed it).
        """
        if not self.claims.take_reap(trial.number, reaper=self.owner):
            return
        owner = trial.user_attrs.get("owner", "an unknown process")
        grace = self.storage.grace_period or 2 * self.interval
        fp = trial.user_attrs.get("fingerprint")
        released = fp is not None and self.claims.release(fp, trial=trial.number)
        detail = f"its worker {owner} stopped heart-beating for {grace:g} s; reaped by {self.owner}"
        for run_id in _trial_runs(self.tracking, self.parent_run_id, trial):
            with contextlib.suppress(Exception):  # the run may be gone or already ended
                self.tracking.end_killed(run_id, detail=detail, reaped_by=self.owner)
        again = " (its config will be measured again)" if released else ""
        self.notes.append(
            f"trial {trial.number} of {owner} failed: no heartbeat for {grace:g} s{again}"
        )


def reap_dead_servers(log_dir: Path, *, tracking: Tracking, parent_run_id: str | None) -> list[str]:
    """End the recorded servers under ``log_dir`` of dead controllers on this host and close their
    runs KILLED.

    The runs closed are the RUNNING child runs of ``parent_run_id`` measuring a reaped server's
    fingerprint, and the parent run itself when it is still RUNNING (its controller is dead). One
    note per server.
    """
    notes = []
    reaped = reap_servers(log_dir)
    for r in reaped:
        rec = r.record
        if rec is None:
            notes.extend(r.warnings)
            continue
        notes.append(
            f"server of dead controller pid {rec.controller_pid} (trial {rec.meta.get('trial')}, "
            f"port {rec.port}): {r.status}" + "".join(f"; {w}" for w in r.warnings)
        )
        fp = rec.meta.get("fingerprint")
        if parent_run_id and fp:
            for run in tracking.child_runs(parent_run_id):
                if run.data.tags.get("fingerprint") == fp and run.info.status == "RUNNING":
                    tracking.end_killed(
                        run.info.run_id, detail="the controller running this trial was killed"
                    )
    if reaped and parent_run_id:
        tracking.end_killed(parent_run_id, detail="the controller running this study was killed")
    return notes


def reap_dead_trials(
    study: optuna.Study, *, claims: Claims, tracking: Tracking, parent_run_id: str
) -> list[str]:
    """Mark what dead processes of this host left running; one note per trial handled, for the
    display."""
    notes = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.user_attrs.get("owner")
        if owner is None:  # killed between ask() and naming its owner
            age = datetime.datetime.now() - (t.datetime_start or datetime.datetime.now())
            alive = None if age < UNNAMED_GRACE else False
        else:
            alive = owner_alive(owner)
        if alive is False:
            runs = _trial_runs(tracking, parent_run_id, t)
            # its run, found by its number: linked
            if len(runs) == 1 and "mlflow_run_id" not in t.user_attrs:
                study._storage.set_trial_user_attr(t._trial_id, "mlflow_run_id", runs[0])
            study.tell(t.number, state=TrialState.FAIL)
            if "fingerprint" in t.user_attrs:
                claims.release(t.user_attrs["fingerprint"], trial=t.number)
            notes.append(
                f"trial {t.number} was interrupted; marked FAIL (it will be measured again)"
            )
        elif alive is None:
            notes.append(
                f"trial {t.number} is RUNNING on another host ({t.user_attrs.get('owner')}); left "
                "to its heartbeat"
            )
    for run in tracking.child_runs(parent_run_id):
        if run.info.status == "RUNNING" and owner_alive(run.data.tags.get("owner", "")) is False:
            tracking.end_killed(run.info.run_id, detail="the process running this trial was killed")
    for c in claims.all():
        if c.state == "running" and owner_alive(c.owner) is False:
            claims.release(c.fingerprint)
    return notes
