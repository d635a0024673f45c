"""``run --dry-run``: every live config planned by the engine, nothing run, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bisect_eagle.engines import make_engine
from bisect_eagle.errors import BadInput
from bisect_eagle.search.study.dryrun import plan_study
from bisect_eagle.spec.load import load_spec

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments"


def write(path: Path, space: str) -> Path:
    path.write_text(f"name: dry\nscenario: tiny\nspace:\n{space}")
    return path


def test_the_tiny_space_is_planned_whole_with_its_refusals_grouped(tmp_path):
    spec = load_spec(write(tmp_path / "dry.yaml", "  num_steps: {type: int, low: 1, high: 3}\n"
                                                  "  topk: {type: categorical, choices: [1, 2]}\n"))
    p = plan_study(spec, engine_factory=make_engine)
    assert (p.engine, p.configs, p.listed) == ("local", 6, True)
    assert p.refused == {"num_draft_tokens is required when topk > 1": 3} and p.launchable == 3
    assert p.checked == {"the engine's own rules": 3}
    assert p.baseline is not None and p.baseline["refusal"] is None and len(p.baseline["fingerprint"]) == 16
    assert p.budget["max_live_trials"] == spec.search.max_live_trials


def test_a_space_the_engine_refuses_whole_is_bad_input(tmp_path):
    spec = load_spec(write(tmp_path / "dry.yaml", "  topk: {type: categorical, choices: [2, 4]}\n"))
    with pytest.raises(BadInput, match="refuses all 2 configs of the space"):
        plan_study(spec, engine_factory=make_engine)


def test_a_float_range_is_sampled_and_says_so(tmp_path):
    raw = yaml.safe_load((EXPERIMENTS / "tiny-sglang.yaml").read_text())
    raw["space"] = {"env.SGLANG_TEST_FRACTION": {"type": "float", "low": 0.5, "high": 0.9}}
    (tmp_path / "dry.yaml").write_text(yaml.safe_dump(raw))
    p = plan_study(load_spec(tmp_path / "dry.yaml"), engine_factory=make_engine)
    assert (p.engine, p.listed, p.configs, p.launchable) == ("sglang", False, 200, 200)


def test_the_command_writes_nothing(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bisect_eagle.cli", "run", "--dry-run", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["configs"] > 1
    assert list(tmp_path.iterdir()) == []
