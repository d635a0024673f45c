"""The SGLang releases the planner's rules are tested with: one list, the pins that install it, and the refusal of
any other installed release (the planner does not guess)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import tomllib

from bisect_eagle.artifacts import scenarios
from bisect_eagle.engines.oracle import Description
from bisect_eagle.engines.sglang.planner import Planner
from bisect_eagle.engines.sglang.rules import TESTED_SGLANG, untested_version
from bisect_eagle.spec.schema import SglangServer
from bisect_eagle.spec.settings import parse_settings

ROOT = Path(__file__).resolve().parents[3]


def test_the_pins_state_the_tested_releases():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["sglang"]
    assert extra == [f"sglang=={v}" for v in TESTED_SGLANG]
    setup = (ROOT / "scripts" / "setup_sglang_env.sh").read_text()
    assert re.findall(r"sglang==([0-9][0-9.]*)", setup) == list(TESTED_SGLANG)


def test_an_untested_release_is_one_line_naming_it_and_the_interpreter():
    assert untested_version("0.5.23", "/opt/sglang/bin/python") is None and untested_version(None, "x") is None
    why = untested_version("0.5.5", "/opt/sglang/bin/python")
    assert why.startswith("SGLang 0.5.5 (/opt/sglang/bin/python) is not a release the sglang planner is tested with")
    assert "(0.5.23)" in why and "sglang==0.5.23" in why and "\n" not in why


def _planner(tmp_path: Path, version: str | None, launch_command: list[str]) -> Planner:
    """A planner whose SGLang parser reports ``version`` (what the oracle's describe answers)."""
    tiny = scenarios.get("tiny")
    p = Planner(SglangServer(launch_command=launch_command, python="/opt/sglang/bin/python"), tiny.target,
                tiny.draft)
    desc = Description(prog="sglang serve", version=version, options=[])
    p.oracle = lambda: SimpleNamespace(available=False, describe=lambda: desc, failure=None, python=None)
    p.description = lambda: desc
    p._flags = SimpleNamespace(version=version, flags=frozenset(), source="parser")  # no --help probe
    return p


def test_the_planner_refuses_every_plan_on_an_untested_sglang(tmp_path):
    sglang = ["python", "-m", "sglang.launch_server"]
    old = _planner(tmp_path, "0.5.5", sglang).plan(parse_settings({}, "t"), port=30000, draft_dir=tmp_path / "d")
    assert old.refusal.startswith("SGLang 0.5.5 (/opt/sglang/bin/python) is not a release")
    baseline = _planner(tmp_path, "0.5.5", sglang).plan(parse_settings({"speculative_algorithm": "none"}, "t"),
                                                        port=30000, draft_dir=tmp_path / "d")
    assert baseline.refusal == old.refusal
    for version in ("0.5.23", None):  # tested, or not known: the plan goes on
        plan = _planner(tmp_path, version, sglang).plan(parse_settings({}, "t"), port=30000, draft_dir=tmp_path / "d")
        assert plan.refusal is None or "is not a release" not in plan.refusal, plan.refusal
    stand_in = _planner(tmp_path, "0.5.5", ["bisect-eagle", "serve"])  # not SGLang: its version is not SGLang's
    assert stand_in.version_refusal() is None
