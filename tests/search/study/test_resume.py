"""Resuming after a kill: what a dead process of this host left running is failed, released and
marked."""

from __future__ import annotations

import socket
import subprocess
import sys

import optuna
from optuna.trial import TrialState

from bisect_eagle.search.study.claims import Claims
from bisect_eagle.search.study.resume import reap_dead_trials
from bisect_eagle.search.study.storage import open_storage
from bisect_eagle.tracking.owner import owner_id
from bisect_eagle.tracking.runs import Tracking


def test_dead_trials_are_failed_released_and_marked_interrupted(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path}/optuna.db"
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
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
    orphan_run = tracking.start_run(
        "live 000", tags={"stage": "live", "owner": dead}, parent_run_id=parent
    )
    live_run = tracking.start_run(
        "live 001", tags={"stage": "live", "owner": owner_id()}, parent_run_id=parent
    )

    notes = reap_dead_trials(study, claims=claims, tracking=tracking, parent_run_id=parent)

    states = {t.number: t.state for t in study.get_trials()}
    assert states == {
        killed.number: TrialState.FAIL,
        remote.number: TrialState.RUNNING,
        mine.number: TrialState.RUNNING,
    }
    assert claims.all() == []  # measured again
    assert tracking.get_run(orphan_run).info.status == "KILLED"
    assert tracking.get_run(orphan_run).data.tags["outcome"] == "interrupted"
    assert tracking.get_run(live_run).info.status == "RUNNING"
    assert len(notes) == 2 and "another-host" in notes[1]


def test_a_silent_trial_of_another_node_is_reaped_once_and_measured_again(tmp_path, monkeypatch):
    """Heartbeats on SQLite: a trial whose (remote) owner stopped beating is failed by one of two
    live processes, its claim released and its MLflow run closed KILLED; the trials of a live owner
    keep beating and stay."""
    import time

    from bisect_eagle.search.study.resume import Liveness

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    monkeypatch.setenv("BISECT_EAGLE_HEARTBEAT_S", "1")
    # 5 beats: a busy machine may delay one a few seconds
    monkeypatch.setenv("BISECT_EAGLE_GRACE_S", "5")
    url = f"sqlite:///{tmp_path}/optuna.db"
    storage = open_storage(url)
    study = optuna.create_study(storage=storage, study_name="s")
    claims = Claims(url, "s")
    tracking = Tracking.open(f"sqlite:///{tmp_path}/mlflow.db", "reap")
    parent = tracking.start_run("s", tags={"role": "study"})
    lost = study.ask()
    for key, value in (("owner", "node-b:7:7"), ("fingerprint", "fp-lost")):
        lost.set_user_attr(key, value)
    claims.claim("fp-lost", trial=lost.number, owner="node-b:7:7")
    run = tracking.start_run(
        "live 000", tags={"stage": "live", "owner": "node-b:7:7"}, parent_run_id=parent
    )
    lost.set_user_attr("mlflow_run_id", run)
    storage.record_heartbeat(lost._trial_id)  # it beat once, then its node died
    mine = study.ask()
    mine.set_user_attr("owner", owner_id())

    kw = {"study_name": "s", "claims": claims, "tracking": tracking, "parent_run_id": parent}
    a = Liveness(open_storage(url), owner=owner_id(), **kw)
    b = Liveness(open_storage(url), owner="x:1:1", **kw)
    with a, b:
        deadline = time.monotonic() + 20
        while (
            study.get_trials()[lost.number].state == TrialState.RUNNING
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        time.sleep(6.5)  # past another grace period: the live owner's trial must still be RUNNING

    states = {t.number: t.state for t in study.get_trials()}
    assert states == {lost.number: TrialState.FAIL, mine.number: TrialState.RUNNING}
    assert len(a.notes) + len(b.notes) == 1 and "node-b:7:7" in (a.notes + b.notes)[0]
    assert claims.all() == []  # released: the config is measured again
    assert claims.claim("fp-lost", trial=9, owner=owner_id()) == (True, None)
    closed = tracking.get_run(run)
    assert closed.info.status == "KILLED" and closed.data.tags["outcome"] == "interrupted"
    assert closed.data.tags["reaped_by"] in (owner_id(), "x:1:1")
