"""The 8-GPU node's spec (experiments/glm5-8gpu.yaml) planned on this CPU machine with its target
readable: the GLM-5 fixture config (tests/fixtures/targets/glm5), a weightless draft and a
one-sample dump made for it.

SGLang 0.5.23 judges every plan (its parser, its capture hook); its resolution needs the node's
GPUs, so each plan says "not resolved here" and none is refused for missing hardware. Ids SGLang
never captures are refused before launch, quoting the rule. Skipped without SGLang's environment
(scripts/setup_sglang_env.sh), as in CI it is not.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from sglang_helpers import EXPERIMENTS
from sglang_oracle import sglang_python
from weightless import small_dump, weightless_draft

from bisect_eagle.engines import make_engine
from bisect_eagle.engines.sglang.oracle_script import NOT_RESOLVED_HERE
from bisect_eagle.search.space import SearchSpace
from bisect_eagle.spec.load import load_spec

from helpers import cli_in_process

# every test here runs the CLI against SGLang's real parser and capture hook on a 61-layer node
# spec: minutes in all, so CI's system step runs them
pytestmark = pytest.mark.system

GLM5 = Path(__file__).resolve().parents[2] / "fixtures" / "targets" / "glm5"
HARDWARE = ("No accelerator", "Torch not compiled with CUDA", "CUDA driver", "no CUDA GPUs")
CAPTURE_RULE = "GlmMoeDsaForCausalLM.set_eagle3_layers_to_capture maps ids to layers_to_capture"


@pytest.fixture(scope="module")
def node_spec(tmp_path_factory) -> Path:
    """experiments/glm5-8gpu.yaml with the GLM-5 fixture as target, a weightless draft (nested ids
    [3, 31, 59], what a draft trained on the dump's layers 2, 30, 58 reads on this family) and
    SGLang's interpreter here."""
    root = tmp_path_factory.mktemp("glm5-node")
    raw = yaml.safe_load((EXPERIMENTS / "glm5-8gpu.yaml").read_text())
    raw["target"] = str(GLM5)
    raw["draft"] = str(weightless_draft(root / "draft", GLM5, [3, 31, 59]))
    raw["dump"] = str(small_dump(root / "dump", GLM5))
    raw["engine"]["sglang"]["python"] = sglang_python()
    path = root / "glm5-8gpu.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``bisect-eagle ARGS`` in this process: its SGLang oracle, kept by the worker, answers every
    test of the module (:func:`helpers.cli_in_process`)."""
    return cli_in_process(*args, cwd=cwd)


def test_live_dry_run_plans_the_node_trial_without_resolving_it_here(node_spec, tmp_path):
    res = cli("live", "--spec", str(node_spec), "--dry-run", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    plan = json.loads(res.stdout)["plan"]
    assert plan["refusal"] is None
    assert (
        plan["checked"].startswith("SGLang 0.5.23 parser (")
        and NOT_RESOLVED_HERE in plan["checked"]
    )
    assert (
        "8 accelerator device(s) per node" in plan["checked"]
        and "this host has 0" in plan["checked"]
    )
    assert "--tp-size" in plan["argv"] and plan["argv"][plan["argv"].index("--tp-size") + 1] == "8"
    text = cli("live", "--spec", str(node_spec), "--dry-run", cwd=tmp_path)
    assert text.returncode == 0 and NOT_RESOLVED_HERE in text.stdout.splitlines()[0]
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing


@pytest.mark.parametrize("ids", ["[2,30,61]", "[-1,2,30]"])
def test_ids_sglang_never_captures_are_refused_before_launch_quoting_the_rule(
    node_spec, tmp_path, ids
):
    res = cli(
        "live",
        "--spec",
        str(node_spec),
        "--dry-run",
        "--json",
        "--set",
        f"eagle_aux_hidden_state_layer_ids={ids}",
        cwd=tmp_path,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    refusal = json.loads(res.stdout)["plan"]["refusal"]
    missed = "61" if "61" in ids else "-1"
    assert f"SGLang never captures the state of id(s) [{missed}] on this 61-layer target" in refusal
    assert CAPTURE_RULE in refusal and "captured 2 of 3 aux hidden states" in refusal
    assert "checked by SGLang 0.5.23" in refusal and "SGLang refuses this launch" not in refusal
    # one error line, after the clock's lines if planning was slow
    *waited, said = res.stderr.strip().splitlines()
    assert (
        said.startswith("error: eagle_aux_hidden_state_layer_ids") and "Traceback" not in res.stderr
    )
    assert all(re.match(r"\[\d:\d\d:\d\d\] ", line) for line in waited), waited


def test_doctor_passes_the_node_spec_and_says_the_plan_is_not_resolved_here(node_spec, tmp_path):
    res = cli("doctor", str(node_spec), "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    body = json.loads(res.stdout)
    assert body["ok"] and body["counts"]["error"] == 0
    by_code = {f["code"]: f for f in body["findings"]}
    assert by_code["plan-not-resolved-here"]["severity"] == "info"
    assert NOT_RESOLVED_HERE in by_code["plan-not-resolved-here"]["message"]
    # the incident's false fix, a space candidate: its trials only are refused
    minus = by_code["minus-one"]
    assert minus["severity"] == "warning" and "choices[2]" in minus["where"]
    assert "the plan refuses this candidate's trials before launch" in minus["message"]
    assert not any(h in json.dumps(body) for h in HARDWARE)


def test_every_trial_of_the_node_spec_is_judged_as_on_the_node_or_not_resolved_here(
    node_spec, tmp_path
):
    """What `run` plans, value by value of the space: not resolved here, or refused by SGLang's own
    rules (the capture hook, the tree bound); never for this host's hardware."""
    spec = load_spec(node_spec)
    space = SearchSpace(spec.space, spec.engine.settings, str(node_spec))
    refused = {}
    with make_engine(spec, tmp_path / "logs") as engine:
        for name in space.order:
            for value in space.values(name) or []:
                sampled = {name: value, **({"topk": 2} if name == "num_draft_tokens" else {})}
                plan = engine.plan(space.settings(sampled))
                assert not any(
                    h in (plan.refusal or "") + (plan.checked or "") for h in HARDWARE
                ), plan.refusal
                if plan.refusal is None:
                    assert NOT_RESOLVED_HERE in plan.checked, (sampled, plan.checked)
                else:
                    refused[(name, json.dumps(value))] = plan.refusal
    wiring = {k: v for k, v in refused.items() if k[0] == "eagle_aux_hidden_state_layer_ids"}
    assert (
        list(wiring) == [("eagle_aux_hidden_state_layer_ids", "[-1, 2, 30]")]
        and CAPTURE_RULE in wiring[("eagle_aux_hidden_state_layer_ids", "[-1, 2, 30]")]
    )
    others = {k: v for k, v in refused.items() if k not in wiring}
    assert all(
        "organize_draft_results" in v or "num_draft_tokens is required" in v
        for v in others.values()
    ), others
    assert not (tmp_path / "logs").exists()


def test_adaptive_by_its_field_name_on_a_spec_that_writes_the_flag_spelling(node_spec, tmp_path):
    """glm5-8gpu.yaml writes server_args.speculative_adaptive: false; --set
    speculative_adaptive=true replaces it."""
    res = cli(
        "live",
        "--spec",
        str(node_spec),
        "--dry-run",
        "--json",
        "--set",
        "speculative_adaptive=true",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    plan = json.loads(res.stdout)["plan"]
    assert plan["refusal"] is None and "--speculative-adaptive" in plan["argv"]
    assert plan["effective"]["speculative_adaptive"] is True


def test_the_dry_run_shows_what_the_server_inherits_from_this_shell(
    node_spec, tmp_path, monkeypatch
):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    res = cli("live", "--spec", str(node_spec), "--dry-run", "--json", cwd=tmp_path)
    assert json.loads(res.stdout)["plan"]["effective"]["env"]["NCCL_NVLS_ENABLE"] == "1"
    asked = cli(
        "live",
        "--spec",
        str(node_spec),
        "--dry-run",
        "--json",
        "--set",
        "env.NCCL_NVLS_ENABLE=0",
        cwd=tmp_path,
    )
    # the spec's value wins
    assert json.loads(asked.stdout)["plan"]["effective"]["env"]["NCCL_NVLS_ENABLE"] == "0"


def test_run_dry_run_says_what_the_node_study_would_launch_and_writes_nothing(node_spec, tmp_path):
    res = cli("run", str(node_spec), "--dry-run", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    body = json.loads(res.stdout)
    assert body["engine"] == "sglang" and body["listed"] and body["configs"] > 1
    assert body["launchable"] == sum(body["checked"].values()) > 0
    # judged as on the node, said plainly
    assert all(NOT_RESOLVED_HERE in what for what in body["checked"])
    assert not any(h in json.dumps(body) for h in HARDWARE)
    # the spec gives the baseline's tok/s: no baseline trial to plan
    assert body["baseline"] is None
    text = cli("run", str(node_spec), "--dry-run", cwd=tmp_path)
    said = " ".join(text.stdout.split())
    assert text.returncode == 0 and "nothing runs, nothing is written" in said
    assert f"live space: {body['configs']} configs; {body['launchable']} would launch" in said
    assert "baseline: 90 (given by the spec; no baseline trial)" in said
    assert list(tmp_path.iterdir()) == []  # no store, no log directory
