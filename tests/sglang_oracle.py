"""Where the tests find SGLang's own interpreter: ``$BISECT_EAGLE_SGLANG_PYTHON``, else
``.sglang-venv`` (made by ``scripts/setup_sglang_env.sh``; CI always makes it). Tests that need it
skip without it."""

from __future__ import annotations

import os
import subprocess
from functools import cache
from pathlib import Path

from helpers import engine_python

ROOT = Path(__file__).resolve().parents[1]


@cache
def _found() -> str | None:
    candidates = [
        os.environ.get("BISECT_EAGLE_SGLANG_PYTHON"),
        str(ROOT / ".sglang-venv" / "bin" / "python"),
    ]
    for python in filter(None, candidates):
        if Path(python).is_file():
            ok = subprocess.run(
                [python, "-c", "import sglang.srt.server_args"], capture_output=True, timeout=300
            )
            if ok.returncode == 0:
                return python
    return None


def sglang_python() -> str:
    """SGLang's interpreter, or skip the calling test (CI sets BISECT_EAGLE_REQUIRE_SGLANG=1: then
    fail)."""
    return engine_python(
        _found(),
        engine="SGLang",
        require="BISECT_EAGLE_REQUIRE_SGLANG",
        setup="scripts/setup_sglang_env.sh",
    )
