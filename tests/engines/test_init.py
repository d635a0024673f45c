"""The engine registry: each spec kind is one registered :class:`EngineKind`, whose capability
(how its loader reads a draft's layer ids) is read without importing the engine."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bisect_eagle.artifacts.layers import SGLANG_READER, VLLM_READER
from bisect_eagle.engines import ENGINE_KINDS, benchmark_of, engine_class, engine_kind
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import EngineSpec


def test_every_kind_the_schema_allows_is_registered_with_its_class():
    allowed = set(EngineSpec.model_fields["kind"].annotation.__args__)
    assert set(ENGINE_KINDS) == allowed
    for name in ("sglang", "vllm"):
        assert engine_class(name).name == name


def test_an_unknown_kind_is_one_line_naming_the_key():
    with pytest.raises(BadInput, match=r"^engine.kind 'trt': expected local, sglang or vllm$"):
        engine_kind("trt")
    # an unknown name: a server in steady state
    assert benchmark_of("a-test-engine") == benchmark_of("sglang")


def test_what_a_kind_reads_from_the_draft_is_known_without_importing_its_engine():
    code = (
        "import sys; from bisect_eagle.engines import engine_kind; r = "
        "engine_kind('local').id_reader; print(r.name, r.top_level, 'bisect_eagle.engines.local' "
        "in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["local", "speculators", "False", "False"]
    assert (
        engine_kind("sglang").id_reader == SGLANG_READER
        and engine_kind("vllm").id_reader == VLLM_READER
    )
