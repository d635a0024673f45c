"""What `run` shows while a study runs (`cli/study.py`): the progress line's time estimate and its
words, and, in a pseudo-terminal with a slow fake engine, a progress line that changes at least
every 10 s between events."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest

from bisect_eagle.cli.common import clock
from bisect_eagle.cli.study import Eta, event_text
from bisect_eagle.search.study import StudyProgress

from helpers import screen_in_a_pty

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def event(
    stage: str, *, elapsed: float, done: int = 0, total: int = 8, wall: float = 7200.0
) -> StudyProgress:
    return StudyProgress(
        stage=stage, message="m", done=done, total=total, elapsed_s=elapsed, max_wall_s=wall
    )


def test_clock_is_one_format():
    assert [clock(s) for s in (0, 5.9, 65, 3600, 6593, -3)] == [
        "0:00:00",
        "0:00:05",
        "0:01:05",
        "1:00:00",
        "1:49:53",
        "0:00:00",
    ]


def test_left_is_an_estimate_or_nothing_never_the_wall_budget():
    eta = Eta()
    assert eta.left(0.0) is None and eta.elapsed(0.0) == 0.0
    eta.update(event("standalone", elapsed=10.0, wall=100.0), now=1000.0)
    assert eta.elapsed(1012.0) == pytest.approx(22.0)
    # stage 1: no estimate, and no budget shown as one
    assert eta.left(1000.0) is None and eta.left(1030.0) is None


def test_left_comes_from_the_trial_budget_and_the_measured_trial_times():
    eta = Eta()
    eta.update(event("live", elapsed=100.0), now=0.0)  # live trials begin at study time 100 s
    assert eta.left(0.0) is None  # nothing measured yet
    eta.update(event("live", elapsed=130.0, done=1), now=30.0)
    eta.update(event("live", elapsed=160.0, done=2), now=60.0)  # 30 s a trial, 6 of 8 still allowed
    assert eta.left(60.0) == pytest.approx(180.0)
    assert eta.left(70.0) == pytest.approx(170.0)  # the current trial has run 10 s
    # slower than estimated: no estimate (never the wall budget instead)
    assert eta.left(1000.0) is None
    eta.update(event("confirm", elapsed=170.0, done=2), now=70.0)
    assert eta.left(70.0) is None  # confirmation is not counted in trials
    tight = Eta()
    tight.update(event("live", elapsed=0.0, wall=50.0), now=0.0)
    tight.update(event("live", elapsed=30.0, done=1, wall=50.0), now=30.0)
    # the wall budget ends the study before the estimate: none is shown
    assert tight.left(30.0) is None


def test_an_event_does_not_repeat_its_stage():
    assert event_text("standalone", "standalone 1/5: [:-1]") == "1/5: [:-1]"
    assert event_text("baseline", "baseline trial (no speculation)") == "trial (no speculation)"
    assert event_text("live", "live 003: 4.60 (ok), run 7ca37e03") == "003: 4.60 (ok), run 7ca37e03"
    assert (
        event_text("live", "every config is claimed; waiting") == "every config is claimed; waiting"
    )
    assert event_text("live", "live") == "live"


def test_the_bar_counts_wirings_in_stage_1_pulses_before_live_trials_then_counts_them():
    from bisect_eagle.cli.study import Display

    events = [
        ("standalone", "standalone 1/5: [:-1]", 0),
        ("standalone", "standalone 2/5: [1:]", 0),
        ("standalone", "gate (reference 0.5, margin 0.1): 1 of 5 wirings go live: [:-1]", 0),
        ("baseline", "baseline trial (no speculation)", 0),
        ("live", "live 000: 4.60 (ok), run 7ca37e03", 1),
    ]
    seen = []
    with Display(enabled=True) as display:
        for stage, message, done in events:
            display(
                StudyProgress(
                    stage=stage, message=message, done=done, total=8, elapsed_s=1.0, max_wall_s=60.0
                )
            )
            task = display.bar.tasks[0]
            seen.append((task.fields["stage"], task.fields["count"], task.total))
    assert seen == [
        ("standalone", "wiring 1/5", 5),
        ("standalone", "wiring 2/5", 5),
        ("standalone", "", None),
        ("baseline", "", None),
        ("live", "1/8 trials", 8),
    ]  # no "0/8 trials" in stage 1


DRIVER = """
import os, sys
os.environ["COLUMNS"] = "{columns}"
os.environ["NO_COLOR"] = "1"  # the bar's unfilled part is blank: a full bar is one run of ━
sys.path.insert(0, {tests!r})
import bisect_eagle.engines
from fake_engine import FakeEngine
bisect_eagle.engines.make_engine = lambda spec, log_dir=None: FakeEngine(sleep_s={sleep})
sys.argv = ["bisect-eagle", "run", {spec!r}, "--max-live-trials", "2"]
from bisect_eagle.cli import main
main()
"""
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
BAR = re.compile(
    r"^(?P<spin>[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏✓]) (?P<stage>[a-z]+) .*?(?P<clock>\d+:\d\d:\d\d)"
    r"(?: ~(?P<left>\d+:\d\d:\d\d) left)?$"
)


def _screen_in_a_pty(
    tmp_path: Path, sleep_s: float, *, columns: int = 120, timeout_s: float = 600
) -> list[tuple[float, str]]:
    """Run `run` (tiny spec, 4 standalone samples, fake engine sleeping ``sleep_s`` a trial, 2 live
    trials) in a pseudo-terminal ``columns`` wide; every line or redraw it writes, with when it was
    read."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        (ROOT / "experiments" / "tiny.yaml").read_text().replace("samples: 32", "samples: 4")
    )
    seen, code = screen_in_a_pty(
        DRIVER.format(tests=str(TESTS), sleep=sleep_s, spec=str(spec), columns=columns),
        cwd=tmp_path,
        timeout_s=timeout_s,
    )
    assert code in (0, 3), "\n".join(text for _, text in seen[-40:])
    return seen


