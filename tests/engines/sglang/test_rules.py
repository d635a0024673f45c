"""SGLang's speculative rules as every engine applies them, and the SGLang releases the planner's
rules are tested with: one list, the pins that install it, and the refusal of any other installed
release (the planner does not guess)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomllib

from bisect_eagle.artifacts import scenarios
from bisect_eagle.engines.oracle import Description
from bisect_eagle.engines.sglang.planner import Planner
from bisect_eagle.engines.sglang.rules import (
    TESTED_SGLANG,
    apply_speculative_rules,
    speculative_effective,
    untested_version,
)
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import SglangServer
from bisect_eagle.spec.settings import LiveSettings, parse_settings

ROOT = Path(__file__).resolve().parents[3]


def test_the_pins_state_the_tested_releases():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["sglang"]
    assert extra == [f"sglang=={v}" for v in TESTED_SGLANG]
    setup = (ROOT / "scripts" / "setup_sglang_env.sh").read_text()
    assert re.findall(r"sglang==([0-9][0-9.]*)", setup) == list(TESTED_SGLANG)


def test_an_untested_release_is_one_line_naming_it_and_the_interpreter():
    assert (
        untested_version("0.5.23", "/opt/sglang/bin/python") is None
        and untested_version(None, "x") is None
    )
    why = untested_version("0.5.5", "/opt/sglang/bin/python")
    assert why.startswith(
        "SGLang 0.5.5 (/opt/sglang/bin/python) is not a release the sglang planner is tested with"
    )
    assert "(0.5.23)" in why and "sglang==0.5.23" in why and "\n" not in why


def _planner(tmp_path: Path, version: str | None, launch_command: list[str]) -> Planner:
    """A planner whose SGLang parser reports ``version`` (what the oracle's describe answers)."""
    tiny = scenarios.get("tiny")
    p = Planner(
        SglangServer(launch_command=launch_command, python="/opt/sglang/bin/python"),
        tiny.target,
        tiny.draft,
    )
    desc = Description(prog="sglang serve", version=version, options=[])
    p.oracle = lambda: SimpleNamespace(
        available=False, describe=lambda: desc, failure=None, python=None
    )
    p.description = lambda: desc
    # no --help probe
    p._flags = SimpleNamespace(version=version, flags=frozenset(), source="parser")
    return p


def test_the_planner_refuses_every_plan_on_an_untested_sglang(tmp_path):
    sglang = ["python", "-m", "sglang.launch_server"]
    old = _planner(tmp_path, "0.5.5", sglang).plan(
        parse_settings({}, "t"), port=30000, draft_dir=tmp_path / "d"
    )
    assert old.refusal.startswith("SGLang 0.5.5 (/opt/sglang/bin/python) is not a release")
    baseline = _planner(tmp_path, "0.5.5", sglang).plan(
        parse_settings({"speculative_algorithm": "none"}, "t"), port=30000, draft_dir=tmp_path / "d"
    )
    assert baseline.refusal == old.refusal
    for version in ("0.5.23", None):  # tested, or not known: the plan goes on
        plan = _planner(tmp_path, version, sglang).plan(
            parse_settings({}, "t"), port=30000, draft_dir=tmp_path / "d"
        )
        assert plan.refusal is None or "is not a release" not in plan.refusal, plan.refusal
    # not SGLang: its version is not SGLang's
    stand_in = _planner(tmp_path, "0.5.5", ["bisect-eagle", "serve"])
    assert stand_in.version_refusal() is None


def test_topk_one_forces_the_draft_tokens_and_topk_above_one_turns_adaptive_off():
    eff, warnings = apply_speculative_rules(LiveSettings(num_steps=3, topk=1, num_draft_tokens=8))
    assert eff.num_draft_tokens == 4
    assert "num_draft_tokens = num_steps + 1 = 4 (requested 8" in warnings[0]
    eff, warnings = apply_speculative_rules(
        LiveSettings(num_steps=3, topk=2, num_draft_tokens=6, speculative_adaptive=True)
    )
    assert not eff.speculative_adaptive
    assert warnings[0].startswith("speculative_adaptive is turned off by SGLang")
    with pytest.raises(BadInput, match="num_draft_tokens is required when topk > 1"):
        apply_speculative_rules(LiveSettings(num_steps=3, topk=2))


def test_a_refused_request_keeps_its_values_and_the_baseline_clears_the_speculative_fields():
    effective, warnings, refusal = speculative_effective(LiveSettings(num_steps=3, topk=2))
    assert refusal == "num_draft_tokens is required when topk > 1"
    assert effective["topk"] == 2 and not warnings
    effective, _, refusal = speculative_effective(
        LiveSettings(speculative_algorithm="none", num_steps=3)
    )
    assert refusal is None
    assert (effective["num_steps"], effective["topk"], effective["num_draft_tokens"]) == (0, 0, 0)
    assert "speculative_adaptive" not in effective and "pinned_acceptance" not in effective
