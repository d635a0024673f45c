"""Resuming after a kill: what a dead process of this host left running is failed, released and marked."""

from __future__ import annotations

import socket
import subprocess
import sys

import optuna
from optuna.trial import TrialState

from bisect_eagle.search.study.claims import Claims
from bisect_eagle.search.study.resume import reap_dead_trials
from bisect_eagle.search.study.storage import open_storage
from bisect_eagle.tracking import Tracking, owner_id


def test_dead_trials_are_failed_released_and_marked_interrupted(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path}/optuna.db"
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = f"{socket.gethostname()}:{done.stdout.strip()}:0"
    study = optuna.create_study(storage=open_storage(url), study_name="s")
    claims = Claims(url, "s")
    tracking = Tracking.open(f"sqlite:///{tmp_path}/mlflow.db", "resume")
    parent = tracking.start_run("s", tags={"role": "study"})

    killed = study.ask()
    killed.set_user_attr("owner", dead)
    killed.set_user_attr("fingerprint", "fp-dead")
    claims.claim("fp-dead", trial=killed.number, owner=dead)
    remote = study.ask()
    remote.set_user_attr("owner", "another-host:1:1")
    mine = study.ask()
    mine.set_user_attr("owner", owner_id())
    orphan_run = tracking.start_run("live 000", tags={"stage": "live", "owner": dead}, parent_run_id=parent)
    live_run = tracking.start_run("live 001", tags={"stage": "live", "owner": owner_id()}, parent_run_id=parent)

    notes = reap_dead_trials(study, claims=claims, tracking=tracking, parent_run_id=parent)

    states = {t.number: t.state for t in study.get_trials()}
    assert states == {killed.number: TrialState.FAIL, remote.number: TrialState.RUNNING,
                      mine.number: TrialState.RUNNING}
    assert claims.all() == []  # measured again
    assert tracking.get_run(orphan_run).info.status == "FAILED"
    assert tracking.get_run(orphan_run).data.tags["outcome"] == "interrupted"
    assert tracking.get_run(live_run).info.status == "RUNNING"
    assert len(notes) == 2 and "another-host" in notes[1]
