"""`bisect-eagle live` with a spec: the sglang path gives the local engine's accept length; dry runs
launch nothing."""

import json
from pathlib import Path

from helpers import cli, marked_processes, new_mark

ROOT = Path(__file__).resolve().parents[2]
SAME = [
    "--set",
    "max_new_tokens=24",
    "--set",
    "num_prompts=3",
    "--set",
    "warmup_prompts=1",
    "--set",
    "num_steps=3",
]


def test_sglang_path_matches_the_local_engine_and_leaves_no_server(tiny, tmp_path):
    mark = new_mark()  # in the environment of this test's commands and of every server they start
    served = cli(
        "live",
        "--spec",
        str(ROOT / "experiments" / "tiny-sglang.yaml"),
        *SAME,
        "--json",
        cwd=tmp_path,
        mark=mark,
    )
    local = cli("live", "--scenario", "tiny", *SAME, "--json", cwd=tmp_path)
    assert served.returncode == 0, served.stderr[-2000:]
    assert local.returncode == 0, local.stderr[-2000:]
    s, lo = json.loads(served.stdout), json.loads(local.stdout)
    assert s["engine"] == "sglang" and lo["engine"] == "local"
    assert s["accept_length"] == lo["accept_length"] > 1.5
    assert (
        s["effective"]["eagle_aux_hidden_state_layer_ids"]
        == lo["effective"]["eagle_aux_hidden_state_layer_ids"]
    )
    assert {"launch_command.txt", "effective.json", "server.log"} <= set(s["artifacts"])
    assert marked_processes(mark) == []  # the server and all it started are gone


def test_dry_run_prints_the_real_deployment_without_launching(tmp_path):
    out = cli(
        "live",
        "--spec",
        str(ROOT / "experiments" / "glm5-8gpu.yaml"),
        "--dry-run",
        "--json",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    text = json.dumps(plan)
    for flag in (
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "--tp-size",
    ):
        assert flag in text
    assert not (tmp_path / "mlruns").exists()  # nothing written


def test_a_local_dry_run_prints_its_plan_and_writes_nothing(tmp_path):
    for args in (["--scenario", "tiny"], ["--spec", str(ROOT / "experiments" / "tiny.yaml")]):
        out = cli("live", *args, "--dry-run", "--set", "num_steps=2", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert (
            out.stdout.startswith("# engine local, fingerprint ")
            and "# effective num_steps = 2" in out.stdout
        )
    assert list(tmp_path.iterdir()) == []


def test_a_live_run_needs_the_prompts_here_but_a_dry_run_does_not(tmp_path):
    """glm5-8gpu.yaml names paths of the GPU node: a dry run plans it anywhere, a live run says what
    is missing."""
    spec = ROOT / "experiments" / "glm5-8gpu.yaml"
    out = cli("live", "--spec", str(spec), "--json", cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    line = out.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert (
        str(spec) in line
        and "'prompts'" in line
        and "/data/glm5-eagle3/bench-prompts.jsonl" in line
    )
    assert list(tmp_path.iterdir()) == []
