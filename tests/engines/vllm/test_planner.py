"""The vllm plan with the project's own reading of vLLM's rules (no vLLM here), and then judged by
vLLM 0.32 itself.

The second half needs vLLM's environment (``.vllm-venv``); one oracle process (about 10 s to import
vLLM) judges every plan of the module.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bisect_eagle.engines.vllm.oracle import SCRIPT, Oracle
from bisect_eagle.engines.vllm.planner import DRAFT_PLACEHOLDER, Planner
from bisect_eagle.spec.schema import VllmServer
from bisect_eagle.spec.settings import LiveSettings

CPU = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
CPU_ARGS = [
    "--max-model-len",
    "512",
    "--max-num-seqs",
    "1",
    "--seed",
    "0",
    "--enforce-eager",
    "--distributed-executor-backend",
    "uni",
]


def plan(planner: Planner, tmp_path: Path, **settings):
    return planner.plan(
        LiveSettings(**settings), port=31000, draft_dir=tmp_path / "trials" / "001-trial" / "draft"
    )


# -- the project's own rules (check=False)
# --------------------------------------------------------------------


@pytest.fixture
def offline(tiny) -> Planner:
    return Planner(VllmServer(), tiny.target, tiny.draft, check=False)


def test_requested_ids_go_to_the_top_level_in_vllms_convention(offline, tmp_path):
    p = plan(offline, tmp_path, eagle_aux_hidden_state_layer_ids=[1, 5, 9])
    assert p.refusal is None and p.checked.startswith("not checked against vLLM")
    assert p.config_patch == {"eagle_aux_hidden_state_layer_ids": [2, 6, 10]}
    assert p.effective["vllm_aux_layer_ids"] == [2, 6, 10]
    assert p.effective["eagle_aux_hidden_state_layer_ids"] == [1, 5, 9]
    spec = json.loads(p.argv[p.argv.index("--speculative-config") + 1])
    assert spec == {
        "method": "eagle3",
        "model": str(tmp_path / "trials" / "001-trial" / "draft"),
        "num_speculative_tokens": 3,
    }
    assert p.env == {"VLLM_HOST_IP": "127.0.0.1"} and p.effective["env"] == {
        "VLLM_HOST_IP": "127.0.0.1"
    }
    assert not (tmp_path / "trials").exists()  # planning writes nothing


def test_the_drafts_own_nested_ids_are_read_verbatim(offline, tmp_path):
    p = plan(offline, tmp_path)
    assert p.refusal is None and p.config_patch is None
    # hidden_states 1, 5, 9: one layer shallower than SGLang
    assert p.effective["vllm_aux_layer_ids"] == [1, 5, 9]
    # the same states in SGLang's ids
    assert p.effective["eagle_aux_hidden_state_layer_ids"] == [0, 4, 8]
    assert any("vLLM reads eagle_config's [1, 5, 9] verbatim" in w for w in p.warnings)


@pytest.mark.parametrize(
    "ids", [{"nested": [-1, 1, 5]}, {"top_level": [-1, 1, 5]}, {"top_level": [2, 6, 13]}]
)
def test_draft_ids_outside_the_range_are_refused_before_launch(tiny, make_draft, tmp_path, ids):
    draft = make_draft("bad", **ids)
    p = plan(Planner(VllmServer(), tiny.target, draft, check=False), tmp_path)
    assert p.refusal is not None and "outside [0, 12]" in p.refusal


def test_id_count_must_match_the_fc_width(offline, tmp_path):
    p = plan(offline, tmp_path, eagle_aux_hidden_state_layer_ids=[1, 5])
    assert "the draft's fc takes 3 aux layers" in p.refusal
    p = plan(offline, tmp_path, eagle_aux_hidden_state_layer_ids=[1, 5, 12])
    assert "outside" in p.refusal  # sglang id 12 does not exist on a 12-layer target


@pytest.mark.parametrize(
    "settings,reason",
    [
        ({"topk": 2, "num_draft_tokens": 8}, "topk 2"),
        ({"speculative_adaptive": True}, "no adaptive speculation"),
        ({"num_steps": 0}, "num_steps must be >= 1"),
    ],
)
def test_what_vllm_cannot_run_is_refused(offline, tmp_path, settings, reason):
    assert reason in plan(offline, tmp_path, **settings).refusal


def test_baseline_and_identity(offline, tmp_path):
    base = plan(
        offline, tmp_path, speculative_algorithm="none", eagle_aux_hidden_state_layer_ids=[1, 5, 9]
    )
    assert "--speculative-config" not in base.argv and base.effective["num_steps"] == 0
    a = plan(offline, tmp_path, num_draft_tokens=4)
    b = plan(offline, tmp_path)
    c = plan(offline, tmp_path, num_draft_tokens=9)
    # vLLM verifies num_steps + 1 whatever is asked
    assert a.fingerprint == b.fingerprint == c.fingerprint
    assert any("num_draft_tokens 9 is not a vLLM setting" in w for w in c.warnings)
    other = offline.plan(LiveSettings(), port=32000, draft_dir=tmp_path / "elsewhere" / "draft")
    assert other.fingerprint == b.fingerprint  # port and trial directory are not the identity


def test_managed_server_args_are_refused(offline, tmp_path):
    assert (
        "is set by the engine"
        in plan(offline, tmp_path, server_args={"speculative_config": '{"x": 1}'}).refusal
    )


# -- judged by vLLM itself
# ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def judged(vllm_python, tiny):
    planner = Planner(VllmServer(python=vllm_python, extra_args=CPU_ARGS), tiny.target, tiny.draft)
    yield planner
    planner.close()


def test_plan_is_judged_and_resolved_by_vllm(judged, tmp_path):
    p = plan(judged, tmp_path, eagle_aux_hidden_state_layer_ids=[1, 5, 9], dtype="float32", env=CPU)
    assert p.refusal is None, p.refusal
    assert p.checked == "vLLM 0.32.0 parser and engine-args resolution"
    eff = p.effective
    # vLLM's own resolution, on a throwaway copy of the draft
    assert eff["vllm_aux_layer_ids"] == [2, 6, 10]
    assert (eff["dtype"], eff["device"], eff["speculative_method"], eff["num_steps"]) == (
        "float32",
        "cpu",
        "eagle3",
        3,
    )
    assert (
        eff["server"]["max_model_len"] == 512
        and eff["server"]["distributed_executor_backend"] == "uni"
    )
    # VLLM_CPU_KVCACHE_SPACE, read under the trial's env
    assert eff["server"]["kv_cache_memory_bytes"] == 1 << 30
    assert not (tmp_path / "trials").exists()


def test_vllm_resolves_the_drafts_own_ids_and_the_environment(judged, tmp_path):
    p = plan(judged, tmp_path, env={**CPU, "VLLM_NOT_A_VARIABLE": "1"})
    # eagle_config's, verbatim (gpu_model_runner.py)
    assert p.effective["vllm_aux_layer_ids"] == [1, 5, 9]
    # set for the server, not a setting vLLM reads
    assert "VLLM_NOT_A_VARIABLE" not in p.effective["env"]
    # a name vLLM does not know: hashed
    assert p.env["VLLM_NOT_A_VARIABLE"].startswith("<redacted sha256:")
    assert any(
        "env.VLLM_NOT_A_VARIABLE is not a variable vLLM 0.32.0 knows" in w for w in p.warnings
    )
    mp = plan(judged, tmp_path, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    # vLLM's CPU rule without the env
    assert mp.effective["server"]["distributed_executor_backend"] == "mp"
    assert mp.fingerprint != p.fingerprint


@pytest.mark.parametrize(
    "settings,reason",
    [
        (
            {"server_args": {"max_num_seqs": "lots"}},
            "api_server.py: error: argument --max-num-seqs: invalid int value",
        ),
        ({"server_args": {"no_such_flag": True}}, "unrecognized arguments: --no-such-flag"),
        (
            {"server_args": {"gpu_memory_utilization": 2.0}},
            "ValidationError: 1 validation error for CacheConfig",
        ),
    ],
)
def test_vllm_refuses_with_its_own_message(judged, tmp_path, settings, reason):
    p = plan(judged, tmp_path, env=CPU, **settings)
    assert (
        p.refusal is not None
        and p.refusal.startswith("vLLM refuses this launch")
        and reason in p.refusal
    )


def test_a_flag_given_twice_is_a_warning(judged, tmp_path):
    """engine.vllm.extra_args come last: vLLM's parser keeps them over settings.server_args,
    silently."""
    p = plan(judged, tmp_path, env=CPU, server_args={"max_model_len": 256})
    assert p.refusal is None and p.effective["server"]["max_model_len"] == 512
    assert any(
        "--max-model-len (settings.server_args.max_model_len), --max-model-len "
        "(engine.vllm.extra_args)"
        in w
        and "keeps the last one, --max-model-len 512" in w
        for w in p.warnings
    )


def test_oracle_script_answers_one_request_on_stdin(vllm_python, tiny):
    """``oracle_script.py`` as a one-shot command: one JSON request in, one JSON line out."""
    spec = json.dumps({"method": "eagle3", "model": DRAFT_PLACEHOLDER, "num_speculative_tokens": 2})
    request = {
        "argv": ["--model", str(tiny.target), *CPU_ARGS, "--speculative-config", spec],
        "env": CPU,
        "draft": {
            "source": str(tiny.draft),
            "top_level_ids": [3, 7, 11],
            "placeholder": DRAFT_PLACEHOLDER,
        },
    }
    res = subprocess.run(
        [vllm_python, str(SCRIPT)],
        input=json.dumps(request) + "\n",
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = res.stdout.splitlines()
    assert res.returncode == 0 and len(lines) == 1, res.stderr[-2000:]
    answer = json.loads(lines[0])
    assert answer["ok"] and answer["vllm_version"] == "0.32.0"
    spec_out = answer["resolved"]["speculative"]
    assert spec_out["aux_layer_ids"] == [3, 7, 11] and spec_out["aux_layer_source"] == "top-level"
    assert spec_out["model"] == DRAFT_PLACEHOLDER and spec_out["num_speculative_tokens"] == 2


def test_an_interpreter_without_vllm_means_not_checked(tiny, tmp_path):
    import sys

    oracle = Oracle(python=sys.executable)
    try:
        assert oracle.describe() is None and "cannot import vLLM" in oracle.failure
    finally:
        oracle.close()
    planner = Planner(VllmServer(python=sys.executable), tiny.target, tiny.draft)
    p = plan(planner, tmp_path)
    assert p.checked.startswith("not checked against vLLM (") and "cannot import vLLM" in p.checked
    planner.close()
