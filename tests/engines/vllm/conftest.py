"""Fixtures of the vllm engine tests: vLLM's real output (``fixtures/``), vLLM's own environment,
draft copies.

Tests that ask vLLM itself need vLLM 0.32 in an environment of its own (``bash
scripts/setup_vllm_env.sh`` makes ``.vllm-venv``; ``BISECT_EAGLE_VLLM_PYTHON`` names another
interpreter). Without one they skip, unless ``BISECT_EAGLE_REQUIRE_VLLM=1`` (then they fail).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from helpers import engine_python

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return FIXTURES


def vllm_python_path() -> Path | None:
    """The interpreter that has vLLM (``BISECT_EAGLE_VLLM_PYTHON``, else ``.vllm-venv/bin/python``),
    if any."""
    named = os.environ.get("BISECT_EAGLE_VLLM_PYTHON")
    path = Path(named) if named else REPO / ".vllm-venv" / "bin" / "python"
    return path if path.is_file() else None


@pytest.fixture(scope="session")
def vllm_python() -> str:
    path = vllm_python_path()
    return engine_python(
        None if path is None else str(path),
        engine="vLLM",
        require="BISECT_EAGLE_REQUIRE_VLLM",
        setup="scripts/setup_vllm_env.sh",
    )


def draft_copy(
    draft: Path, out: Path, *, top_level: list[int] | None = None, nested: list[int] | None = None
) -> Path:
    """A copy of the shipped draft (weights symlinked) with its ids changed; the shipped files stay
    untouched."""
    out.mkdir(parents=True)
    for entry in draft.iterdir():
        if entry.name != "config.json":
            (out / entry.name).symlink_to(entry.resolve())
    cfg = json.loads((draft / "config.json").read_text())
    if top_level is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = top_level
    if nested is not None:
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = nested
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


@pytest.fixture
def make_draft(tiny, tmp_path):
    """``make_draft(name, top_level=..., nested=...)``: a modified copy of the tiny draft under
    ``tmp_path``."""

    def make(name: str, **ids: list[int] | None) -> Path:
        return draft_copy(tiny.draft, tmp_path / name, **ids)

    return make


@pytest.fixture
def target_copy(tiny, tmp_path) -> Path:
    out = tmp_path / "target"
    shutil.copytree(tiny.target, out)
    return out
