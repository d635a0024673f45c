"""`bisect-eagle run experiments/tiny-vllm.yaml`: a whole study served by real vLLM servers (the CPU
build), one per trial. The verdict is stated; every live trial's effective ids are vLLM's numbering;
accept length and the per-position acceptance are vLLM's own counters; greedy output with
speculation equals the baseline's; at most four servers start; no vLLM process or port is left; the
best trial exports as the launch it measured; the study's parent run names vLLM's version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from helpers import MARK_ENV, marked_processes, new_mark

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[3]
SPEC = ROOT / "experiments" / "tiny-vllm.yaml"


def test_a_study_served_by_real_vllm(tmp_path, vllm_python):
    # the servers this study starts carry it: another test's servers may run beside it
    mark = new_mark()
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, MARK_ENV: mark}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bisect_eagle.cli",
            "run",
            str(SPEC),
            "--json",
            "--vllm-python",
            vllm_python,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode in (0, 3), done.stderr[-4000:]
    out = json.loads(done.stdout)
    assert out["stop_reason"] and out["baseline"] == pytest.approx(1.0)
    client = MlflowClient(out["tracking_uri"])
    runs = client.search_runs([out["experiment_id"]], max_results=100)
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    trials = [r for r in runs if r.data.tags.get("stage") in ("baseline", "live")]
    assert 2 <= len(trials) <= 4  # every server start is one of these runs: at most four
    parent = client.get_run(out["parent_run_id"])
    assert parent.data.params.get("engine") == "vllm"

    outputs = {}
    for r in trials:
        assert r.data.tags["engine"] == "vllm" and r.data.tags["checked"].startswith("vLLM")
        plan = json.loads(
            client.download_artifacts(r.info.run_id, "trial.json", str(tmp_path))
            and (tmp_path / "trial.json").read_text()
        )["plan"]
        outputs[r.data.tags["stage"] + r.info.run_id] = json.loads(
            Path(
                client.download_artifacts(r.info.run_id, "outputs.json", str(tmp_path))
            ).read_text()
        )
        if r.data.tags["stage"] == "live":
            # SGLang [1, 5, 9] in vLLM's numbering
            assert plan["effective"]["vllm_aux_layer_ids"] == [2, 6, 10]
            assert r.data.metrics["accept_length"] > 2.5
            curve = client.get_metric_history(r.info.run_id, "accept_rate_per_position")
            assert len(curve) == plan["effective"]["num_steps"] and all(
                0 < m.value <= 1 for m in curve
            )
    baseline = next(v for k, v in outputs.items() if k.startswith("baseline"))
    for key, value in outputs.items():
        assert value == baseline, key  # greedy: speculation changes speed, never the tokens

    assert marked_processes(mark) == []

    # export of the best trial: the launch that serves what it measured, judged by vLLM itself
    # (starts no server)
    best = out["best"]["run_id"]
    exported = subprocess.run(
        [
            sys.executable,
            "-m",
            "bisect_eagle.cli",
            "export",
            best,
            "--tracking-uri",
            out["tracking_uri"],
            "--json",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert exported.returncode == 0, exported.stderr[-4000:]
    body = json.loads(exported.stdout)
    assert (
        body["fingerprint"] == client.get_run(best).data.tags["fingerprint"]
        and body["refusal"] is None
    )
    assert body["checked"].startswith("vLLM 0.32") and body["draft_config_patch"] == {
        "eagle_aux_hidden_state_layer_ids": [2, 6, 10]
    }

    # the engine's own statement of its server's version (VllmEngine.versions), beside version.torch
    # & co.
    assert parent.data.params.get("version.vllm", "").startswith("0.32"), {
        k: v for k, v in parent.data.params.items() if "version" in k
    }
