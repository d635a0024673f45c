"""``run --dry-run``: every live config planned by the engine, nothing run, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bisect_eagle.engines import make_engine
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.search.space import ENUMERATION_LIMIT, SearchSpace
from bisect_eagle.search.study.dryrun import plan_study
from bisect_eagle.search.study.sampler import SAMPLED
from bisect_eagle.spec.load import load_spec

from helpers import cli

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments"


def write(path: Path, space: str) -> Path:
    path.write_text(f"name: dry\nscenario: tiny\nspace:\n{space}")
    return path


def test_the_tiny_space_is_planned_whole_with_its_refusals_grouped(tmp_path):
    spec = load_spec(
        write(
            tmp_path / "dry.yaml",
            "  num_steps: {type: int, low: 1, high: 3}\n  topk: {type: categorical, choices: [1, "
            "2]}\n",
        )
    )
    p = plan_study(spec, engine_factory=make_engine)
    assert (p.engine, p.configs, p.listed) == ("local", 6, True)
    assert p.refused == {"num_draft_tokens is required when topk > 1": 3} and p.launchable == 3
    assert p.checked == {"the engine's own rules": 3}
    assert (
        p.baseline is not None
        and p.baseline["refusal"] is None
        and len(p.baseline["fingerprint"]) == 16
    )
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
    assert (p.engine, p.listed, p.configs, p.launchable) == ("sglang", False, SAMPLED, SAMPLED)
    assert (
        p.space
        == f"a seeded sample of {SAMPLED} configs of a space too large to list (a float range)"
    )
    assert p.space_bound is None


def test_a_space_too_large_to_list_is_sampled_and_a_sample_refused_whole_is_no_verdict_on_the_space(
    tmp_path,
):
    many = "".join(
        f"  env.NCCL_X{i}: {{type: categorical, choices: [{', '.join(map(str, range(50)))}]}}\n"
        for i in range(3)
    )
    spec = load_spec(
        write(tmp_path / "dry.yaml", "  topk: {type: categorical, choices: [2, 4]}\n" + many)
    )
    bound = 2 * 50**3
    assert bound > ENUMERATION_LIMIT
    # no "refuses all": the space was not all planned
    p = plan_study(spec, engine_factory=make_engine)
    assert (p.listed, p.configs, p.launchable, p.space_bound) == (False, SAMPLED, 0, bound)
    assert p.refused == {"num_draft_tokens is required when topk > 1": SAMPLED}
    assert (
        p.space
        == f"a seeded sample of {SAMPLED} configs of a space too large to list (at most {bound})"
    )


def test_the_layer_id_choices_of_the_space_are_planned(tmp_path):
    """The GLM-5 node spec's speculative part: every layer-id choice times every other config, each
    planned (the sglang engine without SGLang here: its own rules judge the ids)."""
    raw = yaml.safe_load((EXPERIMENTS / "glm5-8gpu.yaml").read_text())
    keep = (IDS_KEY, "num_steps", "topk", "num_draft_tokens")
    raw["space"] = {k: v for k, v in raw["space"].items() if k in keep}
    raw["groups"] = [g for g in raw["groups"] if set(g) <= set(keep)]
    (tmp_path / "glm5.yaml").write_text(yaml.safe_dump(raw))
    spec = load_spec(tmp_path / "glm5.yaml", check_inputs=False)
    p = plan_study(spec, engine_factory=make_engine)
    ids = len(spec.space[IDS_KEY].choices)
    others = SearchSpace(
        {k: v for k, v in spec.space.items() if k != IDS_KEY}, spec.engine.settings, "here"
    )
    assert ids == 3 and p.listed and p.configs == ids * sum(1 for _ in others.enumerate()) == 3 * 42
    assert p.launchable + sum(p.refused.values()) == p.configs


@pytest.mark.system
def test_the_glm5_dry_run_counts_the_layer_id_choices(tmp_path):
    """`run --dry-run experiments/glm5-8gpu.yaml`: 3 layer-id choices times the 9072 configs of the
    rest of the space, every one planned (about a minute of planning on 2 cores: CI's system
    step)."""
    done = cli("run", "--dry-run", "--json", str(EXPERIMENTS / "glm5-8gpu.yaml"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    p = json.loads(done.stdout)
    spec = load_spec(EXPERIMENTS / "glm5-8gpu.yaml", check_inputs=False)
    others = SearchSpace(
        {k: v for k, v in spec.space.items() if k != IDS_KEY}, spec.engine.settings, "here"
    )
    assert p["listed"] and p["configs"] == 3 * sum(1 for _ in others.enumerate()) == 27216
    assert (
        p["space"] == "27216 configs of the space"
        and p["launchable"] + sum(p["refused"].values()) == 27216
    )
    assert list(tmp_path.iterdir()) == []


def test_the_command_writes_nothing(tmp_path):
    done = cli("run", "--dry-run", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["configs"] > 1
    assert list(tmp_path.iterdir()) == []
