"""The verdict as a user reads it: one sentence on the criterion, said once in `run`'s output, the
study page and `report`; and the best config's tok/s against the baseline's whatever the criterion,
said plainly when speculation is slower here, with the cause when it is known (the engine on the
CPU, a machine loaded beyond its cores)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bisect_eagle.search.study.outcome import StudyOutcome, speed_facts, speed_sentence

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
SENTENCE = re.compile(r"\btarget (not )?reached\b")


def outcome(**changes) -> StudyOutcome:
    base = StudyOutcome(
        target_reached=True,
        stop_reason="target reached (confirmed)",
        study="s",
        storage="s",
        tracking_uri="t",
        experiment_id="1",
        parent_run_id="p" * 32,
        metric="accept_length",
        baseline=1.0,
        target=4.5,
        baseline_output_tok_s=90.0,
        best={
            "run_id": "r" * 32,
            "value": 4.8,
            "params": {"device": "cpu"},
            "metrics": {"output_tok_s": 61.2},
        },
        gate=[],
        trials=[],
        counts={"live_measured": 1},
        elapsed_s=1.0,
        tool_overhead_s_per_trial=None,
        confirmation={
            "status": "confirmed",
            "ratio": 4.5,
            "lower": 4.8,
            "deterministic": True,
            "pairs": 1,
            "confidence": 0.95,
            "detail": "",
        },
    )
    return replace(base, **changes)


def test_the_verdict_is_one_short_sentence():
    assert outcome().verdict == (
        "target reached: accept length 4.80, target ≥ 4.50 (4.5× baseline), confirmed by one "
        "measurement"
    )
    pooled = outcome(
        metric="output_tok_s",
        baseline=90.0,
        target=94.5,
        best={**outcome().best, "value": 99.1},
        confirmation={
            "status": "confirmed",
            "ratio": 1.05,
            "lower": 1.061,
            "deterministic": False,
            "pairs": 3,
            "confidence": 0.95,
            "detail": "",
        },
    )
    assert pooled.verdict == (
        "target reached: output tok/s 99.10, target ≥ 94.50 (1.05× baseline), confirmed by 3 "
        "re-measurements, 95 % lower bound 1.06×"
    )
    missed = outcome(
        target_reached=False,
        stop_reason="budget: max_live_trials (8) used",
        confirmation=None,
        best={**outcome().best, "value": 3.2},
    )
    assert missed.verdict == (
        "target not reached: best accept length 3.20, target ≥ 4.50 (4.5× baseline); stopped: "
        "budget: max_live_trials (8) used"
    )
    for out in (outcome(), pooled, missed):
        assert (
            len(SENTENCE.findall(out.verdict)) == 1
            and "((" not in out.verdict
            and "p" * 32 not in out.verdict
        )


def test_slower_than_no_speculation_is_said_plainly_with_its_known_cause(monkeypatch):
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (5.2, 4.0, 3.0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    facts = speed_facts(outcome().best, 90.0)
    text = speed_sentence(facts)
    assert text.startswith(
        "output tok/s 61.20 against 90.00 without speculation (0.68× baseline): speculation is "
        "slower here than no speculation, likely because the engine runs on the CPU"
    )
    assert "the machine is loaded (load average 5.2 on 2 cores)" in text
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.4, 0.3))
    quiet = speed_facts({**outcome().best, "params": {"device": "cuda:0"}}, 90.0)
    assert quiet["causes"] == [] and speed_sentence(quiet).endswith(
        "speculation is slower here than no speculation"
    )
    assert speed_sentence({"output_tok_s": 113.4, "baseline_output_tok_s": 90.0}) == (
        # faster: no warning
        "output tok/s 113.4 against 90.00 without speculation (1.26× baseline)"
    )
    assert speed_sentence(None) is None and speed_sentence({"output_tok_s": 1.0}) is None


DRIVER = """
import sys
sys.path.insert(0, {tests!r})
import bisect_eagle.engines
from fake_engine import FakeEngine


class Slow(FakeEngine):  # speculation slower than no speculation, whatever the accept length
    def run(self, plan):
        result = super().run(plan)
        if not plan.settings.is_baseline:
            result.output_tok_s = 0.3 * result.output_tok_s
        return result


bisect_eagle.engines.make_engine = lambda spec, log_dir=None: Slow()
sys.argv = ["bisect-eagle", *{args!r}]
from bisect_eagle.cli import main
main()
"""


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return subprocess.run(
        [sys.executable, "-c", DRIVER.format(tests=str(TESTS), args=args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """`bisect-eagle run` on the tiny spec (4 standalone samples, 2 live trials) with the fake
    engine made slower with speculation than without, off a terminal; then `report` on its store:
    the two finished processes."""
    root = tmp_path_factory.mktemp("verdict")
    spec = root / "tiny.yaml"
    spec.write_text(
        (ROOT / "experiments" / "tiny.yaml").read_text().replace("samples: 32", "samples: 4")
    )
    run = cli(["run", str(spec), "--max-live-trials", "2"], root)
    return run, cli(["report", str(spec)], root)


def test_runs_output_says_the_verdict_once_and_tok_s_against_the_baseline(ran):
    run, _ = ran
    assert run.returncode in (0, 3), run.stderr[-3000:]
    out, err = run.stdout, run.stderr
    said = [line for line in (out + err).splitlines() if SENTENCE.search(line)]
    assert len(said) == 1, said  # not in the progress lines, not twice in the summary
    assert re.match(
        r"target (not )?reached: accept length \d\.\d\d, target ≥ \d\.\d\d \(\d(\.\d+)?× "
        r"baseline\)",
        said[0],
    ), said
    text = " ".join(out.split())
    assert re.search(
        r"output tok/s [\d.]+ against [\d.]+ without speculation \(0\.\d\d× baseline\): "
        r"speculation is "
        r"slower here than no speculation",
        text,
    ), out
    assert not re.search(r"\b[0-9a-f]{32}\b", out)  # run ids as 8 characters


def test_report_says_the_same_sentence_once_and_the_slower_tok_s(ran):
    run, done = ran
    assert done.returncode == 0, done.stderr[-3000:]
    out, report = run.stdout, done.stdout
    verdict = next(line for line in out.splitlines() if SENTENCE.search(line))
    assert " ".join(report.split()).count(verdict) == 1, report
    assert len(SENTENCE.findall(report)) == 1
    assert "speculation is slower here than no speculation" in " ".join(report.split())
    assert not re.search(r"\b[0-9a-f]{32}\b", report)
