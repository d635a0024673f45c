"""The suite's own rules (``tests/conftest.py``): a subprocess a test waits on past its timeout
fails saying the machine was too slow, not with a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parent / "conftest.py"


def test_a_subprocess_timeout_says_the_machine_was_too_slow(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(CONFTEST.parent))  # its ``helpers``
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(
        test_slow=f"""
import subprocess


def test_waits():
    subprocess.run([{sys.executable!r}, "-c", "import time; time.sleep(30)"], timeout=0.2)
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "0")
    result.assert_outcomes(failed=1)
    said = result.stdout.str()
    assert "did not finish within 0.2 s: the machine was too slow (load " in said
    assert "Traceback" not in said and "subprocess.py" not in said


def test_the_line_names_a_cli_command_as_bisect_eagle(tmp_path):
    from helpers import too_slow_line

    e = subprocess.TimeoutExpired([sys.executable, "-m", "bisect_eagle.cli", "run", "--json"], 5)
    assert too_slow_line(e).startswith("`bisect-eagle run --json` did not finish within 5 s")
