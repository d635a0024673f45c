"""The vllm plan of a pinned trial: vLLM's synthetic rejection sampling, refused before launch on
the CPU build.

The last test needs vLLM's environment (``.vllm-venv``): vLLM's own parser and resolution accept the
synthetic speculative config, and the CPU platform it resolves is refused with the assertion its
engine would die of.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bisect_eagle.engines.vllm.planner import Planner, cpu_synthetic
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
ASSERTION = "AssertionError: Synthetic acceptance not supported with CPU sampling"


def plan(planner: Planner, tmp_path: Path, **settings):
    return planner.plan(
        LiveSettings(**settings), port=31000, draft_dir=tmp_path / "trials" / "001-trial" / "draft"
    )


def spec_config(p) -> dict:
    return json.loads(p.argv[p.argv.index("--speculative-config") + 1])


@pytest.fixture
def offline(tiny) -> Planner:
    return Planner(VllmServer(), tiny.target, tiny.draft, check=False)


def test_a_pinned_plan_asks_vllm_for_synthetic_rates(offline, tmp_path):
    natural = plan(offline, tmp_path, eagle_aux_hidden_state_layer_ids=[1, 5, 9])
    pinned = plan(
        offline,
        tmp_path,
        eagle_aux_hidden_state_layer_ids=[1, 5, 9],
        pinned_acceptance=[0.9, 0.6, 0.3],
    )
    assert pinned.refusal is None and (pinned.acceptance, natural.acceptance) == (
        "pinned",
        "natural",
    )
    spec = spec_config(pinned)
    assert spec["rejection_sample_method"] == "synthetic" and spec[
        "synthetic_acceptance_rates"
    ] == [0.9, 0.6, 0.3]
    assert "rejection_sample_method" not in spec_config(natural)
    assert (
        pinned.effective["pinned_acceptance"] == [0.9, 0.6, 0.3]
        and "pinned_acceptance" not in natural.effective
    )
    assert pinned.fingerprint != natural.fingerprint
    assert any("on its CPU build this pinned trial's engine dies" in w for w in pinned.warnings)
    assert not any("CPU build" in w for w in natural.warnings)


def test_a_pinned_plan_for_the_cpu_is_refused_before_launch(offline, tmp_path):
    p = plan(offline, tmp_path, device="cpu", pinned_acceptance=[1.0, 1.0, 0.0])
    assert (
        p.refusal is not None and ASSERTION in p.refusal and "cpu_triton_utils.py:330" in p.refusal
    )
    assert plan(offline, tmp_path, device="cpu").refusal is None  # a natural trial runs there


@pytest.mark.parametrize(("platform", "refused"), [("cpu", True), ("cuda", False), ("rocm", False)])
def test_the_platform_vllm_resolves_decides(platform, refused):
    settings = LiveSettings(pinned_acceptance=[1.0, 0.5, 0.0])
    refusal, warnings = cpu_synthetic(settings, {"device_type": platform})
    assert (refusal is not None) == refused and not warnings
    assert cpu_synthetic(LiveSettings(), {"device_type": "cpu"}) == (None, [])


def test_vllm_accepts_the_synthetic_config_and_its_cpu_build_is_refused(
    vllm_python, tiny, tmp_path
):
    planner = Planner(VllmServer(python=vllm_python, extra_args=CPU_ARGS), tiny.target, tiny.draft)
    try:
        p = plan(
            planner,
            tmp_path,
            eagle_aux_hidden_state_layer_ids=[1, 5, 9],
            dtype="float32",
            env=CPU,
            pinned_acceptance=[0.8, 0.5, 0.2],
        )
    finally:
        planner.close()
    # vLLM itself took the synthetic config
    assert p.checked == "vLLM 0.32.0 parser and engine-args resolution"
    assert p.effective["device"] == "cpu"
    assert (
        p.refusal is not None
        and not p.refusal.startswith("vLLM refuses")
        and ASSERTION in p.refusal
    )
