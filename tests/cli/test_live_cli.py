"""`bisect-eagle live` with a spec: the sglang path gives the local engine's accept length; dry runs launch nothing."""

import json
import subprocess
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
SAME = ["--set", "max_new_tokens=24", "--set", "num_prompts=3", "--set", "warmup_prompts=1", "--set", "num_steps=3"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bisect_eagle.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def _serve_processes() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "serve" in cmd and "bisect" in cmd and "pytest" not in cmd:
            out.append(p)
    return out


def test_sglang_path_matches_the_local_engine_and_leaves_no_server(tiny, tmp_path):
    before = {p.pid for p in _serve_processes()}
    served = _cli("live", "--spec", str(ROOT / "experiments" / "tiny-sglang.yaml"), *SAME, "--json", cwd=tmp_path)
    local = _cli("live", "--scenario", "tiny", *SAME, "--json", cwd=tmp_path)
    assert served.returncode == 0, served.stderr[-2000:]
    assert local.returncode == 0, local.stderr[-2000:]
    s, lo = json.loads(served.stdout), json.loads(local.stdout)
    assert s["engine"] == "sglang" and lo["engine"] == "local"
    assert s["accept_length"] == lo["accept_length"] > 1.5
    assert s["effective"]["eagle_aux_hidden_state_layer_ids"] == lo["effective"]["eagle_aux_hidden_state_layer_ids"]
    assert {"launch_command.txt", "effective.json", "server.log"} <= set(s["artifacts"])
    assert {p.pid for p in _serve_processes()} - before == set()


def test_dry_run_prints_the_real_deployment_without_launching(tmp_path):
    out = _cli("live", "--spec", str(ROOT / "experiments" / "glm5-8gpu.yaml"), "--dry-run", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    text = json.dumps(plan)
    for flag in ("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "--tp-size"):
        assert flag in text
    assert not (tmp_path / "mlruns").exists()  # nothing written


def test_dry_run_needs_an_sglang_spec(tmp_path):
    out = _cli("live", "--scenario", "tiny", "--dry-run", cwd=tmp_path)
    assert out.returncode == 2 and "give --spec FILE" in out.stderr
    out = _cli("live", "--spec", str(ROOT / "experiments" / "tiny.yaml"), "--dry-run", cwd=tmp_path)
    assert out.returncode == 2 and "'engine.kind' is 'local'" in out.stderr
