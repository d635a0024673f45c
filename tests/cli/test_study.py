"""What `run` shows while a study runs (`cli/study.py`): the progress line's time estimate and its words, and, in a
pseudo-terminal with a slow fake engine, a progress line that changes at least every 10 s between events."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bisect_eagle.cli.study import Eta, clock, event_text
from bisect_eagle.search.study import StudyProgress

from helpers import screen_in_a_pty

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def event(stage: str, *, elapsed: float, done: int = 0, total: int = 8, wall: float = 7200.0) -> StudyProgress:
    return StudyProgress(stage=stage, message="m", done=done, total=total, elapsed_s=elapsed, max_wall_s=wall)


def test_clock_is_one_format():
    assert [clock(s) for s in (0, 5.9, 65, 3600, 6593, -3)] == ["0:00:00", "0:00:05", "0:01:05", "1:00:00",
                                                               "1:49:53", "0:00:00"]


def test_left_moves_with_the_clock_between_events():
    eta = Eta()
    assert eta.left(0.0) is None and eta.elapsed(0.0) == 0.0
    eta.update(event("standalone", elapsed=10.0, wall=100.0), now=1000.0)
    assert eta.elapsed(1012.0) == pytest.approx(22.0)
    assert eta.left(1000.0) == (pytest.approx(90.0), "≤") and eta.left(1030.0) == (pytest.approx(60.0), "≤")
    assert eta.left(5000.0) == (0.0, "≤")  # past the budget: never negative


def test_left_comes_from_the_trial_budget_and_the_measured_trial_times():
    eta = Eta()
    eta.update(event("live", elapsed=100.0), now=0.0)  # live trials begin at study time 100 s
    eta.update(event("live", elapsed=130.0, done=1), now=30.0)
    eta.update(event("live", elapsed=160.0, done=2), now=60.0)  # 30 s a trial, 6 of 8 still allowed
    assert eta.left(60.0) == (pytest.approx(180.0), "~")
    assert eta.left(70.0) == (pytest.approx(170.0), "~")  # the current trial has run 10 s
    assert eta.left(1000.0) == (pytest.approx(6100.0), "≤")  # slower than estimated: the wall budget's bound
    eta.update(event("confirm", elapsed=170.0, done=2), now=70.0)
    assert eta.left(70.0) == (pytest.approx(7030.0), "≤")  # confirmation is not counted in trials
    tight = Eta()
    tight.update(event("live", elapsed=0.0, wall=50.0), now=0.0)
    tight.update(event("live", elapsed=30.0, done=1, wall=50.0), now=30.0)
    assert tight.left(30.0) == (pytest.approx(20.0), "≤")  # the wall budget ends first


def test_an_event_does_not_repeat_its_stage():
    assert event_text("standalone", "standalone 1/5: [:-1]") == "1/5: [:-1]"
    assert event_text("baseline", "baseline trial (no speculation)") == "trial (no speculation)"
    assert event_text("live", "live 003: 4.60 (ok), run 7ca37e03") == "003: 4.60 (ok), run 7ca37e03"
    assert event_text("live", "every config is claimed; waiting") == "every config is claimed; waiting"
    assert event_text("live", "live") == "live"


def test_the_bar_counts_wirings_in_stage_1_pulses_before_live_trials_then_counts_them():
    from bisect_eagle.cli.study import Display

    events = [("standalone", "standalone 1/5: [:-1]", 0), ("standalone", "standalone 2/5: [1:]", 0),
              ("standalone", "gate (reference 0.5, margin 0.1): 1 of 5 wirings go live: [:-1]", 0),
              ("baseline", "baseline trial (no speculation)", 0), ("live", "live 000: 4.60 (ok), run 7ca37e03", 1)]
    seen = []
    with Display(enabled=True) as display:
        for stage, message, done in events:
            display(StudyProgress(stage=stage, message=message, done=done, total=8, elapsed_s=1.0, max_wall_s=60.0))
            task = display.bar.tasks[0]
            seen.append((task.fields["stage"], task.fields["count"], task.total))
    assert seen == [("standalone", "wiring 1/5", 5), ("standalone", "wiring 2/5", 5), ("standalone", "", None),
                    ("baseline", "", None), ("live", "1/8 live trials", 8)]  # no "0/8 live trials" in stage 1


DRIVER = """
import sys
sys.path.insert(0, {tests!r})
import bisect_eagle.engines
from fake_engine import FakeEngine
bisect_eagle.engines.make_engine = lambda spec, log_dir=None: FakeEngine(sleep_s={sleep})
sys.argv = ["bisect-eagle", "run", {spec!r}, "--max-live-trials", "2"]
from bisect_eagle.cli import main
main()
"""
TIMES = re.compile(r"(\d+:\d\d:\d\d) elapsed, left ([~≤]\d+:\d\d:\d\d)")


def _screen_in_a_pty(tmp_path: Path, sleep_s: float, timeout_s: float = 600) -> list[tuple[float, str]]:
    """Run `run` (tiny spec, 4 standalone samples, fake engine sleeping ``sleep_s`` a trial) in a 120-column
    pseudo-terminal; every line or redraw it writes, with when it was read."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text((ROOT / "experiments" / "tiny.yaml").read_text().replace("samples: 32", "samples: 4"))
    seen, code = screen_in_a_pty(DRIVER.format(tests=str(TESTS), sleep=sleep_s, spec=str(spec)), cwd=tmp_path,
                                 timeout_s=timeout_s)
    assert code in (0, 3), "\n".join(text for _, text in seen[-40:])
    return seen


