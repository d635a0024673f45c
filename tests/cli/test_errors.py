"""Errors that point at the fix: a misspelt setting names the one meant, a command that reads runs
in a folder without any says to run `bisect-eagle run` first and creates nothing, a read-only store
is read by the commands that only read and refused in one line by those that write, and `--help`
says every summary whole."""

from __future__ import annotations

import ctypes
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import file_tree, run_cli


@pytest.fixture
def empty(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.mark.parametrize(
    "args",
    [
        ["live", "--scenario", "tiny", "--set", "num_step=5"],
        ["bisect", "--good", "g.yaml", "--bad", "b.yaml", "--set", "num_step=5"],
    ],
)
def test_a_misspelt_setting_names_the_one_meant(empty, monkeypatch, capsys, args):
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 2 and out == ""
    assert (
        err.strip() == "error: --set num_step=5: unknown setting num_step; did you mean num_steps?"
    )
    assert list(empty.iterdir()) == []


def test_an_unknown_setting_without_a_close_one_lists_them(empty, monkeypatch, capsys):
    code, _, err = run_cli(["live", "--scenario", "tiny", "--set", "flux=1"], monkeypatch, capsys)
    assert code == 2 and "unknown setting flux; the settings are speculative_algorithm, " in err
    assert "env.NAME, server_args.flag" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args", [["report"], ["export"], ["export", "7ca37e03"], ["reproduce", "7ca37e03"]]
)
def test_reading_runs_before_any_run_exits_2_names_run_and_creates_nothing(
    empty, monkeypatch, capsys, args
):
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        f"error: no runs in ./mlruns yet ({empty.resolve()}/mlruns/mlflow.db does not exist): run "
        "`bisect-eagle run` first, or give --tracking-uri of a store that has them"
    ]
    assert list(empty.iterdir()) == []


def test_help_says_every_summary_whole_at_80_columns_never_splitting_a_flag(tmp_path):
    from bisect_eagle.cli import COMMAND_MODULES, app

    env = {**os.environ, "COLUMNS": "80"}
    top = subprocess.run(
        [sys.executable, "-m", "bisect_eagle.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert top.returncode == 0 and "..." not in top.stdout.split("Commands:")[1]  # no summary cut
    listed = " ".join(top.stdout.split())
    for info in app.registered_commands:
        assert info.short_help and " ".join(info.short_help.split()) in listed, info.name
    for name in COMMAND_MODULES:
        done = subprocess.run(
            [sys.executable, "-m", "bisect_eagle.cli", name, "--help"],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert not [line for line in lines if len(line) > 80], name
        # --study-/name
        assert not [line for line in lines if re.search(r"[a-z]-$", line)], (name, done.stdout)


def _without_root_override() -> None:
    """In the child before it runs the command: a root user loses the capabilities that pass over
    file permissions, so a read-only folder is read-only to it too (any other user needs
    nothing)."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
            if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                os._exit(97)


def _as_user(argv: list[str], cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=_without_root_override,
        start_new_session=True,
    )


@pytest.fixture(scope="module")
def read_only_store(tmp_path_factory):
    """A study's stores under ``cwd/mlruns``, then made read-only (the folder and every file in
    it)."""
    from helpers import tiny_fake_study

    cwd = tmp_path_factory.mktemp("read-only")
    uri, out, _ = tiny_fake_study(cwd)
    paths = [cwd / "mlruns", *(cwd / "mlruns").rglob("*")]
    for p in paths:
        p.chmod(p.stat().st_mode & ~0o222)
    probe = _as_user(
        [sys.executable, "-c", f"open({str(cwd / 'mlruns' / 'mlflow.db')!r}, 'r+b')"], cwd
    )
    if probe.returncode == 97:
        pytest.skip(
            "this root user cannot give up its file-permission override here (no CAP_SETPCAP)"
        )
    # the premise: this user cannot write the store
    assert "PermissionError" in probe.stderr, probe.stderr
    yield cwd, out, file_tree(cwd)
    for p in paths:
        p.chmod(p.stat().st_mode | 0o200)


@pytest.mark.parametrize("args", [["report"], ["report", "--json"], ["export"]])
def test_a_read_only_store_is_read_by_the_commands_that_only_read(read_only_store, args):
    cwd, out, before = read_only_store
    done = _as_user([sys.executable, "-m", "bisect_eagle.cli", *args], cwd)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "error" not in done.stderr and "Traceback" not in done.stderr
    if args == ["report"]:
        assert f"live 000 (run {out.best['run_id'][:8]})" in done.stdout
        assert (
            f"the store sqlite:///{cwd}/mlruns/mlflow.db is read-only here: nothing logged to it; "
            "--out DIR writes the trials table and the plots" in done.stdout
        )
    elif args == ["report", "--json"]:
        answer = json.loads(done.stdout)
        assert (
            answer["read_only"]
            and answer["files"] == []
            and answer["best"]["run_id"] == out.best["run_id"]
        )
    else:
        assert f"# launch for trial {out.best['run_id'][:8]}" in done.stdout
    assert file_tree(cwd) == before  # nothing written, not even SQLite's journal


def test_bisect_on_a_read_only_store_exits_2_naming_it_before_anything_starts(read_only_store):
    cwd, _, before = read_only_store
    experiments = Path(__file__).resolve().parents[2] / "experiments"
    done = _as_user(
        [
            sys.executable,
            "-m",
            "bisect_eagle.cli",
            "bisect",
            "--good",
            str(experiments / "tiny.yaml"),
            "--bad",
            str(experiments / "tiny-broken.yaml"),
        ],
        cwd,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        f"error: the tracking store {cwd}/mlruns is read-only ({cwd}/mlruns/mlflow.db: permission "
        "denied): make it writable, or give --tracking-uri of a store you can write"
    ]
    assert file_tree(cwd) == before


def test_an_interpreter_that_exits_at_once_is_one_line_and_exit_2(
    empty, tmp_path_factory, monkeypatch, capsys
):
    import yaml

    inputs = tmp_path_factory.mktemp("dying")
    python = inputs / "python"
    python.write_text("#!/bin/sh\necho 'fatal: cannot open shared object file' >&2\nexit 3\n")
    python.chmod(0o755)
    raw = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "experiments" / "tiny-vllm.yaml").read_text()
    )
    raw["engine"]["vllm"]["python"] = str(python)
    spec = inputs / "dying.yaml"
    spec.write_text(yaml.safe_dump(raw))
    code, out, err = run_cli(["live", "--spec", str(spec)], monkeypatch, capsys)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        f"error: {python} exited before answering (exit code 3): fatal: cannot open shared object "
        "file; point engine.vllm.python (or --vllm-python) at an environment with vLLM "
        "(scripts/setup_vllm_env.sh)"
    ]
    assert list(empty.iterdir()) == []