def test_at_80_columns_the_progress_line_fits_estimates_or_says_nothing_and_ends_full_and_stopped(
    tmp_path,
):
    seen = _screen_in_a_pty(tmp_path, 2.0, columns=80)
    texts = [text for _, text in seen]
    assert not [t for t in texts if len(t) > 80], [t for t in texts if len(t) > 80]
    bars = [found for text in texts if (found := BAR.match(text))]
    running = [b for b in bars if b["spin"] != "✓"]
    assert running and {b["stage"] for b in running} >= {"standalone", "baseline", "live"}
    assert not [t for t in texts if "≤" in t]  # never the wall budget shown as the time left
    # no estimate outside live trials
    assert all(b["left"] is None for b in running if b["stage"] != "live")
    assert any(b["left"] for b in running)  # an estimate once a live trial was measured
    end = bars[-1]  # the last redraw: the bar full, the spinner stopped, nothing left
    assert end["spin"] == "✓" and end["stage"] == "done" and end["left"] is None, end.string
    assert re.fullmatch(r"✓ done ━+ \d+ trials? best \S+ / target \S+ \d:\d\d:\d\d", end.string), (
        end.string
    )
    assert not [b for b in bars[bars.index(end) :] if b["spin"] in SPINNER]


@pytest.mark.system
def test_the_progress_line_changes_at_least_every_10_s_with_a_slow_engine(tmp_path):
    sleep_s = 12.0  # each baseline and live trial: longer than 10 s without an event
    seen = _screen_in_a_pty(tmp_path, sleep_s)
    changes, last = [], None
    for at, text in seen:
        found = BAR.match(text)
        if found and (found["clock"], found["left"]) != last:
            changes.append((at, found["clock"], found["left"]))
            last = found["clock"], found["left"]
    assert len(changes) > 10, seen[-20:]
    gaps = [b[0] - a[0] for a, b in zip(changes, changes[1:], strict=False)]
    assert max(gaps) < 10, max(gaps)
    # the time left is recomputed at every redraw, between events too (counted down in
    # test_left_comes_from_the_trial_budget_and_the_measured_trial_times); here the search may
    # confirm its winner after its first live trial, so whether an estimate shows depends on the
    # search, not on the display
    timed = [text for _, text in seen if not BAR.match(text)]
    assert not [t for t in timed if "standalone standalone" in t or "baseline   baseline" in t]
    bars = [found for _, text in seen if (found := BAR.match(text))]
    first_live = next(i for i, b in enumerate(bars) if b["stage"] == "live")
    # no 0/2 in stage 1
    assert bars[:first_live] and not [b for b in bars[:first_live] if " trials " in b.string]
    assert any("wiring 1/5" in b.string for b in bars[:first_live])
    assert "/2 trials" in bars[first_live].string


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_an_activity_is_a_live_line_with_a_clock_on_a_terminal_cleared_at_the_end():
    from bisect_eagle.cli.common import Activity

    tty = _Terminal()
    with Activity(stream=tty) as activity:
        activity("reading run 7ca37e03")
        time.sleep(3 * Activity.TICK_S)  # redrawn by its clock
    draws = tty.getvalue().split("\r")
    assert [
        d
        for d in draws
        if re.fullmatch(r"[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏] reading run 7ca37e03  \d:\d\d:\d\d\x1b\[K", d)
    ]
    # cleared: the command's output starts on a clean line
    assert len(draws) >= 3 and draws[-1] == "\x1b[K"


