"""Builders shared by the sglang engine tests: settings, a server spec on the scripted stand-in, a
fake draft."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bisect_eagle.artifacts import scenarios
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.engines.sglang.planner import Planner
from bisect_eagle.spec.schema import SglangServer
from bisect_eagle.spec.settings import LiveSettings, parse_settings

FAKE = Path(__file__).resolve().parents[1] / "fake_servers" / "fake_sglang.py"
EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments"
QUICK = {"max_new_tokens": 8, "num_prompts": 2, "warmup_prompts": 1, "concurrency": 2}
SGLANG = ["python", "-m", "sglang.launch_server"]


def tiny_planner() -> Planner:
    """A planner of the tiny scenario's pair behind ``python -m sglang.launch_server``, without
    SGLang's oracle."""
    tiny = scenarios.get("tiny")
    return Planner(SglangServer(launch_command=SGLANG), tiny.target, tiny.draft, check=False)


def plan(planner: Planner, **settings) -> TrialPlan:
    """``planner``'s plan of ``settings`` (spec names) on port 30000 with the draft at
    /tmp/trial/draft."""
    return planner.plan(
        parse_settings(settings, "test"), port=30000, draft_dir=Path("/tmp/trial/draft")
    )


def settings(**kw) -> LiveSettings:
    return parse_settings({**QUICK, **kw}, "test")


def server(**kw) -> SglangServer:
    base = {
        "launch_command": [sys.executable, str(FAKE)],
        "ready_timeout_s": 4,
        "request_timeout_s": 2,
        "stop_grace_s": 1,
        "gpu_release_timeout_s": 2,
    }
    return SglangServer(**{**base, **kw})


def fake_draft(tmp_path: Path, ids=(1, 5, 9)) -> Path:
    """The tiny scenario draft's config.json with ``ids`` (and ``use_aux_hidden_state``), fake
    weights."""
    from bisect_eagle.artifacts import scenarios

    d = tmp_path / "draft"
    d.mkdir()
    cfg = json.loads((scenarios.get("tiny").draft / "config.json").read_text())
    cfg["eagle_config"] = {
        "eagle_aux_hidden_state_layer_ids": list(ids),
        "use_aux_hidden_state": True,
    }
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "model.safetensors").write_bytes(b"weights")
    return d
