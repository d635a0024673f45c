"""The sglang engine: launch building, flag probe and adaptation, draft copies, failure classes, teardown.

Live trials run against ``fake_servers/fake_sglang.py`` (serve's flags and HTTP front, canned answers, a
child process like SGLang's scheduler); its fault is picked per trial through ``settings.env``.
"""

from __future__ import annotations

import json
import math
import socket
import sys
from pathlib import Path

import psutil
import pytest

from bisect_eagle.engines import procs
from bisect_eagle.engines.sglang import (
    SglangEngine,
    _Leftover,
    classify_failure,
    differences,
    dry_run,
    effective_settings,
)
from bisect_eagle.engines.sglang_launch import (
    ServerFlags,
    describe,
    draft_config_patch,
    launch_command,
    prepare_draft_dir,
    probe_flags,
    redact_argv,
)
from bisect_eagle.errors import BadInput
from bisect_eagle.settings import parse_settings
from bisect_eagle.spec import SglangServer, load_spec

FAKE = Path(__file__).resolve().parent / "fake_servers" / "fake_sglang.py"
EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
QUICK = {"max_new_tokens": 8, "num_prompts": 2, "warmup_prompts": 1, "concurrency": 2}


def settings(**kw):
    return parse_settings({**QUICK, **kw}, "test")


def server(**kw) -> SglangServer:
    base = {"launch_command": [sys.executable, str(FAKE)], "ready_timeout_s": 4, "request_timeout_s": 2,
            "stop_grace_s": 1, "gpu_release_timeout_s": 2}
    return SglangServer(**{**base, **kw})


def fake_draft(tmp_path: Path, ids=(1, 5, 9)) -> Path:
    d = tmp_path / "draft"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 8,
                                               "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids),
                                                                "use_aux_hidden_state": True}}))
    (d / "model.safetensors").write_bytes(b"weights")
    return d


# ---------------------------------------------------------------------------------------------------
# argv, env, flags


def test_argv_is_a_list_with_speculative_server_and_env_settings(tmp_path):
    s = settings(num_steps=4, topk=2, num_draft_tokens=8, env={"NCCL_ALGO": "Tree"},
                 server_args={"disable_custom_all_reduce": True, "attention_backend": "fa3",
                              "enable_symm_mem": False, "json_model_override_args": {"a": 1}})
    argv, env = launch_command(s, server(tp=8), Path("/m/target"), tmp_path / "d", 31000)
    assert isinstance(argv, list) and all(isinstance(t, str) for t in argv)
    joined = " ".join(argv)
    for part in ("--model-path /m/target", "--tp-size 8", "--host 127.0.0.1", "--port 31000",
                 "--speculative-algorithm EAGLE3", f"--speculative-draft-model-path {tmp_path / 'd'}",
                 "--speculative-num-steps 4", "--speculative-eagle-topk 2", "--speculative-num-draft-tokens 8",
                 "--disable-custom-all-reduce --attention-backend fa3", '--json-model-override-args {"a": 1}'):
        assert part in joined
    assert "--enable-symm-mem" not in argv  # false: the server's default
    assert "--device" not in argv and "--dtype" not in argv  # not set explicitly
    assert env == {"NCCL_ALGO": "Tree"}


def test_baseline_has_no_speculative_flags_and_explicit_device_is_passed():
    s = settings(speculative_algorithm="none", device="cuda", dtype="bfloat16")
    argv, _ = launch_command(s, server(), Path("/m"), None, 1)
    assert not any(t.startswith("--speculative") for t in argv)
    assert argv[argv.index("--device") + 1] == "cuda" and argv[argv.index("--dtype") + 1] == "bfloat16"


def test_topk1_passes_the_requested_draft_tokens_for_the_server_to_override():
    argv, _ = launch_command(settings(num_steps=3, topk=1, num_draft_tokens=8), server(), Path("/m"), Path("/d"), 1)
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "8"
    argv, _ = launch_command(settings(num_steps=3, topk=1), server(), Path("/m"), Path("/d"), 1)
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"


def test_server_args_cannot_set_managed_flags():
    with pytest.raises(BadInput, match=r"server_args.port.*engine"):
        launch_command(settings(server_args={"port": 1}), server(), Path("/m"), Path("/d"), 1)
    with pytest.raises(BadInput, match=r"--speculative-num-steps.*num_steps"):
        launch_command(settings(server_args={"speculative_num_steps": 2}), server(), Path("/m"), Path("/d"), 1)


