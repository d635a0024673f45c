"""A capture-only server (SGLang 0.5.23's way to return aux states), on the stand-in: what the
target captures."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from bisect_eagle.artifacts.dumps import DumpReader
from bisect_eagle.engines.sglang.launch import argv_tokens
from bisect_eagle.errors import BadInput
from bisect_eagle.inspect.capture_server import capture_args, capture_server
from bisect_eagle.inspect.layermatch import load, match_layers
from bisect_eagle.spec.load import load_spec

from helpers import own_children

ROOT = Path(__file__).resolve().parents[2]


def test_capture_only_flags_follow_sglang_rules():
    spec = load_spec(ROOT / "experiments" / "glm5-8gpu.yaml")
    argv = argv_tokens(capture_args(spec, ids=[3, 31, 59], port=1))
    assert (
        "--enable-return-aux-hidden-states" in argv and "--speculative-draft-model-path" not in argv
    )
    assert argv[argv.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert argv[argv.index("--return-aux-hidden-state-layer-ids") + 1 :][:3] == ["3", "31", "59"]
    with pytest.raises(BadInput, match=">= 0"):
        capture_args(spec, ids=[-1, 2, 30], port=1)


def test_the_server_capture_is_matched_to_the_target_layers(tiny, tmp_path):
    spec = load_spec(ROOT / "experiments" / "tiny-sglang.yaml")
    model, reader, _ = load(tiny.target, tiny.dump, draft=None)
    with capture_server(spec, ids=[1, 5, 9], log_dir=tmp_path) as url:
        result = match_layers(model, DumpReader(tiny.dump), samples=1, server_url=url)
        pid = next(p for p in own_children() if "serve" in " ".join(p.cmdline())).pid
    assert [m.index for m in result.matches if m.source == "server"] == [2, 6, 10]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
