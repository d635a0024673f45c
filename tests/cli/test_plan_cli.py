"""`live --dry-run --json`: one plan per trial, the engine's own identity, nothing written, no
secret shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bisect_eagle.tracking.redact import is_hidden

from helpers import cli_in_process

ROOT = Path(__file__).resolve().parents[2]
TINY_SGLANG = str(ROOT / "experiments" / "tiny-sglang.yaml")


def plan(*args: str, cwd: Path) -> dict:
    """The plan ``bisect-eagle live --dry-run --json ARGS`` prints (run in this process, so that the
    worker's oracle answers every sglang plan)."""
    out = cli_in_process("live", "--dry-run", "--json", *args, cwd=cwd)
    assert out.returncode == 0, out.stderr
    assert list(cwd.iterdir()) == []  # a dry run writes nothing anywhere
    return json.loads(out.stdout)["plan"]


@pytest.fixture(scope="module")
def local_base(tmp_path_factory) -> dict:
    """The tiny scenario's default local plan (planned once for the module)."""
    return plan("--scenario", "tiny", cwd=tmp_path_factory.mktemp("base"))


def test_local_plan_resolves_the_drafts_ids_and_a_real_change_is_another_trial(
    local_base, tmp_path
):
    assert local_base["engine"] == "local" and {"fingerprint", "effective", "warnings"} <= set(
        local_base
    )
    # the draft's own ids, resolved
    assert local_base["effective"]["eagle_aux_hidden_state_layer_ids"] == [1, 5, 9]
    assert (
        plan("--scenario", "tiny", "--set", "num_steps=4", cwd=tmp_path)["fingerprint"]
        != local_base["fingerprint"]
    )


@pytest.mark.parametrize(
    "same",
    [
        ["--set", "env.NCCL_ALGO=Ring"],
        ["--set", "server_args.attention_backend=triton"],
        ["--set", "eagle_aux_hidden_state_layer_ids=[1,5,9]"],
        ["--set", "concurrency=4"],
    ],
)
def test_local_plan_ignores_what_the_local_engine_ignores(local_base, tmp_path, same):
    assert (
        plan("--scenario", "tiny", *same, cwd=tmp_path)["fingerprint"] == local_base["fingerprint"]
    )


def test_sglang_plan_hashes_secret_looking_values_and_never_prints_them(tmp_path):
    one = plan("--spec", TINY_SGLANG, "--set", "env.NCCL_IB_PKEY=1", cwd=tmp_path)
    two = plan("--spec", TINY_SGLANG, "--set", "env.NCCL_IB_PKEY=2", cwd=tmp_path)
    assert one["fingerprint"] != two["fingerprint"] and one["engine"] == "sglang" and one["argv"]
    out = cli_in_process(
        "live",
        "--dry-run",
        "--json",
        "--spec",
        TINY_SGLANG,
        "--set",
        "env.MY_TOKEN=x7q",
        cwd=tmp_path,
    )
    assert out.returncode == 0 and "x7q" not in out.stdout + out.stderr
    assert is_hidden(json.loads(out.stdout)["plan"]["env"]["MY_TOKEN"])
    assert list(tmp_path.iterdir()) == []


def test_sglang_plan_knows_what_sglang_sets_itself(tmp_path):
    unset = plan("--spec", TINY_SGLANG, cwd=tmp_path)
    assert (
        plan("--spec", TINY_SGLANG, "--set", "env.NCCL_NVLS_ENABLE=0", cwd=tmp_path)["fingerprint"]
        == unset["fingerprint"]
    )
    assert (
        plan("--spec", TINY_SGLANG, "--set", "env.NCCL_NVLS_ENABLE=1", cwd=tmp_path)["fingerprint"]
        != unset["fingerprint"]
    )
    spec_v2 = plan("--spec", TINY_SGLANG, "--set", "env.SGLANG_ENABLE_SPEC_V2=1", cwd=tmp_path)
    assert spec_v2["fingerprint"] == unset["fingerprint"] and "read nowhere" in " ".join(
        spec_v2["warnings"]
    )
    assert unset["checked"].startswith("`bisect-eagle serve` parser")


def test_a_refused_plan_exits_2_with_the_reason_and_writes_nothing(tmp_path):
    out = cli_in_process(
        "live",
        "--dry-run",
        "--json",
        "--spec",
        TINY_SGLANG,
        "--set",
        "topk=2",
        "--set",
        "num_steps=1",
        "--set",
        "num_draft_tokens=8",
        cwd=tmp_path,
    )
    assert (
        out.returncode == 2
        and "organize_draft_results" in out.stderr
        and "Traceback" not in out.stderr
    )
    assert list(tmp_path.iterdir()) == []
