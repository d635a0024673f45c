"""The launch of one vLLM trial: argv, environment, the per-trial draft copy, layer ids in vLLM's
convention."""

from __future__ import annotations

import json

import pytest

from bisect_eagle.engines.vllm import ids as idmod
from bisect_eagle.engines.vllm.launch import (
    argv_tokens,
    extra_args,
    launch_text,
    prepare_draft_dir,
    server_arg,
    trial_args,
    vllm_env,
)
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import VllmServer
from bisect_eagle.spec.settings import LiveSettings


def test_speculative_trial_argv(tmp_path):
    s = LiveSettings(
        num_steps=3,
        dtype="float32",
        server_args={
            "enforce_eager": True,
            "max_model_len": 512,
            "disable_log_stats": False,
            "seed": None,
        },
    )
    server = VllmServer(
        tp=2, extra_args=["--max-num-seqs", "1", "--distributed-executor-backend", "uni"]
    )
    argv = argv_tokens(
        trial_args(s, server=server, target=tmp_path / "t", draft_dir=tmp_path / "d", port=31001)
    )
    assert argv[:8] == [
        "--model",
        str(tmp_path / "t"),
        "--tensor-parallel-size",
        "2",
        "--host",
        "127.0.0.1",
        "--port",
        "31001",
    ]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": str(tmp_path / "d"), "num_speculative_tokens": 3}
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert "--enforce-eager" in argv and argv[argv.index("--max-model-len") + 1] == "512"
    # false and null: vLLM's own default
    assert "--disable-log-stats" not in argv and "--seed" not in argv
    assert argv[-4:] == ["--max-num-seqs", "1", "--distributed-executor-backend", "uni"]


def test_baseline_and_defaults(tmp_path):
    argv = argv_tokens(
        trial_args(
            LiveSettings(speculative_algorithm="none"),
            server=VllmServer(),
            target=tmp_path,
            draft_dir=None,
            port=1,
        )
    )
    # dtype only when set explicitly
    assert "--speculative-config" not in argv and "--dtype" not in argv
    eagle = argv_tokens(
        trial_args(
            LiveSettings(speculative_algorithm="EAGLE", num_steps=2),
            server=VllmServer(),
            target=tmp_path,
            draft_dir=tmp_path / "d",
            port=1,
        )
    )
    assert json.loads(eagle[eagle.index("--speculative-config") + 1])["method"] == "eagle"


def test_negated_flag_that_defaults_on(tmp_path):
    s = LiveSettings(server_args={"enable_prefix_caching": False})
    argv = argv_tokens(
        trial_args(
            s,
            server=VllmServer(),
            target=tmp_path,
            draft_dir=tmp_path / "d",
            port=1,
            negated=["enable_prefix_caching"],
        )
    )
    assert "--no-enable-prefix-caching" in argv


@pytest.mark.parametrize(
    "key",
    [
        "speculative_config",
        "speculative_config.method",
        "model",
        "port",
        "dtype",
        "spec_tokens",
        "tensor_parallel_size",
    ],
)
def test_flags_the_engine_sets_are_refused(key):
    with pytest.raises(BadInput, match="is set by the engine"):
        server_arg(key, "x")


def test_an_alias_of_a_managed_flag_is_refused_with_the_parsers_dests():
    with pytest.raises(BadInput, match="engine.vllm.tp"):
        server_arg("tp_size", 2, dest_of={"--tp-size": "tensor_parallel_size"})
    with pytest.raises(BadInput, match="set by the engine"):
        extra_args(["--port", "1"])
    with pytest.raises(BadInput, match="a flag"):
        extra_args(["512"])


def test_environment_sets_vllm_host_ip():
    env, notes = vllm_env(LiveSettings(env={"VLLM_CPU_KVCACHE_SPACE": "1"}), host="127.0.0.1")
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1"} and notes == []
    env, _ = vllm_env(LiveSettings(env={"VLLM_HOST_IP": "10.0.0.1"}), host="127.0.0.1")
    assert env["VLLM_HOST_IP"] == "10.0.0.1"
    env, notes = vllm_env(LiveSettings(), host="localhost")
    assert "VLLM_HOST_IP" not in env and "not an IP address" in notes[0]
    text = launch_text(
        ["python", "-m", "x", "--api-key", "s3cr3t-value"],
        {"HF_TOKEN": "abc"},
        environ={"VLLM_LOGGING_LEVEL": "INFO", "PATH": "/bin"},
    )
    assert "s3cr3t-value" not in text and "abc" not in text and "VLLM_LOGGING_LEVEL=INFO" in text