@pytest.mark.system
def test_the_progress_line_changes_at_least_every_10_s_with_a_slow_engine(tmp_path):
    sleep_s = 12.0  # each baseline and live trial: longer than 10 s without an event
    seen = _screen_in_a_pty(tmp_path, sleep_s)
    changes, last = [], None
    for at, text in seen:
        found = TIMES.search(text)
        if found and found.groups() != last:
            changes.append((at, found.groups()))
            last = found.groups()
    assert len(changes) > 10, seen[-20:]
    gaps = [b[0] - a[0] for a, b in zip(changes, changes[1:], strict=False)]
    assert max(gaps) < 10, max(gaps)
    # between two events (a 12 s trial, no line printed) the time left itself counts down: a timer recomputes it
    timed = [(at, text) for at, text in seen if not TIMES.search(text)]
    (start, _), (end, _) = max(zip(timed, timed[1:], strict=False), key=lambda pair: pair[1][0] - pair[0][0])
    assert end - start >= sleep_s * 0.9
    lefts = {left for at, (_, left) in changes if start < at < end}
    assert len(lefts) >= 5, (lefts, end - start)
    events = [text for _, text in timed]
    assert not [t for t in events if "standalone standalone" in t or "baseline   baseline" in t]
    bars = [text for _, text in seen if TIMES.search(text)]
    first_live = next(i for i, text in enumerate(bars) if text.lstrip("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏ ").startswith("live"))
    assert bars[:first_live] and not [b for b in bars[:first_live] if "live trials" in b]  # no 0/2 in stage 1
    assert any("wiring 1/5" in b for b in bars[:first_live])
    assert "live trials" in bars[first_live]


def test_what_a_command_reads_is_said_on_a_terminal_only():
    import io

    from bisect_eagle.cli.common import reading

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, pipe = Terminal(), io.StringIO()
    reading("reading run 7ca37e03", stream=tty)
    reading("reading run 7ca37e03", stream=pipe)
    assert tty.getvalue() == "… reading run 7ca37e03\n" and pipe.getvalue() == ""


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    """A fake-engine grid study (a duplicate among its trials, a confirmed candidate): its outcome, spec file,
    Optuna study and MLflow store."""
    import optuna
    from fake_engine import FakeEngine, make_spec, search

    from bisect_eagle.spec.load import load_spec
    from bisect_eagle.tracking.runs import Tracking

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    root = tmp_path_factory.mktemp("named")
    path = make_spec(root, "named", ratio=1.5, high=4, budget=8, sampler="grid")
    store = {"storage": f"sqlite:///{root}/optuna.db", "tracking": f"sqlite:///{root}/mlflow.db"}
    out = search(load_spec(path), FakeEngine(), store)
    study = optuna.load_study(storage=store["storage"], study_name=out.study)
    return out, path, study, Tracking.open(out.tracking_uri, "named")


def test_a_trial_has_one_name_in_runs_table_report_mlflow_and_optuna(named, tmp_path):
    """The number in run's table = the Optuna trial number = the number in the MLflow run name = report's."""
    import io

    from rich.console import Console
    from typer.testing import CliRunner

    from bisect_eagle.cli import app
    from bisect_eagle.cli.study import print_outcome

    out, spec, study, tracking = named
    buf = io.StringIO()
    print_outcome(out, Console(file=buf, width=160))
    # a row: its name and state on the first line, its run id's 8 characters under the name
    table = re.findall(r"^│ (live \d{3}) +│.*│ (\w+) +│\n│ ([0-9a-f]{8}) +│", buf.getvalue(), re.M)
    shown = [t for t in study.trials if t.value is not None or "failure_class" in t.user_attrs]
    assert table == [(f"live {t.number:03d}", "duplicate" if "duplicate_of" in t.user_attrs else t.state.name.lower(),
                      (t.user_attrs.get("mlflow_run_id") or t.user_attrs["duplicate_of"])[:8]) for t in shown]
    assert "duplicate" in [state for _, state, _ in table]  # a duplicate keeps its own name, with the run it reused
    measured = {f"live {t.number:03d}": t.user_attrs["mlflow_run_id"] for t in shown if "mlflow_run_id" in t.user_attrs}
    for name, run_id in measured.items():
        run = tracking.get_run(run_id)
        assert run.info.run_name.startswith(f"{name} ids=") and run.data.tags["trial"] == name
    assert {t.user_attrs["name"] for t in study.trials} == {f"live {t.number:03d}" for t in study.trials}
    best = next(name for name, run in measured.items() if run == out.best["run_id"])
    assert f"best: {best} (run {out.best['run_id']})\n" in buf.getvalue()

    done = CliRunner().invoke(app, ["report", str(spec), "--tracking-uri", out.tracking_uri, "--out",
                                    str(tmp_path / "report")])
    assert done.exit_code == 0, done.output
    rows = re.findall(r"^(live \d{3}) ([0-9a-f]{8}) ", done.output, re.M)
    assert sorted(rows) == sorted((name, run[:8]) for name, run in measured.items())
    assert rows[0] == (best, out.best["run_id"][:8])  # best first
    assert f"best: {best} (run {out.best['run_id']})" in done.output
