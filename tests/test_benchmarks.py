"""The benchmarks cannot rot: each `scripts/bench_*.py` runs in its quick mode and ends with the one
JSON line it documents (the figures themselves are the benchmarks' business, not a timed test's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[1]
QUICK = {  # script -> (quick arguments, keys its JSON line holds)
    "bench_model.py": (["--quick"], {"model_median_rel_error", "interval_coverage", "cost_fit"}),
    "bench_search.py": (
        ["--seeds", "1", "--bisects", "1"],
        {
            "family_members",
            "default_launches_median",
            "model_off_launches_median",
            "worst_member_ratio",
            "members_default_failed",
            "false_success_rate",
            "first_prediction_rel_error",
            "interval_coverage",
            "gate_dropped_true_wiring_rate",
            "tool_cpu_s_per_trial",
            "bisect_correct_rate",
        },
    ),
    "bench_bisect.py": (
        ["--per-world", "1", "--members", "2"],
        {
            "bisect_exact_rate",
            "bisect_false_culprit_rate",
            "bisect_launches_median",
            "bisect_launches_max",
        },
    ),
    "bench_standalone.py": (["--repeats", "1"], {"overhead_ratio", "whole_s", "bare_s"}),
    "bench_engine.py": (["--quick"], {"rows"}),
}


def test_every_benchmark_has_a_quick_mode_here():
    assert {p.name for p in (ROOT / "scripts").glob("bench_*.py")} == set(QUICK)


@pytest.mark.parametrize("script", sorted(QUICK))
def test_the_quick_mode_ends_with_its_json_line(script, tmp_path):
    args, keys = QUICK[script]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert keys <= set(last), sorted(last)
