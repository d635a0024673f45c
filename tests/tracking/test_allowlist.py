"""The shipped table of the engines' names equals what the installed engines hold: SGLang's
variables and flags in ``.sglang-venv``, vLLM's in ``.vllm-venv`` (each skips without its
environment, and fails without it where CI requires it: ``BISECT_EAGLE_REQUIRE_SGLANG`` /
``BISECT_EAGLE_REQUIRE_VLLM``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from sglang_oracle import sglang_python

from bisect_eagle.tracking.allowlist import (
    NCCL_VARIABLES,
    harmless_env,
    sglang_env_names,
    table,
    vllm_env_names,
    vllm_flags,
)

from helpers import engine_python

ROOT = Path(__file__).resolve().parents[2]
SGLANG_FLAGS = """
import argparse, json
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
flags = (o for a in parser._actions for o in a.option_strings if o.startswith("--"))
print(json.dumps(sorted(flags)))
"""


def _package_dir(python: str, package: str) -> Path:
    """Where ``python`` finds ``package``, without importing it."""
    code = (
        "import importlib.util; "
        f"print(importlib.util.find_spec({package!r}).submodule_search_locations[0])"
    )
    return Path(
        subprocess.run(
            [python, "-c", code], capture_output=True, text=True, check=True, timeout=120
        ).stdout.strip()
    )


def test_the_nccl_list_holds_only_nccl_names():
    assert all(name.startswith("NCCL_") for name in NCCL_VARIABLES)
    assert "NCCL_PASSPHRASE" not in NCCL_VARIABLES and {"NCCL_ALGO", "NCCL_PROTO"} <= harmless_env()


def test_sglang_table_equals_the_installed_sglang():
    python = sglang_python()
    source = (_package_dir(python, "sglang") / "srt" / "environ.py").read_text()
    assert sorted(sglang_env_names(source)) == table()["sglang"]["env"]
    flags = subprocess.run(
        [python, "-c", SGLANG_FLAGS], capture_output=True, text=True, check=True, timeout=300
    )
    assert json.loads(flags.stdout) == table()["sglang"]["flags"]


def test_vllm_table_equals_the_installed_vllm():
    path = Path(
        os.environ.get("BISECT_EAGLE_VLLM_PYTHON") or ROOT / ".vllm-venv" / "bin" / "python"
    )
    python = engine_python(
        str(path) if path.is_file() else None,
        engine="vLLM",
        require="BISECT_EAGLE_REQUIRE_VLLM",
        setup="scripts/setup_vllm_env.sh",
    )
    vllm = _package_dir(python, "vllm")
    assert sorted(vllm_env_names((vllm / "envs.py").read_text())) == table()["vllm"]["env"]
    sources = [
        (vllm / "engine" / "arg_utils.py").read_text(),
        (vllm / "entrypoints" / "launchers" / "cli_args.py").read_text(),
    ]
    assert sorted(vllm_flags(sources)) == table()["vllm"]["flags"]
