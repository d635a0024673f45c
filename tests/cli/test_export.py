"""`bisect-eagle export` prints a command that runs as printed on the node: SGLang's interpreter
from the spec or `--sglang-python`, else `python3 -m sglang.launch_server ...` with a comment saying
what to point it at — never this tool's own interpreter, which cannot import SGLang."""

from __future__ import annotations

import sys

import pytest

from bisect_eagle.engines.sglang.export import node_argv

from helpers import run_cli, tiny_fake_study

NOT_CHECKED = "not checked against SGLang (python cannot import the server's parser (sglang))"
LAUNCH = ["python", "-m", "sglang.launch_server"]


def test_without_a_known_interpreter_the_command_starts_with_python3_and_says_what_to_point_it_at():
    argv = [sys.executable, "-m", "sglang.launch_server", "--port", "30000"]
    got, note = node_argv(argv, launch_command=LAUNCH, python=None, checked=NOT_CHECKED)
    assert got == ["python3", "-m", "sglang.launch_server", "--port", "30000"]
    assert (
        note.startswith("python3: the interpreter that has SGLang on the node")
        and "--sglang-python" in note
    )


@pytest.mark.parametrize(
    ("launch", "python", "checked"),
    [
        # the spec's engine.sglang.python, or --sglang-python
        (LAUNCH, "/opt/sglang/bin/python", NOT_CHECKED),
        # the launch command names it
        (["/opt/sglang/bin/python", "-m", "sglang.launch_server"], None, NOT_CHECKED),
        # this machine's python has SGLang: its path runs
        (LAUNCH, None, "SGLang 0.5.23 parser and resolution"),
        # the stand-in: this tool's interpreter
        (["python", "-m", "bisect_eagle.cli", "serve"], None, NOT_CHECKED),
    ],
)
def test_a_known_interpreter_is_printed_as_is(launch, python, checked):
    argv = ["/resolved/python", *launch[1:]]
    assert node_argv(argv, launch_command=launch, python=python, checked=checked) == (argv, None)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    uri, out, _ = tiny_fake_study(root)
    return uri, out


def test_export_of_the_best_trial_prints_python3_and_the_comment_above_the_command(
    store, monkeypatch, capsys
):
    uri, out = store
    monkeypatch.setenv("COLUMNS", "80")
    code, text, _ = run_cli(["export", "--tracking-uri", uri], monkeypatch, capsys)
    assert code == 0, text
    lines = text.splitlines()
    command = next(
        i for i, line in enumerate(lines) if line.startswith("python3 -m sglang.launch_server ")
    )
    comment = " ".join(
        line.removeprefix("# ") for line in lines[command - 3 : command] if line.startswith("# ")
    )
    assert "python3: the interpreter that has SGLang on the node" in comment
    assert sys.executable not in text and f"launch for trial {out.best['run_id'][:8]}" in text
    assert out.best["run_id"] not in text  # the run id as a person reads it: 8 characters


def test_sglang_python_is_the_commands_interpreter(store, monkeypatch, capsys):
    uri, out = store
    code, text, _ = run_cli(
        [
            "export",
            out.best["run_id"][:8],
            "--tracking-uri",
            uri,
            "--sglang-python",
            sys.executable,
        ],
        monkeypatch,
        capsys,
    )
    assert code == 0
    assert f"\n{sys.executable} -m sglang.launch_server " in text and "python3:" not in text
