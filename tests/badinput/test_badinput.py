"""Every bad input -- a spec, a prompts file, a data file named by a spec, a flag of any command --
ends with exit 2 and one ``error:`` line naming the culprit file (or flag) and the key: no
traceback, nothing written (no ``mlruns/``, no study, no run), the inputs left as they were. With
tests/bad_data_cases.py: over 100 cases."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from bad_data_cases import CASES as DATA_CASES
from badinput.cases import CASES, ROOT

from helpers import file_tree, run_cli


@pytest.fixture
def cwd(tmp_path, monkeypatch) -> Path:
    """An empty working directory that must stay empty (the default stores live under it)."""
    path = tmp_path / "cwd"
    path.mkdir()
    monkeypatch.chdir(path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return path


def test_the_corpus_holds_over_a_hundred_cases():
    names = [n for n, _ in CASES] + [n for n, _ in DATA_CASES]
    assert len(CASES) >= 40 and len(names) >= 100 and len(set(names)) == len(names)


@pytest.mark.parametrize("build", [b for _, b in CASES], ids=[n for n, _ in CASES])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    build, tmp_path, cwd, monkeypatch, capsys
):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    bad = build(inputs)
    before = file_tree(inputs)
    code, out, err = run_cli(bad.args, monkeypatch, capsys)
    assert code == 2, (out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert str(bad.culprit) in lines[0], lines[0]
    if bad.key is not None:
        assert bad.key in lines[0], lines[0]
    assert "Traceback" not in err
    assert list(cwd.iterdir()) == [] and file_tree(inputs) == before


@pytest.mark.parametrize(
    "args", [["run", "{spec}"], ["live", "--spec", "{spec}", "--json"], ["doctor", "{spec}"]]
)
def test_as_a_separate_process(args, tmp_path, cwd):
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        (ROOT / "experiments" / "tiny.yaml").read_text().replace("num_prompts: 4", "num_prompts: 0")
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    out = subprocess.run(
        [sys.executable, "-m", "bisect_eagle.cli", *(a.format(spec=spec) for a in args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert (
        len(out.stderr.strip().splitlines()) == 1
        and str(spec) in out.stderr
        and "'num_prompts'" in out.stderr
    )
    assert "Traceback" not in out.stderr and list(cwd.iterdir()) == []


def test_version_exits_0_and_prints_it(monkeypatch, capsys):
    from bisect_eagle import __version__

    code, out, err = run_cli(["--version"], monkeypatch, capsys)
    assert code == 0 and out.strip() == f"bisect-eagle {__version__}" and err == ""
    proc = subprocess.run(
        [sys.executable, "-m", "bisect_eagle.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and __version__ in proc.stdout
