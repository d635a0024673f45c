"""`bisect-eagle doctor` as a user reads it: at 80 columns every finding, fix and the summary wrap (no line wider
than the terminal, no value cut), continuations indented; counts in the right number ("1 error", "0 warnings")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bisect_eagle.cli import app

BROKEN = Path(__file__).resolve().parents[2] / "experiments" / "broken"
COUNTS = re.compile(r": (\d+) (errors?), (\d+) (warnings?), (\d+) (notes?)$")


def doctor(spec: Path, columns: int) -> tuple[int, list[str]]:
    done = CliRunner().invoke(app, ["doctor", str(spec)], env={"COLUMNS": str(columns)})
    return done.exit_code, done.output.splitlines()


@pytest.mark.parametrize("name", sorted(p.name for p in BROKEN.glob("*.yaml")))
def test_every_line_fits_80_columns_and_counts_read_right(name):
    code, lines = doctor(BROKEN / name, 80)
    assert code in (0, 1), lines
    assert lines and max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    assert "…" not in "\n".join(lines)
    start = next(i for i, line in enumerate(lines) if line.startswith(str(BROKEN / name)))
    summary = " ".join(" ".join(lines[start:]).split())
    found = COUNTS.search(summary)
    assert found, summary
    for count, noun in zip(found.groups()[::2], found.groups()[1::2], strict=True):
        assert noun.endswith("s") == (count != "1"), summary


def test_a_wrapped_finding_keeps_every_word_and_indents_its_continuations():
    _, narrow = doctor(BROKEN / "fc-width.yaml", 80)
    _, wide = doctor(BROKEN / "fc-width.yaml", 400)
    assert " ".join(" ".join(narrow).split()) == " ".join(" ".join(wide).split())  # nothing cut, only wrapped
    assert len(narrow) > len(wide)
    heads = [i for i, line in enumerate(narrow) if line.startswith(("error ", "warning ", "info "))]
    assert heads
    for i in range(heads[0] + 1, len(narrow) - 1):
        assert narrow[i].startswith("    "), narrow  # a continuation or a fix, never flush left
