"""A full `bisect-eagle run` through the sglang engine (one `bisect-eagle serve` per live trial):
every live trial's MLflow run carries its launch command, effective settings and server log, and no
server is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from helpers import own_children

pytestmark = pytest.mark.system

SPEC = Path(__file__).resolve().parents[2] / "experiments" / "tiny-sglang.yaml"


def test_run_of_tiny_sglang_logs_every_live_trial(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run(
        [sys.executable, "-m", "bisect_eagle.cli", "run", str(SPEC), "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode in (0, 3), done.stderr[-4000:]
    out = json.loads(done.stdout)
    client = MlflowClient(out["tracking_uri"])
    children = client.search_runs(
        [client.get_run(out["parent_run_id"]).info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{out['parent_run_id']}'",
    )
    live = [r for r in children if r.data.tags.get("stage") in ("baseline", "live")]
    assert live, "the run measured no live trial"
    for run in live:
        names = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"launch_command.txt", "effective.json", "server.log"} <= names, (
            run.info.run_name,
            names,
        )
        assert run.info.status == "FINISHED"
        command = Path(
            client.download_artifacts(run.info.run_id, "launch_command.txt", str(tmp_path))
        ).read_text()
        assert "serve" in command and "--port" in command
    assert not own_children()
