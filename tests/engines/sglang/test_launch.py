"""Launch building: argv lists, flag adaptation to the installed version, --help probe, secrets,
draft copies."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from sglang_helpers import FAKE, fake_draft, server, settings

from bisect_eagle.engines.sglang.flags import ServerFlags, adapt_args, probe_help
from bisect_eagle.engines.sglang.launch import (
    Launch,
    argv_tokens,
    draft_config_patch,
    launch_of,
    launch_text,
    prepare_draft_dir,
    trial_args,
)
from bisect_eagle.errors import BadInput
from bisect_eagle.tracking.redact import hidden, redact_argv


def argv_of(s, *, srv=None, target="/m/target", draft="/d", port=31000) -> list[str]:
    return argv_tokens(
        trial_args(
            s,
            server=srv or server(),
            target=Path(target),
            draft_dir=None if s.is_baseline else Path(draft),
            port=port,
        )
    )


def test_argv_is_a_list_with_speculative_and_server_settings(tmp_path):
    s = settings(
        num_steps=4,
        topk=2,
        num_draft_tokens=8,
        env={"NCCL_ALGO": "Tree"},
        server_args={
            "disable_custom_all_reduce": True,
            "attention_backend": "fa3",
            "enable_symm_mem": False,
            "json_model_override_args": '{"a": 1}',
        },
    )
    argv = argv_of(s, srv=server(tp=8), draft=str(tmp_path / "d"))
    assert all(isinstance(t, str) for t in argv)
    joined = " ".join(argv)
    for part in (
        "--model-path /m/target",
        "--tp-size 8",
        "--host 127.0.0.1",
        "--port 31000",
        "--speculative-algorithm EAGLE3",
        f"--speculative-draft-model-path {tmp_path / 'd'}",
        "--speculative-num-steps 4",
        "--speculative-eagle-topk 2",
        "--speculative-num-draft-tokens 8",
        "--disable-custom-all-reduce --attention-backend fa3",
        '--json-model-override-args {"a": 1}',
    ):
        assert part in joined
    assert "--enable-symm-mem" not in argv  # false: the server's default
    assert "--device" not in argv and "--dtype" not in argv  # not set explicitly


def test_baseline_has_no_speculative_flags_and_explicit_device_is_passed():
    argv = argv_of(settings(speculative_algorithm="none", device="cuda", dtype="bfloat16"))
    assert not any(t.startswith("--speculative") for t in argv)
    assert (
        argv[argv.index("--device") + 1] == "cuda" and argv[argv.index("--dtype") + 1] == "bfloat16"
    )


def test_topk1_passes_the_requested_draft_tokens_for_the_server_to_override():
    argv = argv_of(settings(num_steps=3, topk=1, num_draft_tokens=8))
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "8"
    argv = argv_of(settings(num_steps=3, topk=1))
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"


def test_server_args_cannot_set_managed_flags():
    with pytest.raises(BadInput, match=r"server_args.port.*engine"):
        argv_of(settings(server_args={"port": 1}))
    with pytest.raises(BadInput, match=r"--speculative-num-steps.*num_steps"):
        argv_of(settings(server_args={"speculative_num_steps": 2}))


def test_flags_adapted_to_the_installed_version_and_unknown_ones_refused():
    flags = ServerFlags(
        ("/py", "-m", "sglang.launch_server"),
        frozenset(
            {
                "--model-path",
                "--tensor-parallel-size",
                "--host",
                "--port",
                "--speculative-algorithm",
                "--speculative-draft-model-path",
                "--speculative-num-steps",
                "--speculative-eagle-topk",
                "--speculative-num-draft-tokens",
                "--cuda-graph-max-bs-decode",
                "--cuda-graph-max-bs-prefill",
            }
        ),
        "0.5.23",
        "--help",
    )
    s = settings(server_args={"cuda_graph_max_bs": 16})
    args = trial_args(s, server=server(), target=Path("/m"), draft_dir=Path("/d"), port=1)
    adapted, notes = adapt_args(args, flags, shown_command="srv")
    argv = argv_tokens(adapted)
    assert (
        argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "16"
        and "--cuda-graph-max-bs" not in argv
    )
    assert "--tensor-parallel-size" in argv and "--tp-size" not in argv and "renamed" in notes[0]
    args = trial_args(
        settings(server_args={"attention_backend": "fa3"}),
        server=server(),
        target=Path("/m"),
        draft_dir=Path("/d"),
        port=1,
    )
    with pytest.raises(BadInput) as e:
        adapt_args(args, flags, shown_command=str(FAKE))
    assert "settings.server_args.attention_backend" in str(
        e.value
    ) and "--attention-backend" in str(e.value)
    assert str(FAKE) in str(e.value)  # the launch command it was checked against


def test_without_a_probe_flags_take_the_newest_known_names():
    args = trial_args(
        settings(server_args={"cuda_graph_max_bs": 8}),
        server=server(),
        target=Path("/m"),
        draft_dir=Path("/d"),
        port=1,
    )
    adapted, notes = adapt_args(args, None, shown_command="srv")
    assert "--cuda-graph-max-bs-decode" in argv_tokens(adapted) and "0.5.23" in notes[0]


def test_probe_reads_help_and_version():
    flags = probe_help([sys.executable, str(FAKE)], shown="fake")
    assert {
        "--port",
        "--mem-fraction-static",
        "--tp-size",
        "--cuda-graph-max-bs-decode",
    } <= flags.flags
    assert flags.version == "0.1.0" and flags.command[0] == sys.executable
    with pytest.raises(BadInput, match="--help"):
        probe_help([sys.executable, "-c", "import sys; sys.exit(3)"], shown="x")


def test_secrets_are_never_written():
    argv = ["srv", "--api-key", "abc", "--hf-token=xyz", "--speculative-num-draft-tokens", "4"]
    assert redact_argv(argv) == [
        "srv",
        "--api-key",
        hidden("abc"),
        f"--hf-token={hidden('xyz')}",
        "--speculative-num-draft-tokens",
        "4",
    ]
    text = launch_text(
        argv,
        {"HF_TOKEN": "t0k", "NCCL_ALGO": "Tree"},
        environ={
            "NCCL_DEBUG": "INFO",
            "WANDB_API_KEY": "k",
            "SGLANG_BEARER": "b3arer",
            "SGLANG_MINE": "m1ne",
            "SGLANG_LOG_GC": "1",
        },
    )
    assert "abc" not in text and "xyz" not in text and "t0k" not in text and "WANDB" not in text
    assert "b3arer" not in text and "SGLANG_BEARER" not in text  # a credential's name: left out
    assert "m1ne" not in text  # no SGLang variable: named, its value not shown
    assert "export SGLANG_LOG_GC=1" in text  # an SGLang variable
    assert "NCCL_ALGO=Tree" in text and "NCCL_DEBUG=INFO" in text
    assert "# also set, values not shown: HF_TOKEN\n" in text
    assert "values not shown: SGLANG_MINE\n" in text


def test_draft_copy_links_weights_and_nests_the_ids(tmp_path):
    draft = fake_draft(tmp_path)
    out = prepare_draft_dir(
        draft, config_patch=draft_config_patch([2, 6, 10]), out_dir=tmp_path / "trial" / "draft"
    )
    assert (out / "model.safetensors").is_symlink()
    assert (out / "model.safetensors").resolve() == (draft / "model.safetensors").resolve()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": [2, 6, 10],
        "use_aux_hidden_state": True,
    }
    assert "eagle_aux_hidden_state_layer_ids" not in cfg  # nested only: the one place SGLang reads
    assert json.loads((draft / "config.json").read_text())["eagle_config"][
        "eagle_aux_hidden_state_layer_ids"
    ] == [
        1,
        5,
        9,
    ]
    assert not (tmp_path / "trial" / "draft.partial").exists()


def test_draft_copy_refuses_a_different_count_and_bad_ids(tmp_path):
    draft = fake_draft(tmp_path)
    with pytest.raises(BadInput, match=r"config.json.*3 aux layers.*\[1, 5\] has 2"):
        prepare_draft_dir(draft, config_patch=draft_config_patch([1, 5]), out_dir=tmp_path / "x")
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.partial").exists()
    with pytest.raises(BadInput, match="repeats"):
        draft_config_patch([1, 1, 5])
    assert draft_config_patch([-1, 2, 30]) == {
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 2, 30]}
    }


def test_a_launch_sets_its_own_port_and_draft_copy_and_belongs_to_one_plan(tmp_path):
    from dataclasses import replace

    from bisect_eagle.engines.plan import make_plan

    s = settings(num_steps=4)
    args = tuple(
        trial_args(s, server=server(), target=Path("/m"), draft_dir=Path("/shown/draft"), port=1)
    )
    plan = make_plan("sglang", s, effective={"num_steps": 4})
    plan = replace(plan, private={"launch": Launch(fingerprint=plan.fingerprint, args=args)})
    argv, shown = launch_of(plan).argv(port=31234, draft_dir=tmp_path / "draft"), argv_tokens(args)
    port, draft = argv.index("--port") + 1, argv.index("--speculative-draft-model-path") + 1
    assert (argv[port], argv[draft]) == ("31234", str(tmp_path / "draft"))
    assert len(argv) == len(shown)
    assert all(
        a == b for i, (a, b) in enumerate(zip(argv, shown, strict=True)) if i not in (port, draft)
    )
    with pytest.raises(RuntimeError, match="a bug"):
        launch_of(replace(plan, fingerprint="0" * 16))  # changed after planning
    with pytest.raises(RuntimeError, match="no launch"):
        launch_of(make_plan("sglang", s, effective={}))
