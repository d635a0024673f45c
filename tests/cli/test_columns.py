"""At 80 columns (``COLUMNS=80``) what `run`, `report`, `bisect`, `export`, `reproduce` and every
`--help` print fits: no line wider than 80 characters, no value cut with "…", no `<bool>`
placeholder, numbers rounded."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from bisect_eagle.cli import COMMAND_MODULES, app

from helpers import tiny_fake_bisect, tiny_fake_study

LONG_FLOAT = re.compile(r"\d+\.\d{5,}")  # an unrounded float (16 digits in the old report)
OTHER_RATIOS = re.compile(r"÷|\dx\b|x base")  # every ratio to the baseline reads "1.04× baseline"
ACTIVITY = re.compile(r"\[\d:\d\d:\d\d\] ")  # what a command is doing, off a terminal (stderr)


def fits(text: str) -> None:
    lines = text.splitlines()
    too_wide = [line for line in lines if len(line) > 80]
    assert not too_wide, too_wide
    assert "…" not in text and "<bool>" not in text
    assert not LONG_FLOAT.search(text), LONG_FLOAT.search(text)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A tiny-scenario study (real stage 1 on 4 samples, fake live engine) and a bisect, in a fresh
    store."""
    root = tmp_path_factory.mktemp("columns")
    uri, out, fake = tiny_fake_study(root)
    bisect = tiny_fake_bisect(root, uri, fake)
    return root, uri, out, bisect


@pytest.fixture(autouse=True)
def columns_80(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_run_outcome_fits(store, monkeypatch):
    """As a user runs it: from the directory whose mlruns/ holds the stores (the ui command needs no
    URI)."""
    from bisect_eagle.cli.study import print_outcome

    root, _, out, _ = store
    monkeypatch.chdir(root)
    buf = io.StringIO()
    print_outcome(out, Console(file=buf, width=80))
    text = buf.getvalue()
    fits(text)
    assert "× baseline" in text and not OTHER_RATIOS.search(text)
    assert "[:-1] (standardize_data_v1)" in text.replace("\n", " ") or "standardize_data_v1" in text
    assert "  bisect-eagle ui\n" in text


def test_run_outcome_says_what_the_model_skipped(store, monkeypatch):
    from dataclasses import replace

    from bisect_eagle.cli.study import print_outcome

    root, _, out, _ = store
    monkeypatch.chdir(root)
    for skipped, shown in ((0, False), (3, True)):
        buf = io.StringIO()
        print_outcome(
            replace(out, counts={**out.counts, "skipped": skipped}), Console(file=buf, width=80)
        )
        text = buf.getvalue()
        fits(text)
        assert (
            "the throughput model skipped 3 proposed configs predicted below the target"
            in " ".join(text.split())
        ) is shown


def test_report_fits_and_states_target_verdict_and_best(store):
    root, uri, out, _ = store
    done = CliRunner().invoke(app, ["report", "--tracking-uri", uri, "--out", str(root / "report")])
    assert done.exit_code == 0, done.output
    fits(done.output)
    assert "× baseline" in done.output and not OTHER_RATIOS.search(done.output)
    assert out.verdict.startswith(
        "target reached: accept length 4.60, target ≥ 4.50 (4.5× baseline), confirmed"
    )
    # the verdict sentence, whole and once
    assert " ".join(done.output.split()).count(out.verdict) == 1
    (best,) = [t for t in out.trials if t["run_id"] == out.best["run_id"] and not t["duplicate"]]
    assert f"best: live {best['number']:03d} (run {out.best['run_id'][:8]})" in done.output


def test_bisect_fits(store, capsys):
    from bisect_eagle.cli.bisect import _print

    _, _, _, bisect = store
    _print(bisect)
    text = capsys.readouterr().out
    fits(text)
    assert "breaks the good configuration when applied to it" in text.replace("\n", " ")
    assert f"({bisect.launches} {bisect.launch_unit})" in text.replace("\n", " ")


def test_export_fits_and_never_wraps_the_command(store):
    _, uri, out, _ = store
    done = CliRunner().invoke(app, ["export", out.best["run_id"], "--tracking-uri", uri])
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    command = [line for line in lines if "--speculative-algorithm" in line]
    # the whole command: one line to paste
    assert len(command) == 1 and "--speculative-num-steps" in command[0]
    rest = [line for line in lines if line not in command]
    fits("\n".join(rest))
    prose = [
        line
        for line in rest
        if line and not line.startswith(("export ", " ", "{", "}")) and not ACTIVITY.match(line)
    ]  # stderr's clocked steps, mixed in by the runner
    # a wrapped comment is still a comment
    assert prose and all(line.startswith("# ") for line in prose)


@pytest.mark.parametrize("command", ["", *COMMAND_MODULES])
def test_help_fits(command):
    done = CliRunner().invoke(app, [*([command] if command else []), "--help"], terminal_width=80)
    assert done.exit_code == 0, done.output
    fits(done.output)
    assert "1 parameters" not in done.output and "1 repeats" not in done.output


def test_fingerprint_fits_as_one_block_per_tensor_and_cuts_nothing():
    done = CliRunner().invoke(app, ["fingerprint", "--scenario", "tiny"])
    assert done.exit_code == 0, done.output
    # cosine keeps 5 decimals
    assert max(map(len, done.output.splitlines())) <= 80 and "…" not in done.output
    assert "dump 3 (final): hs[12] layer 11 output (final, pre-norm)" in done.output
    assert "ids: SGLang 11 · vLLM 12 · SpecForge 11" in done.output


def test_fingerprint_is_one_table_where_the_terminal_is_wide_enough(monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    done = CliRunner().invoke(app, ["fingerprint", "--scenario", "tiny"])
    assert done.exit_code == 0, done.output
    assert "┃ tensor" in done.output and "…" not in done.output
