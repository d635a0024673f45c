"""The bisect log: round trip, edited marks, errors with file and line, nothing secret written."""

from __future__ import annotations

import pytest

from bisect_eagle.bisect.changes import Change
from bisect_eagle.bisect.ddmin import ProbeOutcome
from bisect_eagle.bisect.judge import Judge
from bisect_eagle.bisect.log import PARAM_CHARS, BisectLog, change_params, parse_log
from bisect_eagle.errors import BadInput
from bisect_eagle.tracking.redact import hidden


def changes() -> list[Change]:
    return [
        Change("num_steps", {"num_steps": 3}, {"num_steps": 1}),
        Change("env.X", {"env.X": None}, {"env.X": "1"}),
        Change("env.HF_TOKEN", {"env.HF_TOKEN": None}, {"env.HF_TOKEN": "hf_planted"}),
    ]


def test_log_round_trip_and_edited_marks(tmp_path):
    log = BisectLog(
        "good.yaml",
        "bad.yaml",
        Judge().settings(),
        {"num_prompts": 2},
        changes()[:2],
        reference={"samples": [10.0, 10.5]},
        noise={"sd_log": 0.01, "dof": 3},
    )
    log.marks += [
        (ProbeOutcome.GOOD, (), "measured"),
        (ProbeOutcome.BAD, ("num_steps", "env.X"), ""),
    ]
    path = tmp_path / "b.log"
    log.write(path)
    text = path.read_text()
    assert "good -  # measured\nbad num_steps,env.X\n" in text and "#   num_steps: 3 -> 1" in text
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
    log = BisectLog(
        "good.yaml",
        "bad.yaml",
        Judge().settings(),
        {"env.MY_TOKEN": "x7q-secret"},
        changes(),
        scrub=lambda text: text.replace("leaked-value", "<redacted>"),
    )
    log.marks.append(
        (
            ProbeOutcome.UNRESOLVED,
            ("env.HF_TOKEN",),
            "could not run: error with leaked-value\nand more",
        )
    )
    log.write(tmp_path / "b.log")
    text = (tmp_path / "b.log").read_text()
    assert "x7q-secret" not in text and "hf_planted" not in text and "leaked-value" not in text
    assert '#   env.HF_TOKEN: null -> "<redacted sha256:' in text
    # one line per mark
    assert "skip env.HF_TOKEN  # could not run: error with <redacted> and more\n" in text


def test_change_params_hold_each_settings_good_and_bad_value_as_the_log_writes_it():
    group = Change(
        "topk+num_draft_tokens",
        {"topk": 2, "num_draft_tokens": 8},
        {"topk": 1, "num_draft_tokens": None},
        # the engine runs 2 draft tokens where none were asked
        shown={"num_draft_tokens": (8, 2)},
    )
    topo = "env.NCCL_TOPO_FILE"  # NCCL's own: its value is written in clear, cut to the param limit
    long = Change(topo, {topo: "x" * 7000}, {topo: None})
    params = change_params(
        [*changes(), group, long], scrub=lambda text: text.replace("leaked", "<redacted>")
    )
    assert params["change.num_steps.good"] == "3" and params["change.num_steps.bad"] == "1"
    assert params["change.env.X.good"] == "null"
    assert params["change.env.X.bad"] == f'"{hidden("1")}"'
    assert params["change.env.HF_TOKEN.bad"].startswith('"<redacted sha256:')  # never in clear
    assert (params["change.topk.good"], params["change.topk.bad"]) == ("2", "1")
    assert (params["change.num_draft_tokens.good"], params["change.num_draft_tokens.bad"]) == (
        "8",
        "2",
    )
    assert len(params["change.env.NCCL_TOPO_FILE.good"]) == PARAM_CHARS == 6000
    assert len(params) == 2 * 6
    debug = "env.NCCL_DEBUG_FILE"  # a value in clear is still scrubbed
    scrubbed = change_params(
        [Change(debug, {debug: "leaked"}, {debug: None})],
        scrub=lambda t: t.replace("leaked", "<redacted>"),
    )
    assert scrubbed[f"change.{debug}.good"] == '"<redacted>"'
