"""No silent wait: `report`, `export` and `fingerprint` say on stderr what they are doing with the
command's elapsed clock — a live line on a terminal (cleared before the output), plain lines off a
terminal."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import screen_in_a_pty, tiny_fake_study

LIVE = re.compile(r"^[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏] (?P<what>.+?)  (?P<clock>\d:\d\d:\d\d)$")
DRIVER = """
import os, sys
os.environ["COLUMNS"] = "80"
sys.argv = ["bisect-eagle", *{args!r}]
from bisect_eagle.cli import main
main()
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("activity")
    uri, out, _ = tiny_fake_study(root)
    return root, uri


def steps_in_a_pty(args: list[str], cwd: Path) -> tuple[list[str], list[str]]:
    """(the steps its live line said, in order, each once; the lines after the live line) of
    `bisect-eagle ARGS` in an 80-column pseudo-terminal."""
    seen, code = screen_in_a_pty(DRIVER.format(args=args), cwd=cwd, timeout_s=900)
    texts = [text for _, text in seen]
    assert code == 0, "\n".join(texts[-30:])
    steps = list(dict.fromkeys(found["what"] for text in texts if (found := LIVE.match(text))))
    last = max(i for i, text in enumerate(texts) if LIVE.match(text))
    assert not [t for t in texts if len(t) > 80 and LIVE.match(t)]
    return steps, texts[last + 1 :]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["report"],
            [
                "loading the tool",
                "loading the spec",
                "opening the tracking store",
                "finding study",
                "reading the runs of study",
            ],
        ),
        (
            ["export"],
            [
                "loading the tool",
                "loading the spec",
                "opening the tracking store",
                "finding study",
                "finding the best trial",
                "reading run",
                "planning run",
            ],
        ),
        (
            ["fingerprint", "--scenario", "tiny", "--samples", "1"],
            [
                "checking the target, the dump and the draft",
                "loading the target",
                "running the target over 1",
            ],
        ),
    ],
)
def test_on_a_terminal_a_live_line_says_each_step_with_a_clock_then_clears(store, args, says):
    root, uri = store
    steps, after = steps_in_a_pty(
        [*args, "--tracking-uri", uri] if args[0] != "fingerprint" else args, root
    )
    # every step said
    assert not [say for say in says if not any(s.startswith(say) for s in steps)], steps
    order = [next(i for i, s in enumerate(steps) if s.startswith(say)) for say in says]
    assert order == sorted(order), steps
    # the output follows a cleared line
    assert after and not [t for t in after if t[:1] in "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"]


def test_off_a_terminal_report_writes_plain_lines_with_the_clock(store):
    root, uri = store
    code = (
        "import sys\nfrom bisect_eagle.cli.common import Activity\nActivity.QUIET_S = "
        f"0.0\nsys.argv = ['bisect-eagle', 'report', '--tracking-uri', {uri!r}]\nfrom "
        "bisect_eagle.cli import main\nmain()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=900, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert lines and all(re.fullmatch(r"\[\d:\d\d:\d\d\] .+| {10}\S.*", line) for line in lines), (
        lines
    )
    assert any("reading the runs of study" in line for line in lines), lines
    assert "\r" not in done.stderr and "\x1b" not in done.stderr  # plain lines, no redraws
