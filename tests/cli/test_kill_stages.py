"""SIGKILL of `bisect-eagle run` (the tiny scenario, local engine) at every stage boundary -- just
after the study's parent run exists, in stage 1, in the baseline, in a live trial, in confirmation
-- then `run --resume`: it finishes, no MLflow run is left RUNNING, and no finished trial is
measured twice. The default spec confirms its deterministic accept length with the search's own
measurement (no confirmation run), so the confirmation case searches on tok/s, which confirmation
re-measures in interleaved pairs."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
RUNNING_STAGE = """SELECT t.value FROM runs r JOIN tags t ON t.run_uuid = r.run_uuid
                   WHERE r.status = 'RUNNING' AND t.key = ?"""


def _running(db: Path, key: str) -> set[str]:
    """The values of tag ``key`` on the RUNNING runs of the store (empty while it does not exist
    yet)."""
    if not db.exists():
        return set()
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
            return {v for (v,) in con.execute(RUNNING_STAGE, (key,))}
    except sqlite3.Error:
        return set()


def _kill_when(
    cwd: Path, env: dict, spec: list[str], *, key: str, value: str, timeout_s: float = 600
) -> bool:
    """Start `run`, SIGKILL it once a RUNNING run has tag ``key = value``; False when it finished
    first."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bisect_eagle.cli", "run", *spec, "--json"],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    db = cwd / "mlruns" / "mlflow.db"
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if value in _running(db, key):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                return True
            time.sleep(0.02)
        return False
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize(
    "key, value",
    [
        ("role", "study"),
        ("stage", "standalone"),
        ("stage", "baseline"),
        ("stage", "live"),
        ("stage", "confirm"),
    ],
)
def test_kill_at_a_stage_boundary_then_resume(tmp_path, key, value):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["OMP_NUM_THREADS"] = "1"
    spec = []
    if value == "confirm":
        text = (ROOT / "experiments" / "tiny.yaml").read_text()
        path = tmp_path / "tiny-tok-s.yaml"
        path.write_text(
            text.replace(
                "criterion: {metric: accept_length, ratio: 4.5}",
                "criterion: {metric: output_tok_s, ratio: 1.0}",
            )
        )
        spec = [str(path)]
    assert _kill_when(tmp_path, env, spec, key=key, value=value), (
        f"the run finished before a {key}={value} run"
    )
    done = subprocess.run(
        [sys.executable, "-m", "bisect_eagle.cli", "run", *spec, "--resume", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode in (0, 3), done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    out = json.loads(done.stdout)
    with sqlite3.connect(tmp_path / "mlruns" / "mlflow.db") as con:
        runs = con.execute(
            "SELECT r.run_uuid, r.status, t.value FROM runs r LEFT JOIN tags t ON t.run_uuid = "
            "r.run_uuid AND t.key = 'fingerprint'"
        ).fetchall()
        stages = dict(
            con.execute("SELECT run_uuid, value FROM tags WHERE key = 'stage'").fetchall()
        )
    assert not [r for r in runs if r[1] == "RUNNING"]
    finished = Counter(
        (stages.get(run), fp)
        for run, status, fp in runs
        if status == "FINISHED" and fp and stages.get(run) in ("standalone", "live", "baseline")
    )
    assert max(finished.values()) == 1, finished  # nothing measured twice
    assert out["parent_run_id"] and out["stop_reason"]
