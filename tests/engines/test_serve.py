"""``bisect-eagle serve``: SGLang's flags and API over the local decoder, equal to the local engine,
clean exit."""

from __future__ import annotations

import os
import sys

import httpx
import pytest
import torch
import typer
from typer.testing import CliRunner

from bisect_eagle.artifacts.draft import load_draft
from bisect_eagle.artifacts.prompts import load_prompts
from bisect_eagle.artifacts.target import load_target
from bisect_eagle.engines.local import LocalEngine, SpeculativeDecoder
from bisect_eagle.engines.procs import server as procs
from bisect_eagle.engines.serve import (
    LL_DELAY_S,
    READY_LINE,
    Rejected,
    build_backend,
    build_parser,
    check_args,
    parse_generate,
    simulation,
)
from bisect_eagle.engines.sglang import SglangEngine
from bisect_eagle.engines.sglang.client import SglangClient
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import SglangServer
from bisect_eagle.spec.settings import parse_settings

from helpers import MARK_ENV, marked_processes, new_mark

SERVE = [sys.executable, "-m", "bisect_eagle.engines.serve"]
TRIAL = {"num_steps": 3, "topk": 1, "max_new_tokens": 12, "num_prompts": 2, "warmup_prompts": 1}


def test_serve_gives_the_local_engines_accept_length(tiny, tmp_path, monkeypatch):
    mark = new_mark()  # the server inherits it: another test's servers may run beside this one
    monkeypatch.setenv(MARK_ENV, mark)
    settings = parse_settings({**TRIAL, "eagle_aux_hidden_state_layer_ids": [1, 5, 9]}, "test")
    server = SglangServer(
        launch_command=SERVE,
        ready_timeout_s=120,
        request_timeout_s=60,
        stop_grace_s=10,
        gpu_release_timeout_s=5,
    )
    with SglangEngine(
        server, target=tiny.target, draft=tiny.draft, prompts=tiny.prompts, log_dir=tmp_path
    ) as engine:
        plan = engine.plan(settings)
        # the stand-in's own parser judged it
        assert plan.checked.startswith("`bisect-eagle serve` parser")
        remote = engine.run(plan)
    assert remote.ok, remote.failure_detail
    with LocalEngine(tiny.target, tiny.draft, tiny.prompts) as local_engine:
        local = local_engine.run(local_engine.plan(settings))
    assert remote.accept_length == local.accept_length
    assert remote.accept_length_hist == local.accept_length_hist
    assert remote.accept_rate_per_position == local.accept_rate_per_position
    assert [(r.id, r.completion_tokens, r.verify_steps) for r in remote.requests] == [
        (r.id, r.completion_tokens, r.verify_steps) for r in local.requests
    ]
    # warm-up flushed away
    assert remote.server_accept_length == pytest.approx(remote.accept_length)
    eff = remote.effective
    assert (eff["num_steps"], eff["topk"], eff["num_draft_tokens"]) == (3, 1, 4)
    assert (
        eff["eagle_aux_hidden_state_layer_ids"] == [1, 5, 9]
        and eff["server"]["max_running_requests"] == 1
    )
    assert READY_LINE in remote.artifacts["server.log"]
    assert "--speculative-draft-model-path" in remote.artifacts["launch_command.txt"]
    assert marked_processes(mark) == []


def test_serve_api_overrides_hidden_states_flush_and_sigterm(tiny, tmp_path):
    port = procs.free_port()
    argv = [
        *SERVE,
        "--model-path",
        str(tiny.target),
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(tiny.draft),
        "--speculative-num-steps",
        "2",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "8",
        "--port",
        str(port),
    ]
    server = procs.start_server(argv, dict(os.environ), log_path=tmp_path / "serve.log")
    try:
        assert (
            SglangClient(f"http://127.0.0.1:{port}", 60).wait_ready(server.exited, timeout_s=120)
            == "ready"
        )
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, trust_env=False)
        info = http.get("/get_server_info").json()
        assert info["speculative_num_draft_tokens"] == 3 and info["speculative_num_steps"] == 2
        assert info["eagle_aux_hidden_state_layer_ids"] == [1, 5, 9]
        assert "topk == 1 forces num_draft_tokens" in procs.read_log(server.log_path)

        model, tok = load_target(tiny.target)
        prompt = load_prompts(tiny.prompts, tok, n=1)[0]
        body = {
            "input_ids": prompt.input_ids,
            "sampling_params": {"max_new_tokens": 6, "temperature": 0},
        }
        meta = http.post("/generate", json=body).json()["meta_info"]
        refused = http.post("/generate", json={**body, "return_hidden_states": True})
        assert refused.status_code == 400 and "--enable-return-aux-hidden-states" in refused.text
        decoder = SpeculativeDecoder(model, load_draft(tiny.draft, target=tiny.target), None, 2)
        g = decoder.generate(prompt.input_ids, max_new_tokens=6, eos_token_id=tok.eos_token_id)
        assert (meta["completion_tokens"], meta["spec_verify_ct"]) == (
            len(g.tokens),
            g.verify_steps,
        )
        assert meta["prompt_tokens"] == len(prompt.input_ids)

        state = http.get("/server_info").json()["internal_states"][0]
        assert state["avg_spec_accept_length"] == pytest.approx(len(g.tokens) / g.verify_steps)
        assert http.post("/flush_cache").status_code == 200
        assert "avg_spec_accept_length" not in http.get("/server_info").json()["internal_states"][0]
        bad = http.post("/generate", json={**body, "sampling_params": {"temperature": 0.7}})
        assert bad.status_code == 400 and "greedily" in bad.json()["error"]["message"]
        http.close()
    finally:
        report = procs.stop_server(server, grace_s=10)
    assert report.signal == "SIGTERM" and report.exit_code == 0
    log = procs.read_log(server.log_path)
    assert READY_LINE in log and "shutdown complete" in log


