"""The vllm engine's trial path against a stand-in server (``fake_vllm.py``, replaying vLLM's real
messages) and, marked ``system``, against a real vLLM 0.32 server on the tiny pair."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path

import psutil
import pytest

from bisect_eagle.engines.procs.supervise import port_is_free
from bisect_eagle.engines.vllm import VllmEngine
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import VllmServer
from bisect_eagle.spec.settings import LiveSettings

FAKE = Path(__file__).resolve().parent / "fake_vllm.py"
CPU = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
}
CPU_ARGS = {
    "enforce_eager": True,
    "max_model_len": 512,
    "max_num_seqs": 1,
    "seed": 0,
    "distributed_executor_backend": "uni",
}


def fake_engine(tiny, tmp_path: Path, **server) -> VllmEngine:
    spec = VllmServer(
        launch_command=[sys.executable, str(FAKE)],
        ready_timeout_s=server.pop("ready_timeout_s", 60),
        request_timeout_s=30,
        stop_grace_s=5,
        gpu_release_timeout_s=5,
        metrics_timeout_s=10,
        **server,
    )
    return VllmEngine(
        spec,
        target=tiny.target,
        draft=tiny.draft,
        prompts=tiny.prompts,
        log_dir=tmp_path / "logs",
        check=False,
    )


def assert_nothing_left(res, log_dir: Path) -> None:
    """Every process of the trial's server is gone, its port is free and its server record
    removed."""
    teardown = json.loads(res.artifacts["teardown.json"])
    assert teardown["pids"] and teardown["survivors"] == []
    alive = [
        pid
        for pid in teardown["pids"]
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    ]
    assert alive == []
    launched = next(log_dir.glob("[0-9][0-9][0-9]-*")) / "launch_command.txt"
    port = int(launched.read_text().split("--port ", 1)[1].split()[0])
    assert port_is_free("127.0.0.1", port)
    assert list((log_dir / "servers").glob("*.json")) == []


def settings(**extra) -> LiveSettings:
    return LiveSettings(**{"max_new_tokens": 8, "num_prompts": 3, "warmup_prompts": 1, **extra})


def test_a_trial_measures_vllms_counters_over_the_measured_requests(tiny, tmp_path):
    with fake_engine(tiny, tmp_path) as eng:
        plan = eng.plan(settings(eagle_aux_hidden_state_layer_ids=[1, 5, 9]))
        assert plan.refusal is None and plan.config_patch == {
            "eagle_aux_hidden_state_layer_ids": [2, 6, 10]
        }
        res = eng.run(plan)
    assert res.ok, res.failure_detail
    # the warm-up request's 16 steps are not counted
    assert res.accept_length == pytest.approx(1 + 42 / 16)
    assert res.accept_rate_per_position == pytest.approx([15 / 16, 14 / 15, 13 / 14])
    # per request: 16 - 15, 15 - 14, 14 - 13, 13
    assert res.accept_length_hist == {1: 3, 2: 3, 3: 3, 4: 39}
    assert [(r.completion_tokens, r.verify_steps) for r in res.requests] == [(8, 16)] * 3
    assert res.output_tok_s > 0 and res.wall_s == pytest.approx(
        sum(r.latency_s for r in res.requests)
    )
    assert res.effective["vllm_aux_layer_ids"] == [2, 6, 10]  # read back from the server's log line
    assert (
        res.effective["server"]["version"] == "0.32.0"
        and res.effective["server"]["max_model_len"] == 512
    )
    assert not any("captures aux layers" in w for w in res.warnings)
    trial = next((tmp_path / "logs").glob("001-*"))
    draft_cfg = json.loads((trial / "draft" / "config.json").read_text())
    assert draft_cfg["eagle_aux_hidden_state_layer_ids"] == [2, 6, 10]
    assert "VLLM_HOST_IP=127.0.0.1" in (trial / "launch_command.txt").read_text()
    assert json.loads(res.artifacts["metrics_delta.json"])["drafts"] == 48
    assert_nothing_left(res, tmp_path / "logs")


def launched_argv(log_dir: Path) -> list[str]:
    """The argv a trial started, as its launch_command.txt records it (the shell-quoted command
    line)."""
    text = (next(log_dir.glob("[0-9][0-9][0-9]-*")) / "launch_command.txt").read_text()
    return shlex.split(
        next(line for line in text.splitlines() if line.startswith(shlex.quote(sys.executable)))
    )


def test_a_trial_launches_its_plans_argv_with_only_the_port_and_the_draft_copy_filled_in(
    tiny, tmp_path
):
    """The launch is bound to the plan: every flag vLLM judged is the one started, but the trial's
    free port and its own draft copy (the plan shows the planned ones)."""
    with fake_engine(tiny, tmp_path) as eng:
        plan = eng.plan(
            settings(eagle_aux_hidden_state_layer_ids=[1, 5, 9], server_args={"max_num_seqs": 1})
        )
        res = eng.run(plan)
    assert res.ok, res.failure_detail
    argv, planned = launched_argv(tmp_path / "logs"), list(plan.argv)
    assert len(argv) == len(planned)
    differs = [i for i, (a, b) in enumerate(zip(argv, planned, strict=True)) if a != b]
    port, spec = planned.index("--port") + 1, planned.index("--speculative-config") + 1
    assert set(differs) <= {port, spec} and argv[port].isdigit()
    launched, shown = json.loads(argv[spec]), json.loads(planned[spec])
    # the method, the steps: as planned
    assert {**launched, "model": None} == {**shown, "model": None}
    assert (
        Path(launched["model"]).name == "draft"
        and Path(launched["model"]).parent.parent == tmp_path / "logs"
    )


def test_a_plan_changed_after_planning_is_never_launched(tiny, tmp_path):
    """A plan whose identity is not its launch's (edited after planning, or not the planner's) is a
    bug: the engine refuses it before anything starts."""
    with fake_engine(tiny, tmp_path) as eng:
        plan = eng.plan(settings())
        with pytest.raises(
            RuntimeError, match="a launch is made only from the vllm planner's own plan"
        ):
            eng.run(dataclasses.replace(plan, fingerprint="0" * 16))
        with pytest.raises(RuntimeError, match="carries no launch"):
            eng.run(dataclasses.replace(plan, private={}))
    assert not list((tmp_path / "logs").glob("[0-9][0-9][0-9]-*/launch_command.txt"))


def test_the_baseline(tiny, tmp_path):
    with fake_engine(tiny, tmp_path) as eng:
        res = eng.run(eng.plan(settings(speculative_algorithm="none")))
    assert res.ok and res.accept_length == 1.0 and res.accept_rate_per_position == []
    assert [r.verify_steps for r in res.requests] == [8, 8, 8]


@pytest.mark.parametrize(
    "mode,cls,text",
    [
        ("bad_args", "bad_arguments", "api_server.py: error: argument --speculative-config"),
        ("oom", "out_of_memory", "less than requested memory for kv"),
        ("dead", "capture_error", "engine dead at the first request"),
    ],
)
def test_vllms_failures_become_failed_trials(tiny, tmp_path, monkeypatch, mode, cls, text):
    monkeypatch.setenv("FAKE_VLLM_MODE", mode)
    with fake_engine(tiny, tmp_path) as eng:
        res = eng.run(eng.plan(settings()))
    assert res.status == "failed" and res.failure_class == cls, res.failure_detail
    assert text in res.failure_detail and "server.log" in res.artifacts
    assert_nothing_left(res, tmp_path / "logs")


def test_readiness_timeout(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "slow")
    with fake_engine(tiny, tmp_path, ready_timeout_s=2) as eng:
        start = time.monotonic()
        res = eng.run(eng.plan(settings()))
    assert res.failure_class == "readiness_timeout" and time.monotonic() - start < 30
    assert_nothing_left(res, tmp_path / "logs")


def test_a_refused_plan_is_never_launched(tiny, tmp_path, make_draft):
    eng = VllmEngine(
        VllmServer(launch_command=[sys.executable, str(FAKE)]),
        target=tiny.target,
        draft=make_draft("m1", nested=[-1, 1, 5]),
        prompts=tiny.prompts,
        log_dir=tmp_path / "logs",
        check=False,
    )
    plan = eng.plan(settings())
    assert "outside [0, 12]" in plan.refusal and "dies at the first request" in plan.refusal
    with pytest.raises(BadInput):
        eng.run(plan)
    assert not (tmp_path / "logs").exists()


# -- a real vLLM server
# ------------------------------------------------------------------------------------


@pytest.mark.system
def test_real_vllm_trial_on_the_tiny_pair(tiny, tmp_path, vllm_python):
    """One trial of the tiny pair on vLLM 0.32 (CPU build): vLLM ids [2, 6, 10] (SGLang [1, 5, 9]),
    3 speculative tokens, 8 measured prompts × 64 tokens after 2 warm-ups; the reference measurement
    is 3.62."""
    server = VllmServer(
        python=vllm_python,
        ready_timeout_s=1200,
        request_timeout_s=600,
        stop_grace_s=30,
        gpu_release_timeout_s=10,
    )
    log_dir = tmp_path / "logs"
    with VllmEngine(
        server, target=tiny.target, draft=tiny.draft, prompts=tiny.prompts, log_dir=log_dir
    ) as eng:
        plan = eng.plan(
            LiveSettings(
                eagle_aux_hidden_state_layer_ids=[1, 5, 9],
                num_steps=3,
                dtype="float32",
                env=CPU,
                server_args=CPU_ARGS,
            )
        )
        assert (
            plan.refusal is None and plan.checked == "vLLM 0.32.0 parser and engine-args resolution"
        )
        res = eng.run(plan)
    assert res.ok, res.failure_detail
    assert abs(res.accept_length - 3.62) <= 0.1, res.accept_length
    assert len(res.requests) == 8 and all(r.completion_tokens == 64 for r in res.requests)
    assert (
        res.effective["vllm_aux_layer_ids"] == [2, 6, 10] and len(res.accept_rate_per_position) == 3
    )
    assert_nothing_left(res, log_dir)


@pytest.mark.parametrize(("env", "rounds"), [({}, 1), ({"VLLM_SERVER_DEV_MODE": "1"}, 3)])
def test_rounds_on_one_launch_need_the_prefix_cache_reset(tiny, tmp_path, env, rounds):
    """vLLM serves ``POST /reset_prefix_cache`` only in its dev mode: without it a launch measures
    one round (a second would read the first one's cached prompts) and says so; with it, three
    rounds, the counters of each."""
    with fake_engine(tiny, tmp_path) as eng:
        res = eng.run_rounds(
            eng.plan(settings(eagle_aux_hidden_state_layer_ids=[1, 5, 9], env=env)), rounds=3
        )
    assert res.ok, res.failure_detail
    assert res.rounds == rounds and len(res.requests) == 3 * rounds
    # each round's own counters: the same per round
    assert res.accept_length == pytest.approx(1 + 42 / 16)
    assert res.artifacts["server.log"].count("Resetting prefix cache") == rounds - 1
    assert any("one benchmark round on this launch" in w for w in res.warnings) == (rounds == 1)
    assert len(list((tmp_path / "logs").glob("[0-9][0-9][0-9]-*"))) == 1
    assert_nothing_left(res, tmp_path / "logs")
