"""The sglang plan of ``speculative_adaptive`` with the project's own rules (SGLang's verdicts:
test_oracle_sglang.py).

Planned for ``python -m sglang.launch_server`` without probing anything (``check=False``), for the
stand-in ``bisect-eagle serve`` (its own parser), and through ``export``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from sglang_helpers import SGLANG, plan, tiny_planner

from bisect_eagle.artifacts import scenarios
from bisect_eagle.engines.sglang.oracle import SglangVerdict
from bisect_eagle.engines.sglang.oracle_script import ADAPTIVE_OFF
from bisect_eagle.engines.sglang.planner import Planner
from bisect_eagle.spec.load import load_spec
from bisect_eagle.spec.schema import SglangServer
from bisect_eagle.spec.settings import ADAPTIVE, parse_settings

# Fingerprints of today's configs (before speculative_adaptive existed): a false value leaves each
# unchanged.
FINGERPRINTS = [
    ({}, "1b71aa6ff045a5dc"),
    ({"num_steps": 5, "eagle_aux_hidden_state_layer_ids": [2, 6, 10]}, "4588cedfb0a5aceb"),
    ({"speculative_algorithm": "none"}, "bdc057d4eb6ff830"),
    ({"topk": 4, "num_draft_tokens": 8}, "b648f7cd9e8faaea"),
    (
        {"server_args": {"attention_backend": "triton"}, "env": {"NCCL_ALGO": "Ring"}},
        "79efa5e96bbbab9e",
    ),
]


@pytest.fixture(scope="module")
def planner() -> Planner:
    return tiny_planner()


@pytest.mark.parametrize("request_, fingerprint", FINGERPRINTS)
def test_adaptive_off_leaves_todays_plans_unchanged(planner, request_, fingerprint):
    server_args = request_.get("server_args", {})
    for off in (
        {},
        {"speculative_adaptive": False},
        {"server_args": {**server_args, "speculative_adaptive": False}},
    ):
        p = plan(planner, **{**request_, **off})
        assert p.fingerprint == fingerprint, off
        assert "speculative_adaptive" not in p.effective and "--speculative-adaptive" not in p.argv


def test_adaptive_on_is_one_flag_and_an_effective_setting(planner):
    static = plan(planner, num_steps=5)
    adaptive = plan(planner, num_steps=5, speculative_adaptive=True)
    assert adaptive.refusal is None and adaptive.argv.count("--speculative-adaptive") == 1
    assert (
        adaptive.effective["speculative_adaptive"] is True
        and adaptive.fingerprint != static.fingerprint
    )
    assert adaptive.requested["speculative_adaptive"] is True
    assert {
        k: v for k, v in adaptive.effective.items() if k != "speculative_adaptive"
    } == static.effective
    # the old spelling, folded
    as_flag = plan(planner, num_steps=5, server_args={"speculative_adaptive": True})
    assert as_flag.fingerprint == adaptive.fingerprint and as_flag.argv == adaptive.argv


def test_what_sglang_turns_off_or_refuses(planner):
    tree = plan(planner, topk=4, num_draft_tokens=8, speculative_adaptive=True)
    assert (
        tree.refusal is None
        and tree.fingerprint == plan(planner, topk=4, num_draft_tokens=8).fingerprint
    )
    assert tree.warnings == (
        "speculative_adaptive is turned off by SGLang: speculative_eagle_topk=4 (only topk=1 is "
        "supported); it runs the static num_steps, with only a warning",
    )
    assert "--speculative-adaptive" in tree.argv  # as requested: SGLang turns it off itself
    steps4 = plan(planner, num_steps=4, speculative_adaptive=True)
    assert steps4.refusal.startswith(
        "--speculative-num-steps=4 is not in the adaptive config candidate_steps [0, 1, 3, 5, 7]. "
        "Pass one of those values."
    )
    own_config = plan(
        planner,
        num_steps=4,
        speculative_adaptive=True,
        server_args={"speculative_adaptive_config": "/cfg/adaptive.json"},
    )
    assert own_config.refusal is None  # its candidates are the server's to check
    baseline = plan(planner, speculative_algorithm="none", speculative_adaptive=True)
    assert (
        baseline.fingerprint == "bdc057d4eb6ff830" and "--speculative-adaptive" not in baseline.argv
    )


def _resolving(tmp_path: Path, resolved: dict) -> Planner:
    """A planner whose SGLang resolution answers ``resolved`` for every argv (what the oracle sends
    back)."""
    tiny = scenarios.get("tiny")
    p = Planner(SglangServer(launch_command=SGLANG), tiny.target, tiny.draft, check=False)
    verdict = SglangVerdict(ok=True, stage="", error=None, resolved=resolved)
    p.oracle = lambda: SimpleNamespace(
        available=True, judge=lambda argv, *, resolve: verdict, describe=lambda: None, failure=None
    )
    return p


@pytest.mark.parametrize(
    "request_, resolved, reason",
    [
        # the project's rules turned it off already: their warning, once
        (
            {"topk": 4, "num_draft_tokens": 8},
            {
                "speculative_eagle_topk": 4,
                "speculative_num_draft_tokens": 8,
                "speculative_adaptive": False,
                ADAPTIVE_OFF: "topk > 1",
            },
            "speculative_eagle_topk=4 (only topk=1 is supported)",
        ),
        (
            {"num_steps": 3},  # only SGLang's resolution turned it off: its reason
            {
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4,
                "speculative_adaptive": False,
                ADAPTIVE_OFF: "an attention backend without adaptive support",
            },
            "an attention backend without adaptive support",
        ),
    ],
)
def test_adaptive_turned_off_is_warned_once(tmp_path, request_, resolved, reason):
    p = plan(
        _resolving(tmp_path, {"speculative_num_steps": 3, **resolved}),
        speculative_adaptive=True,
        **request_,
    )
    assert p.refusal is None and "speculative_adaptive" not in p.effective
    off = [w for w in p.warnings if "turned off by SGLang" in w]
    assert off == [
        f"speculative_adaptive is turned off by SGLang: {reason}; it runs the static num_steps, "
        "with only a warning"
    ], p.warnings


def test_adaptive_kept_on_by_sglangs_resolution_is_effective_without_a_warning(tmp_path):
    p = plan(
        _resolving(
            tmp_path,
            {
                "speculative_num_steps": 3,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4,
                "speculative_adaptive": True,
            },
        ),
        num_steps=3,
        speculative_adaptive=True,
    )
    assert p.refusal is None and p.effective["speculative_adaptive"] is True
    assert p.effective["server"]["speculative_adaptive"] is True and p.warnings == ()


def test_the_stand_in_has_no_adaptive_mode_and_its_parser_refuses_the_flag(tmp_path):
    tiny = scenarios.get("tiny")
    stand_in = Planner(
        SglangServer(launch_command=[str(Path(sys.executable).parent / "bisect-eagle"), "serve"]),
        tiny.target,
        tiny.draft,
    )
    try:
        p = plan(stand_in, speculative_adaptive=True)
        assert p.refusal.startswith(
            "speculative_adaptive: flag --speculative-adaptive is not accepted by "
        ), p.refusal
        assert plan(stand_in).refusal is None
    finally:
        stand_in.close()


def _export(tmp_path, monkeypatch, *, kind: str, logged: dict, effective: dict) -> dict:
    """``export`` of a trial logged with ``logged`` requested and ``effective`` in its plan, under a
    ``kind`` spec."""
    from bisect_eagle.cli.export import export_plan
    from bisect_eagle.spec.schema import settings_from
    from bisect_eagle.trials import record as trials

    raw = {
        "name": "exported",
        "scenario": "tiny",
        "engine": {"kind": kind, "sglang": {"launch_command": SGLANG, "python": sys.executable}},
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(raw))
    spec = load_spec(tmp_path / "spec.yaml")
    monkeypatch.setattr(
        trials, "settings_of_run", lambda tracking, run: (settings_from(logged, "trial"), "parent")
    )
    monkeypatch.setattr(trials, "spec_of_study", lambda tracking, parent: spec)
    monkeypatch.setattr(trials, "effective_of", lambda tracking, run: effective)
    return export_plan(None, SimpleNamespace(info=SimpleNamespace(run_id="r1")), port=30000)


def test_export_prints_the_flag_of_a_logged_adaptive_trial(tmp_path, monkeypatch):
    """A trial logged with the old spelling (``server_args.speculative_adaptive``) exports as the
    one flag."""
    out = _export(
        tmp_path,
        monkeypatch,
        kind="sglang",
        logged={"num_steps": 3, "server_args": {ADAPTIVE: True}},
        effective={"num_steps": 3, "topk": 1, "num_draft_tokens": 4, ADAPTIVE: True},
    )
    assert (
        out["refusal"] is None
        and out["argv"].count("--speculative-adaptive") == 1
        and out["run_id"] == "r1"
    )
    assert "--speculative-num-steps 3" in out["command"] and out["command"].endswith(
        "--speculative-adaptive"
    )


@pytest.mark.parametrize("kind", ["sglang", "local"])
def test_export_serves_what_the_trials_plan_measured(tmp_path, monkeypatch, kind):
    """num_draft_tokens (and a local trial's dtype) come from the logged plan's effective
    settings."""
    out = _export(
        tmp_path,
        monkeypatch,
        kind=kind,
        logged={"num_steps": 3, "num_draft_tokens": 8},
        effective={"num_steps": 3, "topk": 1, "num_draft_tokens": 4, "dtype": "float32"},
    )
    assert "--speculative-num-draft-tokens 4" in out["command"] and out["refusal"] is None
    assert ("--dtype float32" in out["command"]) == (kind == "local")
    draft = scenarios.get("tiny").draft
    assert out["argv"][out["argv"].index("--speculative-draft-model-path") + 1] == str(draft)
    assert out["draft_config"] == str(draft / "config.json") and out["draft_config_patch"] is None


def test_export_names_the_stand_in_as_the_stand_in(tmp_path):
    from bisect_eagle.engines.sglang import SglangEngine
    from bisect_eagle.spec.schema import settings_from

    tiny = scenarios.get("tiny")
    raw = {
        "name": "stand-in",
        "scenario": "tiny",
        "engine": {
            "kind": "sglang",
            "sglang": {
                "launch_command": [str(Path(sys.executable).parent / "bisect-eagle"), "serve"]
            },
        },
    }
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(raw))
    out = SglangEngine.export(
        load_spec(tmp_path / "spec.yaml"),
        settings_from({"num_steps": 3}, "trial"),
        effective={},
        port=30000,
    )
    assert out["refusal"] is None and str(tiny.draft) in out["command"]
    assert out["warnings"][0].startswith(
        "this spec's engine launches the stand-in `bisect-eagle serve`"
    )
    sglang = _export_plain(tmp_path)
    assert not any("stand-in" in w for w in sglang["warnings"])


def _export_plain(tmp_path) -> dict:
    from bisect_eagle.engines.sglang import SglangEngine
    from bisect_eagle.spec.schema import settings_from

    raw = {
        "name": "real",
        "scenario": "tiny",
        "engine": {
            "kind": "sglang",
            "sglang": {"launch_command": SGLANG, "python": sys.executable},
        },
    }
    (tmp_path / "real.yaml").write_text(yaml.safe_dump(raw))
    return SglangEngine.export(
        load_spec(tmp_path / "real.yaml"),
        settings_from({"num_steps": 3}, "trial"),
        effective={},
        port=30000,
    )


# -- the environment the server inherits
# ---------------------------------------------------------------------


def test_the_plan_keeps_what_the_server_inherits_from_the_controllers_environment(
    planner, monkeypatch
):
    """SGLang sets NCCL_NVLS_ENABLE=0 only when it is unset: exported 1 in the controller's shell
    stays 1."""

    def env(**kw):
        return planner.plan(parse_settings(kw, "test"), port=30000, draft_dir=Path("/d")).effective[
            "env"
        ]

    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    monkeypatch.delenv("NCCL_ALGO", raising=False)
    unset = env()
    assert unset["NCCL_NVLS_ENABLE"] == "0" and "NCCL_ALGO" not in unset
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    monkeypatch.setenv("NCCL_IB_PASSWORD", "hunter2")  # a secret-looking name is never planned
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "1")  # read nowhere in SGLang 0.5.23
    shell = planner.plan(parse_settings({}, "test"), port=30000, draft_dir=Path("/d"))
    assert (
        shell.effective["env"]["NCCL_NVLS_ENABLE"] == "1"
        and shell.effective["env"]["NCCL_ALGO"] == "Tree"
    )
    assert (
        "NCCL_IB_PASSWORD" not in shell.effective["env"]
        and "SGLANG_ENABLE_SPEC_V2" not in shell.effective["env"]
    )
    assert any(
        "inherited from the controller's environment" in w and "NCCL_NVLS_ENABLE=1" in w
        for w in shell.warnings
    )
    assert env(env={"NCCL_NVLS_ENABLE": "0"})["NCCL_NVLS_ENABLE"] == "0"  # the spec's value wins
    assert (
        env(server_args={"enable_nccl_nvls": True}, env={"NCCL_NVLS_ENABLE": "0"})[
            "NCCL_NVLS_ENABLE"
        ]
        == "1"
    )
    monkeypatch.delenv("NCCL_NVLS_ENABLE")
    assert env()["NCCL_NVLS_ENABLE"] == "0"


def test_an_inherited_variable_is_a_different_trial_than_none(planner, monkeypatch):
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    plain = planner.plan(parse_settings({}, "test"), port=30000, draft_dir=Path("/d")).fingerprint
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    inherited = planner.plan(
        parse_settings({}, "test"), port=30000, draft_dir=Path("/d")
    ).fingerprint
    asked = planner.plan(
        parse_settings({"env": {"NCCL_NVLS_ENABLE": "1"}}, "test"), port=30000, draft_dir=Path("/d")
    ).fingerprint
    # what the server runs with, wherever the value comes from
    assert inherited != plain and inherited == asked
