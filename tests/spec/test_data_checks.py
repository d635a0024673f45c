"""Every bad draft, dump, target and device given to `bisect-eagle standalone` ends with exit 2 and
one line naming the culprit file (or flag) and the key or tensor: no traceback, nothing written.
`--skip-bad` skips bad samples, counts them, and never scores non-finite states."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bad_data_cases import CASES, TINY, bad_sample, dump_copy, edit_sample

from helpers import file_tree, run_cli

BASE = ["standalone", "--scenario", "tiny", "--samples", "3", "--steps", "1", "--json"]


@pytest.fixture
def cwd(tmp_path, monkeypatch) -> Path:
    """An empty working directory that must stay empty."""
    path = tmp_path / "cwd"
    path.mkdir()
    monkeypatch.chdir(path)
    return path


def test_the_corpus_is_big_enough():
    assert len(CASES) >= 40 and len({name for name, _ in CASES}) == len(CASES)


@pytest.mark.parametrize("build", [b for _, b in CASES], ids=[n for n, _ in CASES])
def test_bad_input_exits_2_with_one_line(build, tmp_path, cwd, monkeypatch, capsys):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    bad = build(inputs)
    before = file_tree(inputs)
    code, out, err = run_cli([*BASE, *bad.args], monkeypatch, capsys)
    assert code == 2, (out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert str(bad.culprit) in lines[0], lines[0]
    if bad.key is not None:
        assert f"'{bad.key}'" in lines[0], lines[0]
    assert "Traceback" not in err
    assert list(cwd.iterdir()) == [] and file_tree(inputs) == before


@pytest.mark.parametrize(
    "name",
    [
        "dump-hidden-states-list-of-ints",
        "draft-hidden-size-big",
        "target-pickle-only",
        "device-banana",
    ],
)
def test_as_a_separate_process(name, tmp_path, cwd):
    bad = dict(CASES)[name](tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "bisect_eagle.cli", *BASE, *bad.args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and str(bad.culprit) in out.stderr
    assert "Traceback" not in out.stderr and list(cwd.iterdir()) == []


def _nan_states(o: dict) -> None:
    o["hidden_states"] = [h * float("nan") for h in o["hidden_states"]]


def test_skip_bad_skips_and_counts_non_finite_samples(tmp_path, cwd, monkeypatch, capsys):
    bad = bad_sample(tmp_path, _nan_states, "hidden_states[0]", index=1)
    code, out, err = run_cli([*BASE, *bad.args, "--skip-bad"], monkeypatch, capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["samples"] == 2 and len(result["skipped_files"]) == 1
    assert (
        str(bad.culprit) in result["skipped_files"][0]
        and "NaN or inf" in result["skipped_files"][0]
    )
    clean_code, clean_out, _ = run_cli(
        [*BASE, "--dump", str(TINY.dump), "--samples", "3"], monkeypatch, capsys
    )
    assert clean_code == 0
    # the NaN sample's tokens were not scored
    assert json.loads(clean_out)["tokens"] > result["tokens"] > 0


def test_an_all_nan_dump_never_reports_an_accuracy(tmp_path, cwd, monkeypatch, capsys):
    dump = dump_copy(tmp_path)
    for f in sorted(dump.iterdir()):
        edit_sample(f, _nan_states)
    for extra in ([], ["--skip-bad"]):
        code, out, err = run_cli([*BASE, "--dump", str(dump), *extra], monkeypatch, capsys)
        assert code == 2 and out == "" and "1.0" not in err
        assert str(dump / "data_0.pt") in err and "NaN or inf" in err
    assert "no usable samples (3 bad files skipped" in err


def test_skip_bad_skips_tokens_outside_the_vocabulary(tmp_path, cwd, monkeypatch, capsys):
    bad = bad_sample(tmp_path, lambda o: o["input_ids"].__setitem__(0, 999), "input_ids", index=0)
    code, out, err = run_cli([*BASE, *bad.args, "--skip-bad"], monkeypatch, capsys)
    assert code == 0, err
    skipped = json.loads(out)["skipped_files"]
    assert (
        len(skipped) == 1 and "token id 999, outside the target vocabulary [0, 257)" in skipped[0]
    )
