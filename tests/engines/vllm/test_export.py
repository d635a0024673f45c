"""``export`` of a logged vllm trial: the launch that serves what the trial measured, a copy of the
draft with the trial's ids at the top level in vLLM's numbering, and (with vLLM's environment) an
argv vLLM's own parser and engine-args resolution take unchanged. Also: the vLLM version a study's
parent run records, and a relative ``engine.vllm.python``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import yaml

from bisect_eagle.engines import engine_class
from bisect_eagle.engines.vllm import VllmEngine
from bisect_eagle.engines.vllm.engine import installed_version
from bisect_eagle.engines.vllm.launch import prepare_draft_dir
from bisect_eagle.engines.vllm.oracle import Oracle
from bisect_eagle.spec.load import load_spec
from bisect_eagle.spec.schema import VllmServer, settings_from
from bisect_eagle.tracking.redact import is_hidden

ROOT = Path(__file__).resolve().parents[3]
CPU = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
CPU_ARGS = {
    "enforce_eager": True,
    "max_model_len": 512,
    "max_num_seqs": 1,
    "seed": 0,
    "distributed_executor_backend": "uni",
}
IDS = "eagle_aux_hidden_state_layer_ids"


def write_spec(tmp_path: Path, tiny, *, python: str, draft: Path | None = None) -> Path:
    raw = {
        "name": "exported",
        "target": str(tiny.target),
        "draft": str(draft or tiny.draft),
        "prompts": str(tiny.prompts),
        "engine": {"kind": "vllm", "vllm": {"python": python}},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def export_logged(
    tmp_path,
    monkeypatch,
    tiny,
    *,
    logged: dict,
    effective: dict,
    python: str = sys.executable,
    draft: Path | None = None,
) -> dict:
    """``bisect-eagle export``'s plan of a trial logged with ``logged`` requested and ``effective``
    in its plan."""
    from bisect_eagle.cli.export import export_plan
    from bisect_eagle.trials import record as trials

    spec = load_spec(write_spec(tmp_path, tiny, python=python, draft=draft))
    monkeypatch.setattr(
        trials, "settings_of_run", lambda tracking, run: (settings_from(logged, "trial"), "parent")
    )
    monkeypatch.setattr(trials, "spec_of_study", lambda tracking, parent: spec)
    monkeypatch.setattr(trials, "effective_of", lambda tracking, run: effective)
    return export_plan(None, SimpleNamespace(info=SimpleNamespace(run_id="r1")), port=30123)


def speculative_config(out: dict) -> dict:
    return json.loads(out["argv"][out["argv"].index("--speculative-config") + 1])


# -- without vLLM: the project's own reading of vLLM's rules
# ---------------------------------------------------


def test_export_serves_the_trials_ids_from_a_draft_copy_at_the_measured_depth(
    tmp_path, monkeypatch, tiny
):
    logged = {
        IDS: [1, 5, 9],
        "num_steps": 3,
        "num_draft_tokens": 8,
        "dtype": "float32",
        "env": CPU,
        "server_args": CPU_ARGS,
    }
    out = export_logged(
        tmp_path,
        monkeypatch,
        tiny,
        logged=logged,
        effective={"num_steps": 3, "num_draft_tokens": 4, "vllm_aux_layer_ids": [2, 6, 10]},
    )
    assert out["run_id"] == "r1" and out["refusal"] is None
    assert out["checked"].startswith("not checked against vLLM")  # this interpreter has no vLLM
    copy = tiny.draft.parent / "draft-vllm-ids-2-6-10"
    assert speculative_config(out) == {
        "method": "eagle3",
        "model": str(copy),
        "num_speculative_tokens": 3,
    }
    # SGLang [1, 5, 9] in vLLM's numbering, at the top level
    assert out["draft_config_patch"] == {IDS: [2, 6, 10]}
    assert out["draft_config"] == str(copy / "config.json") and out["draft_source"] == str(
        tiny.draft
    )
    assert not copy.exists()  # nothing is written
    assert out["draft_note"].startswith(f"copy {tiny.draft} to {copy} ") and out["server"] == "vLLM"
    argv = out["argv"]
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert (
        argv[argv.index("--port") + 1] == "30123" and argv[argv.index("--dtype") + 1] == "float32"
    )
    assert argv[argv.index("--model") + 1] == str(tiny.target) and "--enforce-eager" in argv
    assert out["env"] == {**CPU, "VLLM_HOST_IP": "127.0.0.1"}
    # the measured 4, not the requested 8
    assert not any("num_draft_tokens 8" in w for w in out["warnings"])
    assert out["command"].split()[0] == sys.executable and "--max-model-len 512" in out["command"]
    # the same trial as the engine plans it: one identity
    with VllmEngine(
        VllmServer(python=sys.executable),
        target=tiny.target,
        draft=tiny.draft,
        prompts=tiny.prompts,
        log_dir=tmp_path / "logs",
        check=False,
    ) as engine:
        again = engine.plan(settings_from({**logged, "num_draft_tokens": 4}, "trial"))
    assert again.fingerprint == out["fingerprint"]


def test_export_takes_the_depth_from_the_logged_plan(tmp_path, monkeypatch, tiny):
    out = export_logged(
        tmp_path,
        monkeypatch,
        tiny,
        logged={IDS: [1, 5, 9], "num_steps": 5},
        effective={"num_steps": 2, "num_draft_tokens": 3, "vllm_aux_layer_ids": [2, 6, 10]},
    )
    assert speculative_config(out)["num_speculative_tokens"] == 2


def test_export_of_the_drafts_own_ids_names_the_draft_itself(tmp_path, monkeypatch, tiny):
    out = export_logged(
        tmp_path,
        monkeypatch,
        tiny,
        logged={"num_steps": 3},
        effective={"num_steps": 3, "num_draft_tokens": 4, "vllm_aux_layer_ids": [1, 5, 9]},
    )
    assert speculative_config(out)["model"] == str(tiny.draft) and out["draft_config_patch"] is None
    assert out["draft_config"] == str(tiny.draft / "config.json")
    assert any("verbatim" in w for w in out["warnings"])  # the nested ids, read one layer shallower


def test_export_warns_when_the_draft_no_longer_gives_what_was_measured(tmp_path, monkeypatch, tiny):
    out = export_logged(
        tmp_path,
        monkeypatch,
        tiny,
        logged={"num_steps": 3},
        effective={"num_steps": 3, "num_draft_tokens": 4, "vllm_aux_layer_ids": [2, 6, 10]},
    )
    assert any(
        "measured vLLM aux layer ids [2, 6, 10], this launch captures [1, 5, 9]" in w
        for w in out["warnings"]
    )


def test_export_of_the_baseline_and_of_a_refused_trial(tmp_path, monkeypatch, tiny):
    base = export_logged(
        tmp_path, monkeypatch, tiny, logged={"speculative_algorithm": "none"}, effective={}
    )
    assert base["refusal"] is None and "--speculative-config" not in base["argv"]
    assert (
        base["draft_config"] is None
        and base["draft_config_patch"] is None
        and base["draft_source"] is None
    )
    refused = export_logged(
        tmp_path,
        monkeypatch,
        tiny,
        logged={"num_steps": 3, "topk": 4, "num_draft_tokens": 8},
        effective={"num_steps": 3, "topk": 4, "num_draft_tokens": 8},
    )
    assert refused["refusal"].startswith("topk 4: vLLM's EAGLE proposes one chain")


def test_export_prints_secret_values_as_names(tmp_path, monkeypatch, tiny):
    out = export_logged(
        tmp_path,
        monkeypatch,
        tiny,
        logged={
            "num_steps": 3,
            "env": {"HF_TOKEN": "<redacted>"},
            "server_args": {"api_key": "<redacted>"},
        },
        effective={"num_steps": 3, "num_draft_tokens": 4},
    )
    assert out["env"]["HF_TOKEN"] == "$HF_TOKEN"
    assert is_hidden(out["argv"][out["argv"].index("--api-key") + 1])


def test_the_engine_names_its_vllm_version_for_the_parent_run(tmp_path, tiny):
    spec = load_spec(write_spec(tmp_path, tiny, python=sys.executable))
    assert engine_class("vllm").versions(spec) == {"version.vllm": "not installed"}
    assert installed_version(VllmServer(python=str(tmp_path / "missing" / "python"))).startswith(
        "unknown ("
    )


def test_a_relative_python_is_the_interpreter_beside_the_spec_not_its_symlink_target(
    tmp_path, tiny
):
    """``engine.vllm.python: ../venv/bin/python`` names that venv's interpreter: resolving the
    symlink would lose the venv (a venv's python is a symlink to the base interpreter, without
    vLLM's packages)."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    (tmp_path / "exp").mkdir()
    spec = load_spec(write_spec(tmp_path / "exp", tiny, python="../venv/bin/python"))
    assert spec.engine.vllm.python == str(venv / "python")


# -- with vLLM's environment
# ---------------------------------------------------------------------------------


def test_the_exported_argv_is_taken_unchanged_by_vllms_parser_and_resolution(
    tmp_path, monkeypatch, tiny, make_draft, vllm_python
):
    """The export's argv, after its launch command, as vLLM's own parser, entry-point checks and
    ``create_engine_config`` take it, with the draft copy made as the export says: vLLM captures [2,
    6, 10]."""
    draft = make_draft("draft")
    logged = {
        IDS: [1, 5, 9],
        "num_steps": 3,
        "dtype": "float32",
        "env": CPU,
        "server_args": CPU_ARGS,
    }
    out = export_logged(
        tmp_path,
        monkeypatch,
        tiny,
        logged=logged,
        draft=draft,
        python=vllm_python,
        effective={"num_steps": 3, "num_draft_tokens": 4, "vllm_aux_layer_ids": [2, 6, 10]},
    )
    assert (
        out["checked"] == "vLLM 0.32.0 parser and engine-args resolution" and out["refusal"] is None
    )
    assert out["server_version"] == "0.32.0" and out["argv"][0] == vllm_python
    prepare_draft_dir(
        Path(out["draft_source"]),
        out["draft_config_patch"][IDS],
        out_dir=Path(out["draft_config"]).parent,
    )
    oracle = Oracle(python=vllm_python)
    try:
        verdict = oracle.judge(out["argv"][3:], env=out["env"], resolve=True)
    finally:
        oracle.close()
    assert verdict is not None and verdict.ok, (verdict.stage, verdict.error, verdict.where)
    spec = verdict.resolved["speculative"]
    assert spec["aux_layer_ids"] == [2, 6, 10] and spec["aux_layer_source"].startswith("top")
    assert spec["num_speculative_tokens"] == 3 and spec["model"] == str(
        tmp_path / "draft-vllm-ids-2-6-10"
    )
    assert verdict.resolved["dtype"] == "float32" and verdict.resolved["max_model_len"] == 512


def test_the_shipped_vllm_spec_names_the_vllm_venv(vllm_python):
    """``experiments/tiny-vllm.yaml``'s relative ``python`` is ``.vllm-venv/bin/python``, which has
    vLLM 0.32."""
    spec = load_spec(ROOT / "experiments" / "tiny-vllm.yaml")
    assert spec.engine.vllm.python == str(ROOT / ".vllm-venv" / "bin" / "python")
    assert VllmEngine.versions(spec)["version.vllm"].startswith("0.32")


def test_a_relative_vllm_python_is_taken_from_the_working_directory(tmp_path, monkeypatch, tiny):
    """``--vllm-python venv/bin/python`` (a path relative to where the command runs) names that
    venv's interpreter for the launch, the oracle and the version; its symlink is kept (it is the
    venv)."""
    from bisect_eagle.engines.vllm.oracle import interpreter
    from bisect_eagle.engines.vllm.planner import Planner

    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    monkeypatch.chdir(tmp_path)
    server = VllmServer(python="venv/bin/python")
    assert Planner(server, tiny.target, tiny.draft, check=False).command[0] == str(venv / "python")
    assert interpreter(launch_command=list(server.launch_command), python=server.python) == str(
        venv / "python"
    )
    assert installed_version(server) == "not installed"
    spec = load_spec(write_spec(tmp_path, tiny, python=sys.executable))
    out = VllmEngine.export(
        spec,
        settings_from({"num_steps": 3}, "trial"),
        effective={},
        port=30000,
        python="venv/bin/python",
    )
    assert out["argv"][0] == str(venv / "python")