def test_capture_only_server_returns_the_aux_states_like_sglang_0_5_23(tiny, tmp_path):
    """No draft; the (lower-case) algorithm only names the convention; ids >= 0 captured and
    returned."""
    port = procs.free_port()
    argv = [
        *SERVE,
        "--model-path",
        str(tiny.target),
        "--speculative-algorithm",
        "eagle3",
        "--port",
        str(port),
        "--enable-return-aux-hidden-states",
        "--return-aux-hidden-state-layer-ids",
        "1",
        "5",
        "9",
    ]
    server = procs.start_server(argv, dict(os.environ), log_path=tmp_path / "serve.log")
    try:
        assert (
            SglangClient(f"http://127.0.0.1:{port}", 60).wait_ready(server.exited, timeout_s=120)
            == "ready"
        )
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60, trust_env=False)
        info = http.get("/server_info").json()
        assert info["speculative_algorithm"] is None and info[
            "eagle_aux_hidden_state_layer_ids"
        ] == [1, 5, 9]
        model, tok = load_target(tiny.target)
        prompt = load_prompts(tiny.prompts, tok, n=1)[0]
        body = {
            "input_ids": prompt.input_ids,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0},
            "return_hidden_states": True,
        }
        meta = http.post("/generate", json=body).json()["meta_info"]
        expected = SpeculativeDecoder(
            model, load_draft(tiny.draft, target=tiny.target), None, 2
        ).aux_hidden_states(prompt.input_ids)
        assert torch.allclose(torch.tensor(meta["hidden_states"]), expected, atol=1e-5)
        assert "spec_verify_ct" not in meta
        http.close()
    finally:
        assert procs.stop_server(server, grace_s=10).signal == "SIGTERM"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--tp-size", "2"], "one device"),
        (
            [
                "--speculative-algorithm",
                "EAGLE3",
                "--speculative-draft-model-path",
                "d",
                "--speculative-num-steps",
                "3",
                "--speculative-eagle-topk",
                "4",
            ],
            "only 1",
        ),
        (["--speculative-algorithm", "EAGLE3"], "needs --speculative-draft-model-path"),
        (["--speculative-num-steps", "3"], "needs --speculative-algorithm"),
        (["--enable-return-aux-hidden-states"], "needs --speculative-algorithm EAGLE3"),
        (
            [
                "--enable-return-aux-hidden-states",
                "--speculative-algorithm",
                "EAGLE3",
                "--speculative-draft-model-path",
                "d",
            ],
            "captures without a draft",
        ),
        (
            [
                "--enable-return-aux-hidden-states",
                "--speculative-algorithm",
                "EAGLE3",
                "--return-aux-hidden-state-layer-ids",
                "-1",
                "2",
            ],
            "non-negative",
        ),
        (
            ["--return-aux-hidden-state-layer-ids", "1"],
            "requires --enable-return-aux-hidden-states",
        ),
        (
            ["--speculative-algorithm", "MEDUSA", "--speculative-draft-model-path", "d"],
            "not served here",
        ),
    ],
)
def test_unsupported_launches_exit_like_argparse(args, message, capsys):
    parser = build_parser()
    with pytest.raises(SystemExit) as e:
        check_args(parser, parser.parse_args(["--model-path", "m", *args]))
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    "body,message",
    [
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": 4}}, "temperature 0"),
        ({"input_ids": [[1], [2]], "sampling_params": {"temperature": 0}}, "batches"),
        ({"text": "a", "input_ids": [1]}, "exactly one"),
        ({"input_ids": [1], "sampling_params": {"temperature": 0, "top_p": 0.9}}, "top_p"),
        ({"input_ids": [1], "stream": True}, "stream"),
    ],
)
def test_requests_it_cannot_serve_are_refused(body, message):
    with pytest.raises(Rejected, match=message):
        parse_generate(body, 1)


