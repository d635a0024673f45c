"""Errors that point at the fix: a misspelt setting names the one meant, a command that reads runs in a folder
without any says to run `bisect-eagle run` first and creates nothing, and `--help` says every summary whole."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers import run_cli


@pytest.fixture
def empty(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.mark.parametrize("args", [["live", "--scenario", "tiny", "--set", "num_step=5"],
                                  ["bisect", "--good", "g.yaml", "--bad", "b.yaml", "--set", "num_step=5"]])
def test_a_misspelt_setting_names_the_one_meant(empty, monkeypatch, capsys, args):
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 2 and out == ""
    assert err.strip() == "error: --set num_step=5: unknown setting num_step; did you mean num_steps?"
    assert list(empty.iterdir()) == []


def test_an_unknown_setting_without_a_close_one_lists_them(empty, monkeypatch, capsys):
    code, _, err = run_cli(["live", "--scenario", "tiny", "--set", "flux=1"], monkeypatch, capsys)
    assert code == 2 and "unknown setting flux; the settings are speculative_algorithm, " in err
    assert "env.NAME, server_args.flag" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [["report"], ["export"], ["export", "7ca37e03"], ["reproduce", "7ca37e03"]])
def test_reading_runs_before_any_run_exits_2_names_run_and_creates_nothing(empty, monkeypatch, capsys, args):
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"error: no runs in ./mlruns yet ({empty.resolve()}/mlruns/mlflow.db does not "
                                        "exist): run `bisect-eagle run` first, or give --tracking-uri of a store that "
                                        "has them"]
    assert list(empty.iterdir()) == []


def test_help_says_every_summary_whole_at_80_columns_never_splitting_a_flag(tmp_path):
    from bisect_eagle.cli import COMMAND_MODULES, app

    env = {**os.environ, "COLUMNS": "80"}
    top = subprocess.run([sys.executable, "-m", "bisect_eagle.cli", "--help"], capture_output=True, text=True,
                         timeout=300, env=env, cwd=tmp_path)
    assert top.returncode == 0 and "..." not in top.stdout.split("Commands:")[1]  # no summary cut
    listed = " ".join(top.stdout.split())
    for info in app.registered_commands:
        assert info.short_help and " ".join(info.short_help.split()) in listed, info.name
    for name in COMMAND_MODULES:
        done = subprocess.run([sys.executable, "-m", "bisect_eagle.cli", name, "--help"], capture_output=True,
                              text=True, timeout=300, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert not [line for line in lines if len(line) > 80], name
        assert not [line for line in lines if re.search(r"[a-z]-$", line)], (name, done.stdout)  # --study-/name
