"""`doctor` flags each planted error of the broken specs, and nothing in the good ones."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file, save_file

from bisect_eagle.doctor import diagnose
from bisect_eagle.spec.load import load_spec

ROOT = Path(__file__).resolve().parents[2]
BROKEN = sorted((ROOT / "experiments" / "broken").glob("*.yaml"))
CLI = (
    "import sys; from bisect_eagle import cli; from bisect_eagle.cli import doctor as m; 'doctor' "
    "in {c.name for c in cli.app.registered_commands} or m.register(cli.app); cli.main()"
)


def planted(path: Path) -> str:
    """The code named on a broken spec's first line: '# planted: CODE (severity) ...'."""
    m = re.match(r"# planted: ([a-z0-9-]+) ", path.read_text().splitlines()[0])
    assert m, f"{path} does not start with '# planted: CODE'"
    return m.group(1)


def test_the_broken_set_covers_every_spec_level_check():
    assert {planted(p) for p in BROKEN} >= {
        "fc-width",
        "ids-range",
        "final-layer-id",
        "minus-one",
        "ndt-override",
        "eagle-vs-eagle3",
        "dump-wiring",
        "dump-layers",
    }


@pytest.mark.parametrize("path", BROKEN, ids=lambda p: p.stem)
def test_each_broken_spec_gets_exactly_its_planted_finding(tiny, path):
    findings = diagnose(load_spec(path, check_inputs=False), sglang_version="0.5.5")
    assert {f.code for f in findings} == {planted(path)}, [f.message for f in findings]
    assert all(
        f.fix and f.where.startswith(str(path)) or "config.json" in f.where for f in findings
    )


@pytest.mark.parametrize("name", ["tiny.yaml", "tiny-sglang.yaml"])
def test_good_specs_have_no_findings(tiny, name):
    assert diagnose(load_spec(ROOT / "experiments" / name), sglang_version="0.5.23") == []


def test_minus_one_depends_on_the_sglang_version(tiny):
    spec = load_spec(ROOT / "experiments" / "broken" / "minus-one.yaml", check_inputs=False)
    assert [f.severity for f in diagnose(spec, sglang_version="0.5.5.post3")] == ["error"]
    assert diagnose(spec, sglang_version="0.5.23") == []
    unknown = diagnose(spec, sglang_version="0.5.14")
    assert [f.severity for f in unknown] == ["warning"] and "0.5.14" in unknown[0].message


def test_the_broken_deployment_shows_the_incidents_mistakes(tiny):
    findings = diagnose(load_spec(ROOT / "experiments" / "tiny-broken.yaml", check_inputs=False))
    by_code = {f.code: f.severity for f in findings}
    assert by_code == {"dump-wiring": "error", "ndt-override": "warning"}