def test_cli_serve_passes_help_to_the_sglang_style_parser():
    from bisect_eagle.cli import serve

    app = typer.Typer()
    app.callback()(lambda: None)
    serve.register(app)
    out = CliRunner().invoke(app, ["serve", "--help"])
    assert out.exit_code == 0
    for flag in (
        "--model-path",
        "--speculative-draft-model-path",
        "--speculative-num-steps",
        "--speculative-eagle-topk",
        "--speculative-num-draft-tokens",
        "--port",
        "--host",
        "--tp-size",
        "--device",
        "--enable-return-aux-hidden-states",
    ):
        assert flag in out.output


@pytest.mark.parametrize(
    ("environ", "steps", "rates", "delay"),
    [
        ({}, 3, None, 0.0),
        (
            {
                "SGLANG_SIMULATE_ACC_LEN": "2.5",
                "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token",
            },
            3,
            [1.0, 0.5, 0.0],
            0.0,
        ),
        (
            {"SGLANG_SIMULATE_ACC_LEN": "9", "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token"},
            2,
            [1.0, 1.0],
            0.0,
        ),
        ({"SGLANG_SIMULATE_ACC_LEN": "-1"}, 3, None, 0.0),  # SGLang's "off"
        # no draft: SGLang simulates only a verify step
        ({"SGLANG_SIMULATE_ACC_LEN": "2.5"}, None, None, 0.0),
        ({"NCCL_PROTO": "LL"}, 3, None, LL_DELAY_S),
        ({"NCCL_PROTO": "Simple"}, 3, None, 0.0),
    ],
)
def test_the_environment_pins_acceptance_and_slows_forwards_as_documented(
    environ, steps, rates, delay
):
    assert simulation(environ, steps) == (rates, delay)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"SGLANG_SIMULATE_ACC_LEN": "2.5"}, "'fixed' emits token id 100"),
        (
            {
                "SGLANG_SIMULATE_ACC_LEN": "2.5",
                "SGLANG_SIMULATE_ACC_METHOD": "multinomial",
                "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token",
            },
            "'match-expected' only",
        ),
        ({"SGLANG_SIMULATE_ACC_LEN": "three"}, "expected a number"),
    ],
)
def test_simulations_the_stand_in_does_not_serve_are_refused(environ, message):
    with pytest.raises(BadInput, match=message):
        simulation(environ, 3)


def test_the_cost_side_fault_changes_no_token(tiny):
    parser = build_parser()
    args = parser.parse_args(
        [
            "--model-path",
            str(tiny.target),
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            str(tiny.draft),
            "--speculative-num-steps",
            "3",
        ]
    )
    check_args(parser, args)
    slow, fast = build_backend(args, {"NCCL_PROTO": "LL"}), build_backend(args, {})
    assert (slow.decoder.cycle_delay_s, fast.decoder.cycle_delay_s) == (LL_DELAY_S, 0.0)
    assert slow.info["bisect_eagle_cycle_delay_s"] == LL_DELAY_S
    body = parse_generate(
        {"text": "def f(x):", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}, 1
    )
    a, b = slow.generate(body), fast.generate(body)
    assert a["output_ids"] == b["output_ids"]
    assert [a["meta_info"][k] for k in ("completion_tokens", "spec_verify_ct")] == [
        b["meta_info"][k] for k in ("completion_tokens", "spec_verify_ct")
    ]


def test_a_pinned_trial_on_the_stand_in_reaches_the_pinned_accept_length(tiny, tmp_path):
    """The sglang engine's pinned plan sets SGLang's simulation variables; the stand-in honours
    them."""
    settings = parse_settings(
        {**TRIAL, "pinned_acceptance": [1.0, 1.0, 0.0], "env": {"NCCL_PROTO": "LL"}}, "test"
    )
    server = SglangServer(
        launch_command=SERVE,
        ready_timeout_s=120,
        request_timeout_s=60,
        stop_grace_s=10,
        gpu_release_timeout_s=5,
    )
    with SglangEngine(
        server, target=tiny.target, draft=tiny.draft, prompts=tiny.prompts, log_dir=tmp_path
    ) as engine:
        plan = engine.plan(settings)
        result = engine.run(plan)
    assert result.ok, result.failure_detail
    assert result.acceptance == "pinned" and result.effective["pinned_acceptance"] == [
        1.0,
        1.0,
        0.0,
    ]
    # 12 tokens a request: 3 rounds of 3, then one drafting the 2 that fit, both accepted, and its
    # bonus
    assert [(r.completion_tokens, r.verify_steps) for r in result.requests] == [(12, 4), (12, 4)]
    assert result.accept_length == 3.0 and result.accept_rate_per_position[:2] == [1.0, 1.0]
    log = result.artifacts["server.log"]
    assert (
        "acceptance pinned (SGLANG_SIMULATE_ACC_LEN)" in log
        and "NCCL_PROTO=LL: every target forward" in log
    )
    assert "SGLANG_SIMULATE_ACC_LEN=3" in result.artifacts["launch_command.txt"]
