"""``bisect-eagle live``: pinned acceptance from the command line, the trial beside the baseline,
and what it says on stderr while it works (a live line on a terminal, plain lines in a pipe)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SHORT = ["--set", "num_prompts=2", "--set", "warmup_prompts=1"]
CLOCK = re.compile(r"(\d+):(\d\d):(\d\d)")
TIMEOUT_S = 1800  # a trial on a 2-core machine at load 20 takes minutes; far beyond it


def live(*args: str, cwd: Path, columns: int = 80) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(COLUMNS=str(columns), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "bisect_eagle.cli", "live", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def test_pin_acceptance_gives_the_pinned_accept_length_tagged_pinned(tmp_path):
    out = live("--scenario", "tiny", "--pin-acceptance", "3.0", "--json", *SHORT, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    d = json.loads(out.stdout)
    assert d["acceptance"] == "pinned" and d["effective"]["pinned_acceptance"] == [1.0, 1.0, 0.0]
    assert abs(d["accept_length"] - 3.0) <= 0.1  # 64 tokens: 21 steps of 3 and one of 1 (2.91)
    assert d["baseline"]["accept_length"] == 1.0 and d["baseline"]["acceptance"] == "natural"
    assert d["output_tok_s_ratio_to_baseline"] == pytest.approx(
        d["output_tok_s"] / d["baseline"]["output_tok_s"]
    )
    assert len(d["paired"]["ratios"]) == 2  # measured beside the baseline on the same prompts
    # a pipe gets plain lines, each with the elapsed clock
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert all(re.match(r"\[\d+:\d\d:\d\d\] ", line) for line in lines), lines
    assert "\r" not in out.stderr and "\x1b" not in out.stderr


def test_a_pinned_trial_and_the_natural_one_have_their_own_fingerprints(tmp_path):
    plans = {}
    for name, extra in (
        ("natural", []),
        ("pinned", ["--pin-acceptance", "3.0"]),
        ("rates", ["--pin-acceptance", "[1, 1, 0]"]),
        ("set", ["--set", "pinned_acceptance=[1,1,0]"]),
    ):
        out = live("--scenario", "tiny", "--dry-run", "--json", *extra, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        plans[name] = json.loads(out.stdout)["plan"]
    assert plans["natural"]["fingerprint"] != plans["pinned"]["fingerprint"]
    assert (
        plans["pinned"]["fingerprint"]
        == plans["rates"]["fingerprint"]
        == plans["set"]["fingerprint"]
    )
    assert "pinned_acceptance" not in plans["natural"]["effective"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pin-acceptance", "4.5"], "[1, 4]"),
        (["--pin-acceptance", "lots"], "expected an accept length"),
        (["--pin-acceptance", "[0.5, 0.9, 0.1]"], "non-increasing"),
        (["--pin-acceptance", "3", "--set", "pinned_acceptance=[1,1,0]"], "give one"),
        (["--pin-acceptance", "3", "--baseline"], "the baseline"),
    ],
)
def test_a_pin_that_cannot_hold_is_one_line_and_exit_2(tmp_path, args, message):
    out = live("--scenario", "tiny", "--dry-run", *args, cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    line = out.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line and message in line, out.stderr


def test_the_table_puts_each_draft_position_beside_the_baseline(tmp_path):
    out = live("--scenario", "tiny", *SHORT, "--set", "max_new_tokens=16", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    for row in (
        "output tok/s",
        "accept length",
        "draft 1 accepted",
        "draft 2 given 1",
        "draft 3 given 2",
        "× baseline",
        "tokens per step",
        "paired on the same prompts",
    ):
        assert row in text, row
    assert "{" not in text  # no raw dict
    assert max(len(line) for line in text.splitlines()) <= 80


def _first_line_in_a_pty(args: list[str], cwd: Path) -> tuple[str, float]:
    """The first non-empty line (or redraw) the command writes to a 120-column terminal, and the
    seconds it took; the command is killed then."""
    ansi = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(COLUMNS="120", LINES="40", TERM="xterm")
    leader, follower = pty.openpty()
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bisect_eagle.cli", "live", *args],
        cwd=cwd,
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        close_fds=True,
        start_new_session=True,
    )
    os.close(follower)
    buffer = ""
    try:
        while time.monotonic() - start < TIMEOUT_S and proc.poll() is None:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if not ready:
                continue
            buffer += ansi.sub("", os.read(leader, 65536).decode(errors="replace"))
            pieces = [p for p in re.split(r"[\r\n]", buffer) if p.strip()]
            if pieces and CLOCK.search(pieces[0]):
                return pieces[0], time.monotonic() - start
        pytest.fail(f"no progress line: {buffer[-1000:]!r}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        os.close(leader)


def test_live_says_what_it_does_before_anything_loads(tmp_path):
    """On a terminal the first line is the command's own, with its elapsed clock, before torch or a
    model loads."""
    line, seconds = _first_line_in_a_pty(["--scenario", "tiny", "--no-compare"], tmp_path)
    h, m, s = map(int, CLOCK.search(line).groups())
    assert "reading the settings" in line or "checking the target" in line, line
    # a quiet machine: the command's own clock says when
    if os.getloadavg()[0] < (os.cpu_count() or 1):
        assert h * 3600 + m * 60 + s <= 5, (line, seconds)