def _spec_with_draft(
    tmp_path: Path,
    tiny,
    edit_config=None,
    drop: tuple[str, ...] = (),
    settings=None,
    kind: str = "sglang",
) -> Path:
    """A copy of the tiny draft with its config edited and/or tensors dropped, and a spec that uses
    it."""
    draft = tmp_path / "draft"
    shutil.copytree(tiny.draft, draft)
    cfg = json.loads((draft / "config.json").read_text())
    if edit_config:
        edit_config(cfg)
    (draft / "config.json").write_text(json.dumps(cfg))
    if drop:
        weights = load_file(str(draft / "model.safetensors"))
        save_file(
            {k: v for k, v in weights.items() if k not in drop}, str(draft / "model.safetensors")
        )
    spec = {
        "name": "doctor-test",
        "target": str(tiny.target),
        "draft": str(draft),
        "dump": str(tiny.dump),
        "prompts": str(tiny.prompts),
        "dump_layer_ids": [1, 5, 9],
        "engine": {"kind": kind, "settings": settings or {}},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _top_level_ids(cfg: dict) -> None:
    cfg["eagle_aux_hidden_state_layer_ids"] = cfg.pop("eagle_config")[
        "eagle_aux_hidden_state_layer_ids"
    ]


def _misspelt(cfg: dict) -> None:
    cfg["eagle_config"]["eagle_aux_hidden_states_layer_ids"] = cfg["eagle_config"].pop(
        "eagle_aux_hidden_state_layer_ids"
    )


def _not_eagle3(cfg: dict) -> None:
    cfg["architectures"] = ["LlamaForCausalLMEagle"]


@pytest.mark.parametrize(
    "edit, drop, code, text",
    [
        (_top_level_ids, (), "ids-location", "is at the top level; SGLang reads only eagle_config"),
        (_misspelt, (), "ids-location", "eagle_config has 'eagle_aux_hidden_states_layer_ids'"),
        (None, ("d2t",), "vocab-map", "no d2t map"),
        (_not_eagle3, (), "eagle-vs-eagle3", "not EAGLE-3"),
    ],
)
def test_planted_draft_errors(tmp_path, tiny, edit, drop, code, text):
    findings = diagnose(
        load_spec(_spec_with_draft(tmp_path, tiny, edit, drop), check_inputs=False),
        sglang_version="0.5.23",
    )
    assert [(f.code, f.severity) for f in findings] == [(code, "error")]
    assert text in findings[0].message and findings[0].fix


def _vllm_spec(tmp_path: Path, tiny, **settings) -> Path:
    path = _spec_with_draft(tmp_path, tiny)
    raw = yaml.safe_load(path.read_text())
    raw["engine"] = {"kind": "vllm", "settings": {**raw["engine"].get("settings", {}), **settings}}
    path.write_text(yaml.safe_dump(raw))
    return path


def test_vllm_reads_the_shipped_nested_ids_one_layer_shallower(tmp_path, tiny):
    """The shipped draft holds SGLang's [1, 5, 9] nested only: vLLM would read them as its own
    ids."""
    findings = diagnose(load_spec(_vllm_spec(tmp_path, tiny), check_inputs=False))
    # where the ids are read, then what that feeds the draft against the dump it was trained on
    assert [(f.code, f.severity) for f in findings] == [
        ("ids-location", "error"),
        ("dump-wiring", "error"),
    ]
    assert (
        "hidden_states[1, 5, 9]" in findings[1].message
        and "hidden_states[2, 6, 10]" in findings[1].message
    )
    assert (
        "one layer shallower" in findings[0].message
        and "verbatim as vLLM ids" in findings[0].message
    )
    assert "eagle_aux_hidden_state_layer_ids: [2, 6, 10] at the top level" in findings[0].fix


def test_vllm_with_the_spec_ids_written_by_the_engine_warns_only(tmp_path, tiny):
    findings = diagnose(
        load_spec(
            _vllm_spec(tmp_path, tiny, eagle_aux_hidden_state_layer_ids=[1, 5, 9]),
            check_inputs=False,
        )
    )
    assert [(f.code, f.severity) for f in findings] == [("ids-location", "warning")]


def test_minus_one_is_an_error_for_vllm(tmp_path, tiny):
    findings = diagnose(
        load_spec(
            _vllm_spec(tmp_path, tiny, eagle_aux_hidden_state_layer_ids=[-1, 1, 5]),
            check_inputs=False,
        )
    )
    minus = [f for f in findings if f.code == "minus-one"]
    assert [f.severity for f in minus] == ["error"] and "dies at the first request" in minus[
        0
    ].message


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLI, "doctor", *args], capture_output=True, text=True, timeout=120
    )


