"""What a killed process left behind, cleaned up when a study is resumed (``run --resume``).

A process killed outright (SIGKILL, a lost node) leaves an Optuna trial RUNNING, an MLflow child run RUNNING
and a claim ``running``. On resume, those whose owner process (``host:pid:start``) is known dead on this host
become: the Optuna trial FAIL (Optuna's samplers then ignore it), the MLflow run FAILED with outcome
``interrupted`` (never reused as a cached result), the claim released (the config is measured again).
Trials owned by another host are left alone: this host cannot tell whether they still run.
"""

from __future__ import annotations

import datetime

import optuna
from optuna.trial import TrialState

from bisect_eagle.search.study.claims import Claims
from bisect_eagle.tracking import Tracking, owner_alive

UNNAMED_GRACE = datetime.timedelta(minutes=1)  # a trial without an owner yet may be a live process's, just asked


def reap_dead_trials(study: optuna.Study, *, claims: Claims, tracking: Tracking, parent_run_id: str) -> list[str]:
    """Mark what dead processes of this host left running; one note per trial handled, for the display."""
    notes = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = t.user_attrs.get("owner")
        if owner is None:  # killed between ask() and naming its owner
            age = datetime.datetime.now() - (t.datetime_start or datetime.datetime.now())
            alive = None if age < UNNAMED_GRACE else False
        else:
            alive = owner_alive(owner)
        if alive is False:
            study.tell(t.number, state=TrialState.FAIL)
            if "fingerprint" in t.user_attrs:
                claims.release(t.user_attrs["fingerprint"])
            notes.append(f"trial {t.number} was interrupted; marked FAIL (it will be measured again)")
        elif alive is None:
            notes.append(f"trial {t.number} is RUNNING on another host ({t.user_attrs.get('owner')}); left as is")
    for run in tracking.child_runs(parent_run_id):
        if run.info.status == "RUNNING" and owner_alive(run.data.tags.get("owner", "")) is False:
            tracking.log(run.info.run_id, tags={"outcome": "interrupted",
                                                "failure_detail": "the process running this trial was killed"})
            tracking.finish(run.info.run_id, "FAILED")
    for c in claims.all():
        if c.state == "running" and owner_alive(c.owner) is False:
            claims.release(c.fingerprint)
    return notes
