"""The sglang engine's trials against ``fake_servers/fake_sglang.py``: measurement, read-back,
faults, teardown.

The scripted server has serve's flags and HTTP front, canned answers and a child process like
SGLang's scheduler; its fault is picked per trial through ``settings.env``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import sys

import psutil
import pytest
from sglang_helpers import server, settings

from bisect_eagle.engines.procs import server as procs
from bisect_eagle.engines.served import Leftover
from bisect_eagle.engines.sglang import SglangEngine
from bisect_eagle.errors import BadInput

from helpers import own_children


def run(engine: SglangEngine, s):
    return engine.run(engine.plan(s))


# --------------------------------------------------------------------------------------------------
# live trials against the scripted server


def _gone(result) -> None:
    """No process of the trial's server is left and its port is free."""
    teardown = json.loads(result.artifacts["teardown.json"])
    for pid in teardown["pids"]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not [p for p in own_children() if "fake_sglang" in " ".join(p.cmdline())]
    port = int(result.artifacts["launch_command.txt"].split("--port ")[1].split()[0])
    assert procs.port_is_free("127.0.0.1", port)
    assert {"launch_command.txt", "effective.json", "server.log"} <= set(result.artifacts)


@pytest.fixture(scope="module")
def engine(tiny, tmp_path_factory):
    logs = tmp_path_factory.mktemp("sglang-logs")
    with SglangEngine(
        server(), target=tiny.target, draft=tiny.draft, prompts=tiny.prompts, log_dir=logs
    ) as e:
        yield e


def test_healthy_trial_measures_reads_back_and_records(engine):
    s = settings(
        num_steps=3,
        topk=1,
        num_draft_tokens=8,
        eagle_aux_hidden_state_layer_ids=[5, 9, 10],
        env={"NCCL_ALGO": "Tree", "HF_TOKEN": "hf_secret"},
        server_args={"cuda_graph_max_bs": 4, "disable_custom_all_reduce": True},
    )
    r = run(engine, s)
    assert r.ok, r.failure_detail
    assert r.accept_length == 2.0 and r.server_accept_length == 2.0  # 8 tokens in 4 verify steps
    assert r.accept_length_hist == {2: 8}
    assert r.accept_rate_per_position[:2] == [1.0, 0.0] and math.isnan(
        r.accept_rate_per_position[2]
    )
    assert [q.completion_tokens for q in r.requests] == [8, 8] and r.output_tok_s > 0
    assert r.effective["server"]["max_running_requests"] == 8
    assert r.effective["eagle_aux_hidden_state_layer_ids"] == [5, 9, 10]
    assert r.effective["server_args"] == {"cuda_graph_max_bs": 4, "disable_custom_all_reduce": True}
    text = r.artifacts["launch_command.txt"]
    assert (
        "--cuda-graph-max-bs-decode 4" in text
        and "NCCL_ALGO=Tree" in text
        and "hf_secret" not in text
    )
    # only what SERVER_KEYS records
    assert "api_key" not in json.loads(r.artifacts["server_info.json"])
    assert any("renamed" in w for w in r.warnings) and any(
        "topk == 1 forces" in w for w in r.warnings
    )
    draft_cfg = json.loads(
        (
            engine.log_dir
            / next(p.name for p in engine.log_dir.iterdir())
            / "draft"
            / "config.json"
        ).read_text()
    )
    assert draft_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [5, 9, 10]
    assert json.loads(r.artifacts["teardown.json"])["signal"] == "SIGTERM"
    _gone(r)


