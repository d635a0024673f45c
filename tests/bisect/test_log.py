"""The bisect log: round trip, edited marks, errors with file and line, nothing secret written."""

from __future__ import annotations

import pytest

from bisect_eagle.bisect.changes import Change
from bisect_eagle.bisect.ddmin import ProbeOutcome
from bisect_eagle.bisect.judge import Judge
from bisect_eagle.bisect.log import BisectLog, parse_log
from bisect_eagle.errors import BadInput


def changes() -> list[Change]:
    return [Change("num_steps", {"num_steps": 3}, {"num_steps": 1}),
            Change("env.X", {"env.X": None}, {"env.X": "1"}),
            Change("env.HF_TOKEN", {"env.HF_TOKEN": None}, {"env.HF_TOKEN": "hf_planted"})]


def test_log_round_trip_and_edited_marks(tmp_path):
    log = BisectLog("good.yaml", "bad.yaml", Judge().settings(), {"num_prompts": 2}, changes()[:2],
                    reference={"samples": [10.0, 10.5]}, noise={"sd_log": 0.01, "dof": 3})
    log.marks += [(ProbeOutcome.GOOD, (), "measured"), (ProbeOutcome.BAD, ("num_steps", "env.X"), "")]
    path = tmp_path / "b.log"
    log.write(path)
    text = path.read_text()
    assert "good -  # measured\nbad num_steps,env.X\n" in text and '#   num_steps: 3 -> 1' in text
    path.write_text(text.replace("bad num_steps,env.X", "skip num_steps,env.X"))
    parsed = parse_log(path)
    assert parsed.header["good"] == "good.yaml" and parsed.header["set"] == {"num_prompts": 2}
    assert parsed.header["reference"] == {"samples": [10.0, 10.5]}
    assert parsed.header["noise"] == {"sd_log": 0.01, "dof": 3}
    assert parsed.header["judge"]["confidence"] == Judge().confidence
    assert parsed.marks[1] == (ProbeOutcome.UNRESOLVED, ("num_steps", "env.X"), "")
    path.write_text(text + "maybe num_steps\n")
    with pytest.raises(BadInput, match=r"b.log:\d+: expected '<good\|bad\|skip>"):
        parse_log(path)
    path.write_text("hello\n")
    with pytest.raises(BadInput, match="b.log:1: expected '# bisect-eagle bisect log v1'"):
        parse_log(path)
    with pytest.raises(BadInput, match="bisect log not found"):
        parse_log(tmp_path / "nope.log")


def test_nothing_secret_is_written(tmp_path):
    log = BisectLog("good.yaml", "bad.yaml", Judge().settings(), {"env.MY_TOKEN": "x7q-secret"}, changes(),
                    scrub=lambda text: text.replace("leaked-value", "<redacted>"))
    log.marks.append((ProbeOutcome.UNRESOLVED, ("env.HF_TOKEN",), "could not run: error with leaked-value\nand more"))
    log.write(tmp_path / "b.log")
    text = (tmp_path / "b.log").read_text()
    assert "x7q-secret" not in text and "hf_planted" not in text and "leaked-value" not in text
    assert '#   env.HF_TOKEN: null -> "<redacted>"' in text
    assert "skip env.HF_TOKEN  # could not run: error with <redacted> and more\n" in text  # one line per mark
