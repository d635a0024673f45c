"""SIGKILL of `bisect-eagle run` during a live sglang-engine trial (stand-in server `bisect-eagle
serve`), then `run --resume`: no server process survives, its port is free, no MLflow run is left
RUNNING, and the killed trial's config is measured once after the resume (nothing lost, nothing
repeated)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.system

SPEC = Path(__file__).resolve().parents[2] / "experiments" / "tiny-sglang.yaml"


def _alive(pid: int, start: float | None) -> bool:
    try:
        return start is None or abs(psutil.Process(pid).create_time() - start) < 0.05
    except psutil.NoSuchProcess:
        return False


def _live_record(records: Path, deadline: float) -> dict | None:
    """The server record of the first live trial (the baseline's is trial 1), once its server is
    up."""
    while time.monotonic() < deadline:
        for path in sorted(records.glob("*.json")):
            try:
                rec = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if rec["meta"].get("trial", 0) >= 2 and rec["port"]:
                with socket.socket() as s:
                    if s.connect_ex((rec["host"], rec["port"])) == 0:
                        return rec
        time.sleep(0.1)
    return None


def test_sigkill_during_a_live_sglang_trial_then_resume(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    cmd = [sys.executable, "-m", "bisect_eagle.cli", "run", str(SPEC), "--json"]
    controller = subprocess.Popen(
        cmd,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        rec = _live_record(
            tmp_path / "mlruns" / "logs" / "tiny-sglang" / "servers", time.monotonic() + 400
        )
        assert rec is not None, "no live trial's server came up"
        controller.send_signal(signal.SIGKILL)
        controller.wait(timeout=30)
    finally:
        if controller.poll() is None:
            os.killpg(controller.pid, signal.SIGKILL)
            controller.wait()
    done = subprocess.run(
        [*cmd, "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode in (0, 3), done.stderr[-4000:]
    out = json.loads(done.stdout)

    assert not _alive(rec["server_pid"], rec["server_start"]) and not _alive(
        rec["pgid"], rec["supervisor_start"]
    )
    assert not [
        p
        for p in psutil.process_iter(["environ"])
        if rec["token"] in json.dumps(p.info["environ"] or {})
    ]
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((rec["host"], rec["port"]))  # the port is free
    assert not list((tmp_path / "mlruns" / "logs" / "tiny-sglang" / "servers").glob("*.json"))

    client = MlflowClient(out["tracking_uri"])
    runs = client.search_runs([out["experiment_id"]], max_results=1000)
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    live = [r for r in runs if r.data.tags.get("stage") == "live"]
    measured = Counter(r.data.tags["fingerprint"] for r in live if r.info.status == "FINISHED")
    fp = rec["meta"]["fingerprint"]
    # measured again, once (unless done)
    assert measured[fp] == 1 or (measured[fp] == 0 and out["target_reached"])
    assert max(measured.values()) == 1  # nothing repeated
    killed = [r for r in live if r.data.tags["fingerprint"] == fp and r.info.status != "FINISHED"]
    assert [r.info.status for r in killed] == ["KILLED"]
    assert client.get_run(out["parent_run_id"]).info.status == "FINISHED"