def test_draft_copy_gets_the_ids_at_the_top_level(tiny, tmp_path):
    shipped = (tiny.draft / "config.json").read_text()
    out = prepare_draft_dir(tiny.draft, [2, 6, 10], out_dir=tmp_path / "trial" / "draft")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 6, 10]
    # nested: untouched (sizes fc)
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 5, 9]
    assert (out / "model.safetensors").is_symlink()
    assert (out / "model.safetensors").resolve() == (tiny.draft / "model.safetensors").resolve()
    # the shipped draft is never modified
    assert (tiny.draft / "config.json").read_text() == shipped
    assert idmod.draft_ids(cfg).read == ([2, 6, 10], "top-level")
    kept = prepare_draft_dir(tiny.draft, None, out_dir=tmp_path / "own")
    assert json.loads((kept / "config.json").read_text()) == json.loads(shipped)
    with pytest.raises(BadInput, match="already exists"):
        prepare_draft_dir(tiny.draft, None, out_dir=tmp_path / "own")
    with pytest.raises(BadInput, match=r"the draft's fc takes 3 aux layers .*\[2, 6\] has 2"):
        prepare_draft_dir(tiny.draft, [2, 6], out_dir=tmp_path / "two")


def test_request_ids_convert_to_vllm_ids():
    """SGLang's ids (output of layer L) → hidden_states index = vLLM id (input to layer L)."""
    assert idmod.to_vllm([1, 5, 9], model_type="llama", num_layers=12) == [2, 6, 10]
    # -1 = the embedding
    assert idmod.to_vllm([-1, 1, 5], model_type="llama", num_layers=12) == [0, 2, 6]
    assert idmod.from_vllm([2, 6, 10], model_type="llama", num_layers=12) == [1, 5, 9]
    # deepseek family
    assert idmod.to_vllm([3, 31, 59], model_type="glm_moe_dsa", num_layers=78) == [3, 31, 59]
    assert idmod.to_vllm([1, 5, 9], model_type=None, num_layers=None) == [2, 6, 10]


def test_where_vllm_reads_a_drafts_ids():
    nested = idmod.draft_ids({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 5, 9]}})
    assert nested.read == ([1, 5, 9], "eagle_config") and (nested.fc_width, nested.fc_source) == (
        3,
        "eagle_config.eagle_aux_hidden_state_layer_ids",
    )
    both = idmod.draft_ids(
        {
            "eagle_aux_hidden_state_layer_ids": [2, 6, 10],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 5, 9]},
        }
    )
    assert both.read == ([2, 6, 10], "top-level")
    empty_top = idmod.draft_ids(
        {
            "eagle_aux_hidden_state_layer_ids": [],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 5, 9]},
        }
    )
    assert empty_top.read == ([1, 5, 9], "eagle_config")  # vLLM: `if not layer_ids` falls through
    none = idmod.draft_ids({"num_aux_hidden_states": 4})
    assert none.read == (None, "default") and (none.fc_width, none.fc_source) == (
        4,
        "num_aux_hidden_states",
    )
    assert idmod.draft_ids({}).fc_width == 3
    assert idmod.default_ids(12) == [2, 6, 9]


def test_ids_outside_the_range_are_refused():
    assert idmod.refusal([2, 6, 10], num_layers=12, source="x") is None
    # embedding and final state are fine
    assert idmod.refusal([0, 6, 12], num_layers=12, source="x") is None
    msg = idmod.refusal([-1, 1, 5], num_layers=12, source="the draft's eagle_config ids")
    assert "[-1] outside [0, 12]" in msg and "dies at the first request" in msg
    assert "[13]" in idmod.refusal([2, 6, 13], num_layers=12, source="x")
    assert idmod.refusal([-1, 1, 5], num_layers=None, source="x") is not None