def test_exit_codes_and_json(tiny, tmp_path):
    assert _cli(str(ROOT / "experiments" / "broken" / "fc-width.yaml")).returncode == 1
    warn = _cli(str(ROOT / "experiments" / "broken" / "ndt-override.yaml"), "--json")
    assert warn.returncode == 0
    obj = json.loads(warn.stdout)
    assert obj["ok"] and obj["counts"] == {"error": 0, "warning": 1, "info": 0}
    assert obj["findings"][0]["code"] == "ndt-override"
    absent = tmp_path / "absent.yaml"
    missing = _cli(str(absent))
    assert (
        missing.returncode == 2
        and missing.stderr.strip() == f"error: {absent}: spec file not found"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nengine: {kind: local, settings: {num_steps: many}}\nscenario: tiny\n")
    out = _cli(str(bad))
    assert (
        out.returncode == 2
        and "num_steps" in out.stderr
        and len(out.stderr.strip().splitlines()) == 1
    )


def _family_spec(
    tmp_path: Path,
    tiny,
    *,
    model_type: str,
    num_layers: int,
    ids: list[int],
    dump_layer_ids: list[int],
) -> Path:
    """A tiny-shaped deployment whose target says it is ``model_type`` with ``num_layers`` layers
    (configs only)."""
    target = tmp_path / "target"
    shutil.copytree(tiny.target, target)
    cfg = json.loads((target / "config.json").read_text())
    cfg.update(model_type=model_type, num_hidden_layers=num_layers)
    (target / "config.json").write_text(json.dumps(cfg))
    spec = {
        "name": f"{model_type}-doctor",
        "target": str(target),
        "draft": str(tiny.draft),
        "dump": str(tiny.dump),
        "prompts": str(tiny.prompts),
        "dump_layer_ids": dump_layer_ids,
        "engine": {
            "kind": "sglang",
            "settings": {"eagle_aux_hidden_state_layer_ids": ids},
            "sglang": {"launch_command": ["bisect-eagle", "serve"]},
        },
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_glm5_ids_are_judged_by_sglangs_deepseek_rule(tiny, tmp_path):
    """GLM-5 (glm_moe_dsa, 61 layers), dump at the outputs of layers 2, 30, 58: [3, 31, 59] feeds
    them."""
    wrong = diagnose(
        load_spec(
            _family_spec(
                tmp_path / "a",
                tiny,
                model_type="glm_moe_dsa",
                num_layers=61,
                ids=[2, 30, 58],
                dump_layer_ids=[2, 30, 58],
            ),
            check_inputs=False,
        ),
        sglang_version="0.5.23",
    )
    wiring = [f for f in wrong if f.code == "dump-wiring"]
    assert wiring and wiring[0].severity == "error" and "[3, 31, 59]" in wiring[0].fix
    assert "glm_moe_dsa" in wiring[0].message
    right = diagnose(
        load_spec(
            _family_spec(
                tmp_path / "b",
                tiny,
                model_type="glm_moe_dsa",
                num_layers=61,
                ids=[3, 31, 59],
                dump_layer_ids=[2, 30, 58],
            ),
            check_inputs=False,
        ),
        sglang_version="0.5.23",
    )
    assert not [f for f in right if f.code in ("dump-wiring", "ids-range", "final-layer-id")]


def test_minus_one_on_the_deepseek_family_fails_to_capture(tiny, tmp_path):
    found = diagnose(
        load_spec(
            _family_spec(
                tmp_path,
                tiny,
                model_type="deepseek_v32",
                num_layers=61,
                ids=[-1, 2, 30],
                dump_layer_ids=[2, 30, 58],
            ),
            check_inputs=False,
        ),
        sglang_version="0.5.23",
    )
    minus = [f for f in found if f.code == "minus-one"]
    assert minus and minus[0].severity == "error" and "captured 2 of 3" in minus[0].message


@pytest.mark.parametrize(
    "model_type,flagged", [("llama", True), ("qwen3_moe", True), ("gpt_oss", False)]
)
def test_final_layer_by_family(tiny, tmp_path, model_type, flagged):
    found = diagnose(
        load_spec(
            _family_spec(
                tmp_path,
                tiny,
                model_type=model_type,
                num_layers=12,
                ids=[1, 5, 11],
                dump_layer_ids=[1, 5, 11],
            ),
            check_inputs=False,
        ),
        sglang_version="0.5.23",
    )
    assert any(f.code == "final-layer-id" for f in found) is flagged


@pytest.mark.parametrize("kind", ["local", "sglang"])
def test_a_wrong_wiring_hidden_by_eagle_is_a_latent_error(tmp_path, tiny, kind):
    """EAGLE leaves the ids unused: the wiring changes nothing today, but the fix of the algorithm
    exposes it."""
    settings = {"speculative_algorithm": "EAGLE", "eagle_aux_hidden_state_layer_ids": [0, 4, 8]}
    findings = diagnose(
        load_spec(
            _spec_with_draft(tmp_path / "a", tiny, settings=settings, kind=kind), check_inputs=False
        ),
        sglang_version="0.5.23",
    )
    by_code = {f.code: f for f in findings}
    assert set(by_code) == {"eagle-vs-eagle3", "dump-wiring"}, [f.message for f in findings]
    wiring = by_code["dump-wiring"]
    assert wiring.severity == "error" and wiring.latent and not by_code["eagle-vs-eagle3"].latent
    assert (
        "latent while speculative_algorithm is EAGLE" in wiring.message
        and "[1, 5, 9]" in wiring.fix
    )
    assert wiring.to_json()["latent"] is True
    exposed = diagnose(
        load_spec(
            _spec_with_draft(
                tmp_path / "b",
                tiny,
                settings={"eagle_aux_hidden_state_layer_ids": [0, 4, 8]},
                kind=kind,
            ),
            check_inputs=False,
        ),
        sglang_version="0.5.23",
    )
    # the same finding, now live
    assert [(f.code, f.latent) for f in exposed] == [("dump-wiring", False)]
    right = diagnose(
        load_spec(
            _spec_with_draft(
                tmp_path / "c", tiny, settings={"speculative_algorithm": "EAGLE"}, kind=kind
            ),
            check_inputs=False,
        ),
        sglang_version="0.5.23",
    )
    assert [f.code for f in right] == ["eagle-vs-eagle3"]  # the draft's own ids: nothing latent


def _kimi_shaped(tmp_path: Path, tiny, served: list[int]) -> Path:
    """The Kimi-K2.5 fixture's config (model class, 61 layers, text_config) at the tiny pair's
    widths, with a dump captured at the outputs of layers 2, 30 and 58 (the incident's), served
    ``served``."""
    cfg = json.loads(
        (ROOT / "tests" / "fixtures" / "targets" / "kimi-k25" / "config.json").read_text()
    )
    width = json.loads((tiny.target / "config.json").read_text())
    for d in (cfg, cfg["text_config"]):
        d.update(hidden_size=width["hidden_size"], vocab_size=width["vocab_size"])
    target = tmp_path / "kimi"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(cfg))
    spec = tmp_path / "kimi.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "kimi",
                "target": str(target),
                "draft": str(tiny.draft),
                "dump": str(tiny.dump),
                "prompts": str(tiny.prompts),
                "dump_layer_ids": [2, 30, 58],
                "engine": {
                    "kind": "sglang",
                    "settings": {"eagle_aux_hidden_state_layer_ids": served},
                },
            }
        )
    )
    return spec


