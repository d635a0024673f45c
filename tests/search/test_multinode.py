"""One study on several nodes for real (scripts/multinode_check.sh): PostgreSQL, `mlflow server`, a
controller and two workers in their own network namespaces; one worker SIGKILLed mid-trial is reaped
by heartbeat, and the study ends with nothing lost, nothing measured twice and no run left
RUNNING."""

from __future__ import annotations

import glob
import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.system

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "multinode_check.sh"


def test_multinode_study_survives_a_killed_worker():
    missing = None
    if not glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        missing = "PostgreSQL is not installed (apt-get install postgresql)"
    elif os.geteuid() != 0:
        missing = "needs root (network namespaces, PostgreSQL run as user postgres)"
    if missing:
        if os.environ.get("BISECT_EAGLE_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"BISECT_EAGLE_REQUIRE_POSTGRES=1 but {missing}")
        pytest.skip(missing)
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=420)
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-4000:]
    out = json.loads(lines[-1])
    assert done.returncode == 0, (out, done.stderr[-4000:])
    assert out["workers"] == 2 and out["fingerprints"] == 4 and out["trials"] == 4
    assert out["duplicates"] == 0 and out["lost"] == 0 and out["runs_left_running"] == 0
    assert out["reaped"] >= 1
    assert "SIGKILLed worker pid" in done.stderr