def test_off_a_terminal_an_activity_writes_a_plain_line_once_a_step_lasts(monkeypatch):
    from bisect_eagle.cli.common import Activity

    monkeypatch.setattr(Activity, "QUIET_S", 0.3)
    monkeypatch.setattr(Activity, "UNCHECKED_QUIET_S", 60.0)
    pipe = io.StringIO()
    with Activity(stream=pipe) as activity:
        # before the inputs are checked: a bad input's one line stays alone
        activity("loading the spec")
        time.sleep(1.0)
        assert pipe.getvalue() == ""
        activity.inputs_checked()
        activity("short step")
        activity("reading the runs")
        deadline = time.monotonic() + 60
        while "reading the runs" not in pipe.getvalue() and time.monotonic() < deadline:
            time.sleep(0.1)
    lines = pipe.getvalue().splitlines()
    assert len(lines) == 1 and re.fullmatch(r"\[\d:\d\d:\d\d\] reading the runs", lines[0]), lines


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    """A fake-engine grid study (a duplicate among its trials, a confirmed candidate): its outcome,
    spec file, Optuna study and MLflow store."""
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
    """The number in run's table = the Optuna trial number = the number in the MLflow run name =
    report's."""
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
    assert table == [
        (
            f"live {t.number:03d}",
            "duplicate" if "duplicate_of" in t.user_attrs else t.state.name.lower(),
            (t.user_attrs.get("mlflow_run_id") or t.user_attrs["duplicate_of"])[:8],
        )
        for t in shown
    ]
    # a duplicate keeps its own name, with the run it reused
    assert "duplicate" in [state for _, state, _ in table]
    measured = {
        f"live {t.number:03d}": t.user_attrs["mlflow_run_id"]
        for t in shown
        if "mlflow_run_id" in t.user_attrs
    }
    for name, run_id in measured.items():
        run = tracking.get_run(run_id)
        assert run.info.run_name.startswith(f"{name} ids=") and run.data.tags["trial"] == name
    assert {t.user_attrs["name"] for t in study.trials} == {
        f"live {t.number:03d}" for t in study.trials
    }
    best = next(name for name, run in measured.items() if run == out.best["run_id"])
    assert f"best: {best} (run {out.best['run_id'][:8]})\n" in buf.getvalue()

    done = CliRunner().invoke(
        app,
        [
            "report",
            str(spec),
            "--tracking-uri",
            out.tracking_uri,
            "--out",
            str(tmp_path / "report"),
        ],
    )
    assert done.exit_code == 0, done.output
    rows = re.findall(r"^(live \d{3}) ([0-9a-f]{8}) ", done.output, re.M)
    assert sorted(rows) == sorted((name, run[:8]) for name, run in measured.items())
    assert rows[0] == (best, out.best["run_id"][:8])  # best first
    assert f"best: {best} (run {out.best['run_id'][:8]})" in done.output