@pytest.mark.parametrize("served, wrong", [([2, 30, 58], True), ([3, 31, 59], False)])
def test_kimi_k25_reads_ids_by_the_deepseek_rule(tmp_path, tiny, served, wrong):
    """Kimi-K2.5 (the incident's target) takes the DeepSeek rule: ids are captured as given unless
    the first is 1, so the incident's [2, 30, 58] feed hidden_states 2, 30, 58 -- one layer
    shallower than the dump's outputs of layers 2, 30, 58 -- and [3, 31, 59] are right (a +1 table
    would say the opposite)."""
    findings = diagnose(
        load_spec(_kimi_shaped(tmp_path, tiny, served), check_inputs=False), sglang_version="0.5.23"
    )
    assert ("dump-wiring" in [f.code for f in findings]) == wrong, [
        (f.code, f.message) for f in findings
    ]


def _space_spec(tmp_path: Path, tiny, *, model_type: str, launch_command: list[str]) -> Path:
    """A 61-layer ``model_type`` deployment (tiny-shaped configs) whose space offers the incident's
    false fix ``[-1, 2, 30]`` beside the right wiring, for SGLang launched by ``launch_command``."""
    path = _family_spec(
        tmp_path,
        tiny,
        model_type=model_type,
        num_layers=61,
        ids=[3, 31, 59],
        dump_layer_ids=[2, 30, 58],
    )
    raw = yaml.safe_load(path.read_text())
    del raw["engine"]["settings"]["eagle_aux_hidden_state_layer_ids"]
    raw["engine"]["sglang"] = {"launch_command": launch_command}
    raw["space"] = {
        "eagle_aux_hidden_state_layer_ids": {
            "type": "categorical",
            "choices": [[3, 31, 59], [-1, 2, 30]],
        }
    }
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_space_candidate_the_plan_refuses_is_a_warning_not_an_error_of_the_spec(tiny, tmp_path):
    """SGLang's DeepSeek-family rule never captures -1: the sglang plan refuses that candidate's
    trials before launch (the fallback table here, SGLang's hook where it is installed), so the spec
    itself is usable."""
    path = _space_spec(
        tmp_path / "a",
        tiny,
        model_type="glm_moe_dsa",
        launch_command=[str(tmp_path / "no-sglang" / "python"), "-m", "sglang.launch_server"],
    )
    found = diagnose(load_spec(path, check_inputs=False), sglang_version="0.5.23")
    minus = [f for f in found if f.code == "minus-one"]
    assert [f.severity for f in minus] == ["warning"] and "choices[1]" in minus[0].where
    assert "the plan refuses this candidate's trials before launch" in minus[0].message
    assert not [f for f in found if f.severity == "error" and "space." in f.where], [
        f.message for f in found
    ]


def test_a_space_candidate_the_plan_lets_through_stays_an_error(tiny, tmp_path):
    """The stand-in captures what SGLang would not and so does not refuse: its doctor error stays an
    error."""
    path = _space_spec(
        tmp_path, tiny, model_type="glm_moe_dsa", launch_command=["bisect-eagle", "serve"]
    )
    minus = [
        f
        for f in diagnose(load_spec(path, check_inputs=False), sglang_version="0.5.23")
        if f.code == "minus-one"
    ]
    assert [f.severity for f in minus] == ["error"]