def test_flags_adapted_to_the_installed_version_and_unknown_ones_refused():
    flags = ServerFlags(("/py", "-m", "sglang.launch_server"), frozenset({
        "--model-path", "--tensor-parallel-size", "--host", "--port", "--speculative-algorithm",
        "--speculative-draft-model-path", "--speculative-num-steps", "--speculative-eagle-topk",
        "--speculative-num-draft-tokens", "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"}), "0.5.23")
    s = settings(server_args={"cuda_graph_max_bs": 16})
    argv, _ = launch_command(s, server(), Path("/m"), Path("/d"), 1, flags)
    assert argv[:3] == ["/py", "-m", "sglang.launch_server"]
    assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "16" and "--cuda-graph-max-bs" not in argv
    assert "--tensor-parallel-size" in argv and "--tp-size" not in argv
    with pytest.raises(BadInput) as e:
        launch_command(settings(server_args={"attention_backend": "fa3"}), server(), Path("/m"), Path("/d"), 1, flags)
    assert "settings.server_args.attention_backend" in str(e.value) and "--attention-backend" in str(e.value)
    assert str(FAKE) in str(e.value)  # the launch command it was checked against


def test_probe_reads_help_and_version():
    flags = probe_flags([sys.executable, str(FAKE)])
    assert {"--port", "--mem-fraction-static", "--tp-size", "--tp", "--cuda-graph-max-bs-decode"} <= flags.flags
    assert flags.version == "0.1.0" and flags.command[0] == sys.executable
    with pytest.raises(BadInput, match="--help"):
        probe_flags([sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(BadInput, match="neither"):
        probe_flags(["no-such-server-binary"])


def test_secrets_are_never_written():
    argv = ["srv", "--api-key", "abc", "--hf-token=xyz", "--speculative-num-draft-tokens", "4"]
    assert redact_argv(argv) == ["srv", "--api-key", "<redacted>", "--hf-token=<redacted>",
                                 "--speculative-num-draft-tokens", "4"]
    text = describe(argv, {"HF_TOKEN": "t0k", "NCCL_ALGO": "Tree"}, {"NCCL_DEBUG": "INFO", "WANDB_API_KEY": "k"})
    assert "abc" not in text and "xyz" not in text and "t0k" not in text and "WANDB" not in text
    assert "NCCL_ALGO=Tree" in text and "NCCL_DEBUG=INFO" in text and "1 secret variable" in text


# ---------------------------------------------------------------------------------------------------
# per-trial draft directory


def test_draft_copy_links_weights_and_nests_the_ids(tmp_path):
    draft = fake_draft(tmp_path)
    out = prepare_draft_dir(draft, [2, 6, 10], tmp_path / "trial" / "draft")
    assert (out / "model.safetensors").is_symlink()
    assert (out / "model.safetensors").resolve() == (draft / "model.safetensors").resolve()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [2, 6, 10], "use_aux_hidden_state": True}
    assert "eagle_aux_hidden_state_layer_ids" not in cfg  # nested only: the one place SGLang reads
    assert json.loads((draft / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == \
        [1, 5, 9]
    assert not (tmp_path / "trial" / "draft.partial").exists()


def test_draft_copy_refuses_a_different_count_and_bad_ids(tmp_path):
    draft = fake_draft(tmp_path)
    with pytest.raises(BadInput, match=r"config.json.*3 aux layers.*\[1, 5\] has 2"):
        prepare_draft_dir(draft, [1, 5], tmp_path / "x")
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.partial").exists()
    with pytest.raises(BadInput, match="repeats"):
        draft_config_patch([1, 1, 5])
    assert draft_config_patch([-1, 2, 30]) == {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 2, 30]}}


# ---------------------------------------------------------------------------------------------------
# classification and read-back


@pytest.mark.parametrize("phase,log,timed_out,cls", [
    ("start", "usage: launch_server [-h]\nlaunch_server: error: argument --tp-size: invalid int value: 'x'\n",
     False, "bad_arguments"),
    ("start", 'Traceback:\n  File "/sglang/srt/server_args.py", line 9, in __post_init__\nAssertionError\n',
     False, "bad_arguments"),
    ("start", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", False, "out_of_memory"),
    ("benchmark", "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static", False,
     "out_of_memory"),
    ("start", "RuntimeError: captured 2 of 3 aux hidden states", False, "capture_error"),
    ("start", "ValueError: bad eagle_aux_hidden_state_layer_ids in config", False, "capture_error"),
    ("start", "INFO using eagle_aux_hidden_state_layer_ids [1, 5]\nImportError: no flashinfer", False, "launch_error"),
    ("ready_timeout", "loading weights...", False, "readiness_timeout"),
    ("benchmark", "", True, "hung_request"),
    ("benchmark", "", False, "crash_during_benchmark"),
])
def test_failure_classes(phase, log, timed_out, cls):
    assert classify_failure(phase, log, timed_out)[0] == cls


def test_effective_settings_come_from_server_info_and_differences_warn():
    s = settings(num_steps=3, topk=1, num_draft_tokens=8, concurrency=4, server_args={"attention_backend": "fa3"})
    info = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4, "max_running_requests": 2, "attention_backend": "triton",
            "version": "0.5.23", "device": "cuda", "dtype": "auto"}
    eff = effective_settings(s, info, [1, 5, 9])
    assert eff["num_draft_tokens"] == 4 and eff["concurrency"] == 2 and eff["eagle_aux_hidden_state_layer_ids"] == \
        [1, 5, 9]
    assert eff["server"] == {"version": "0.5.23", "max_running_requests": 2, "attention_backend": "triton"}
    notes = " | ".join(differences(s, eff))
    assert "num_draft_tokens = 4, requested 8" in notes and "concurrency = 2" in notes
    assert "server_args.attention_backend = 'triton'" in notes
    assert "dtype" not in notes and "device" not in notes  # not requested explicitly


# ---------------------------------------------------------------------------------------------------
# dry run of the shipped specs


def test_glm5_spec_dry_run_needs_no_model_files(tmp_path):
    spec = load_spec(EXPERIMENTS / "glm5-8gpu.yaml")
    from bisect_eagle.spec import settings_from

    fixed = dict(spec.engine.settings)
    trials = [spec.fixed_settings(),
              settings_from({**fixed, "eagle_aux_hidden_state_layer_ids": [-1, 2, 30], "num_steps": 5, "topk": 4,
                             "num_draft_tokens": 16, "env.NCCL_ALGO": "Tree", "env.NCCL_PROTO": "LL128",
                             "server_args.disable_custom_all_reduce": True,
                             "server_args.attention_backend": "trtllm_mla"}, "test")]
    plan = dry_run(spec, trials, tmp_path / "logs", check_flags=False)
    first, second = (p for _, p in plan.plans)
    assert "--tp-size 8" in " ".join(first.argv) and "--cuda-graph-max-bs 8" in " ".join(first.argv)
    assert first.config_patch is None and second.config_patch == draft_config_patch([-1, 2, 30])
    assert second.env == {"SGLANG_ENABLE_SPEC_V2": "1", "NCCL_ALGO": "Tree", "NCCL_PROTO": "LL128"}
    assert "--disable-custom-all-reduce" in second.argv and "--attention-backend" in second.argv
    assert str(second.draft_dir).startswith(str(tmp_path / "logs" / "002-"))
    text = plan.text()
    assert "## trial 2" in text and "env NCCL_ALGO=Tree" in text and "eagle_aux_hidden_state_layer_ids" in text
    assert not (tmp_path / "logs").exists()  # nothing written
    assert json.loads(json.dumps(plan.to_json()))["trials"][1]["config_patch"] == second.config_patch


def test_tiny_sglang_spec_dry_run(tiny, tmp_path):
    spec = load_spec(EXPERIMENTS / "tiny-sglang.yaml")
    plan = dry_run(spec, [spec.fixed_settings()], tmp_path, check_flags=False)
    argv = plan.plans[0][1].argv
    assert Path(argv[0]).name == "bisect-eagle" and argv[1] == "serve"
    assert argv[argv.index("--model-path") + 1] == str(tiny.target)


# ---------------------------------------------------------------------------------------------------
# live trials against the scripted server


def _gone(result) -> None:
    """No process of the trial's server is left and its port is free."""
    teardown = json.loads(result.artifacts["teardown.json"])
    for pid in teardown["pids"]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not [p for p in psutil.Process().children(recursive=True) if "fake_sglang" in " ".join(p.cmdline())]
    port = int(result.artifacts["launch_command.txt"].split("--port ")[1].split()[0])
    assert procs.port_is_free("127.0.0.1", port)
    assert {"launch_command.txt", "effective.json", "server.log"} <= set(result.artifacts)


@pytest.fixture(scope="module")
def engine(tiny, tmp_path_factory):
    logs = tmp_path_factory.mktemp("sglang-logs")
    with SglangEngine(server(), tiny.target, tiny.draft, tiny.prompts, logs) as e:
        yield e


def test_healthy_trial_measures_reads_back_and_records(engine):
    s = settings(num_steps=3, topk=1, num_draft_tokens=8, eagle_aux_hidden_state_layer_ids=[5, 9, 10],
                 env={"NCCL_ALGO": "Tree", "HF_TOKEN": "hf_secret"},
                 server_args={"cuda_graph_max_bs": 4, "disable_custom_all_reduce": True})
    r = engine.run(s)
    assert r.ok, r.failure_detail
    assert r.accept_length == 2.0 and r.server_accept_length == 2.0  # 8 tokens in 4 verify steps
    assert r.accept_length_hist == {2: 8}
    assert r.accept_rate_per_position[:2] == [1.0, 0.0] and math.isnan(r.accept_rate_per_position[2])
    assert [q.completion_tokens for q in r.requests] == [8, 8] and r.output_tok_s > 0
    assert r.effective["server"]["max_running_requests"] == 8
    assert r.effective["eagle_aux_hidden_state_layer_ids"] == [5, 9, 10]
    assert r.effective["server_args"] == {"cuda_graph_max_bs": 4, "disable_custom_all_reduce": True}
    text = r.artifacts["launch_command.txt"]
    assert "--cuda-graph-max-bs-decode 4" in text and "NCCL_ALGO=Tree" in text and "hf_secret" not in text
    assert json.loads(r.artifacts["server_info.json"])["api_key"] == "<redacted>"
    assert any("renamed" in w for w in r.warnings) and any("topk == 1 forces" in w for w in r.warnings)
    draft_cfg = json.loads((engine.log_dir / next(p.name for p in engine.log_dir.iterdir()) / "draft" /
                            "config.json").read_text())
    assert draft_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [5, 9, 10]
    assert json.loads(r.artifacts["teardown.json"])["signal"] == "SIGTERM"
    _gone(r)


@pytest.mark.parametrize("fault,extra,cls", [
    ("", {"server_args": {"mem_fraction_static": "lots"}}, "bad_arguments"),
    ("oom", {}, "out_of_memory"),
    ("capture", {}, "capture_error"),
    ("never_ready", {}, "readiness_timeout"),
    ("dies", {}, "crash_during_benchmark"),
    ("hangs", {}, "hung_request"),
])
def test_each_fault_is_one_failed_trial_and_the_study_goes_on(engine, fault, extra, cls):
    env = {"FAKE_SGLANG_FAULT": fault} if fault else {}
    r = engine.run(settings(env=env, **extra))
    assert r.status == "failed" and r.failure_class == cls, r.failure_detail
    assert "server log tail" in r.failure_detail and r.artifacts["server.log"]
    _gone(r)
    after = engine.run(settings())
    assert after.ok and after.accept_length == 2.0
    _gone(after)


def test_a_server_ignoring_sigterm_is_killed_with_its_group(engine):
    r = engine.run(settings(env={"FAKE_SGLANG_FAULT": "ignores_sigterm"}))
    assert r.ok
    teardown = json.loads(r.artifacts["teardown.json"])
    assert teardown["signal"] == "SIGKILL" and len(teardown["pids"]) == 2 and not teardown["survivors"]
    assert any("SIGKILL" in w for w in r.warnings)
    _gone(r)


def test_unknown_flag_is_refused_before_anything_starts(engine):
    before = set(engine.log_dir.iterdir())
    with pytest.raises(BadInput) as e:
        engine.run(settings(server_args={"no_such_flag": 3}))
    assert "--no-such-flag" in str(e.value) and "fake_sglang.py" in str(e.value)
    assert set(engine.log_dir.iterdir()) == before and not psutil.Process().children(recursive=True)


def test_a_server_that_will_not_go_away_blocks_the_next_launch(engine):
    old = procs.start_server([sys.executable, "-c", "pass"], {}, engine.log_dir / "old.log")
    procs.stop_server(old, 1)
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    engine._leftover = _Leftover(old, "127.0.0.1", port, f"port {port} still taken")
    try:
        r = engine.run(settings())
        assert r.failure_class == "launch_error" and "refusing to start another" in r.failure_detail
    finally:
        holder.close()
    assert engine.run(settings()).ok and engine._leftover is None


def test_gpu_release_waits_for_the_servers_pids(tmp_path, monkeypatch):
    held = tmp_path / "held"
    held.write_text("1234, 500\n4321, 0\n")
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(f"#!/bin/sh\n/bin/cat {held} 2>/dev/null\nexit 0\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(smi.parent))
    assert procs.gpu_memory_by_pid() == {1234: 500, 4321: 0}
    gpu = procs.wait_gpu_release([1234, 99], 0.2)
    assert gpu.status == "held" and gpu.holders == {1234: 500}
    held.unlink()
    assert procs.wait_gpu_release([1234], 1).status == "released"
    monkeypatch.setenv("PATH", str(tmp_path))
    assert procs.wait_gpu_release([1234], 1).status == "unchecked"