def test_a_trial_runs_as_planned_and_is_never_planned_again(engine, monkeypatch):
    plan = engine.plan(settings(num_steps=2, eagle_aux_hidden_state_layer_ids=[2, 6, 10]))

    def plan_again(*args, **kwargs):
        raise AssertionError("run planned the trial a second time")

    monkeypatch.setattr(engine.planner, "plan", plan_again)
    r = engine.run(plan)
    assert r.ok, r.failure_detail
    trial_dir = engine.log_dir / next(
        p.name for p in sorted(engine.log_dir.iterdir()) if p.name.endswith(plan.fingerprint)
    )
    draft_cfg = json.loads((trial_dir / "draft" / "config.json").read_text())
    assert (
        draft_cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        == plan.config_patch["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        == [2, 6, 10]
    )
    assert (
        f"--speculative-draft-model-path {trial_dir / 'draft'}" in r.artifacts["launch_command.txt"]
    )
    _gone(r)


def test_a_plan_changed_after_planning_is_a_bug_not_a_trial(engine):
    before = set(engine.log_dir.iterdir())
    with pytest.raises(RuntimeError, match="a bug"):
        engine.run(dataclasses.replace(engine.plan(settings()), fingerprint="0" * 16))
    assert set(engine.log_dir.iterdir()) == before


@pytest.mark.parametrize(
    "fault,extra,cls",
    [
        ("", {"server_args": {"mem_fraction_static": "lots"}}, "bad_arguments"),
        ("oom", {}, "out_of_memory"),
        ("capture", {}, "capture_error"),
        ("never_ready", {}, "readiness_timeout"),
        ("dies", {}, "crash_during_benchmark"),
        ("hangs", {}, "hung_request"),
    ],
)
def test_each_fault_is_one_failed_trial_and_the_study_goes_on(engine, fault, extra, cls):
    env = {"FAKE_SGLANG_FAULT": fault} if fault else {}
    r = run(engine, settings(env=env, **extra))
    assert r.status == "failed" and r.failure_class == cls, r.failure_detail
    assert "server log tail" in r.failure_detail and r.artifacts["server.log"]
    _gone(r)
    after = run(engine, settings())
    assert after.ok and after.accept_length == 2.0
    _gone(after)


def test_a_server_ignoring_sigterm_is_killed_with_its_group(engine):
    r = run(engine, settings(env={"FAKE_SGLANG_FAULT": "ignores_sigterm"}))
    assert r.ok
    teardown = json.loads(r.artifacts["teardown.json"])
    assert (
        teardown["signal"] == "SIGKILL" and len(teardown["pids"]) == 2 and not teardown["survivors"]
    )
    assert any("SIGKILL" in w for w in r.warnings)
    _gone(r)


def test_unknown_flag_is_refused_before_anything_starts(engine):
    before = set(engine.log_dir.iterdir())
    plan = engine.plan(settings(server_args={"no_such_flag": 3}))
    assert "--no-such-flag" in plan.refusal and "fake_sglang.py" in plan.refusal
    with pytest.raises(BadInput):
        engine.run(plan)
    assert set(engine.log_dir.iterdir()) == before and not own_children()


def test_a_server_that_will_not_go_away_blocks_the_next_launch(engine):
    old = procs.start_server(
        [sys.executable, "-c", "pass"], {}, log_path=engine.log_dir / "old.log"
    )
    procs.stop_server(old, grace_s=1)
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    engine._leftover = Leftover(old, "127.0.0.1", port, f"port {port} still taken")
    try:
        r = run(engine, settings())
        assert r.failure_class == "launch_error" and "refusing to start another" in r.failure_detail
    finally:
        holder.close()
    assert run(engine, settings()).ok and engine._leftover is None


def test_gpu_release_inside_a_container_waits_on_device_memory(engine, tmp_path, monkeypatch):
    """NVML lists host pids, unknown here: the trial's GPU is compared with its use before the
    launch."""
    host = 4_000_000
    while psutil.pid_exists(host):
        host -= 1
    (tmp_path / "apps").write_text(f"{host}, 39000\n")
    (tmp_path / "used").write_text("40000")
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    # GPU 1 at 500 MiB on the first look (before the launch), then whatever the test sets
    smi.write_text(
        "#!/bin/sh\n"
        f'[ "${{1%%=*}}" = --query-compute-apps ] && exec /bin/cat {tmp_path}/apps\n'
        f"n=$(( $(/bin/cat {tmp_path}/calls 2>/dev/null || echo 0) + 1 )); echo $n > "
        f"{tmp_path}/calls\n"
        f"[ $n -eq 1 ] && used=500 || used=$(/bin/cat {tmp_path}/used)\n"
        'echo "0, GPU-a, 70000, 81559"; echo "1, GPU-b, $used, 81559"\n'
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    gpu1 = settings(env={"CUDA_VISIBLE_DEVICES": "1"})  # GPU 0 is someone else's and stays full

    kept = run(engine, gpu1)
    teardown = json.loads(kept.artifacts["teardown.json"])
    assert (
        kept.ok
        and teardown["gpu_release"] == "held"
        and teardown["gpu_release_method"] == "device memory"
    )
    assert any(
        "teardown incomplete: GPU memory above its pre-launch use: GPU 1 at 40000 MiB (was 500" in w
        and str(host) in w
        for w in kept.warnings
    ), kept.warnings
    blocked = run(engine, gpu1)
    assert blocked.failure_class == "launch_error" and "GPU memory held" in blocked.failure_detail

    (tmp_path / "used").write_text("600")
    after = run(engine, gpu1)
    teardown = json.loads(after.artifacts["teardown.json"])
    assert (
        after.ok and engine._leftover is None and not any("teardown" in w for w in after.warnings)
    )
    assert (
        teardown["gpu_release"] == "released" and teardown["gpu_release_method"] == "device memory"
    )


def test_rounds_share_one_launch_and_flush_the_cache_between_them(engine):
    """Three benchmark rounds on one server: one trial directory, the measured requests three times,
    the server's cache flushed before each round (its accept-length counters reset), the launch's
    own seconds apart."""

    def trials() -> set:
        return {p for p in engine.log_dir.glob("[0-9][0-9][0-9]-*")}

    before = trials()
    plan = engine.plan(settings(num_steps=3, eagle_aux_hidden_state_layer_ids=[3, 7, 10]))
    r = engine.run_rounds(plan, rounds=3)
    assert r.ok, r.failure_detail
    assert len(trials() - before) == 1  # one launch
    # after the warm-up, before rounds 2 and 3
    assert r.artifacts["server.log"].count("cache flushed") == 3
    assert r.rounds == 3 and len(r.round_values["output_tok_s"]) == 3
    assert r.round_values["accept_length"] == [2.0, 2.0, 2.0] and r.accept_length == 2.0
    assert [q.id for q in r.requests][2:4] == [f"{r.requests[0].id}@r1", f"{r.requests[1].id}@r1"]
    assert len(r.requests) == 3 * 2 and r.server_accept_length == 2.0
    logs = [math.log(v) for v in r.round_values["output_tok_s"]]
    assert r.output_tok_s == pytest.approx(math.exp(sum(logs) / 3))  # the rounds' geometric mean
    assert r.metrics()["rounds"] == 3 and "output_tok_s_round_sd_log" in r.metrics()
    assert (
        r.launch_s is not None
        and r.launch_s > 0
        and r.wall_s == pytest.approx(sum(q.latency_s for q in r.requests), rel=0.5)
    )
    _gone(r)
