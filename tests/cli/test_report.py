"""`bisect-eagle report` says which side of the throughput explains the best trial's gap."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bisect_eagle.cli import app
from bisect_eagle.report.study import find_parent, trials_frame
from bisect_eagle.tracking.runs import Tracking

from helpers import split_study


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    root = tmp_path_factory.mktemp("report-split")
    spec, uri, out = split_study(root)  # accept length 2.8 and 193 tok/s against a 220 tok/s target
    tracking = Tracking.open(uri, "split")
    frame = trials_frame(tracking, find_parent(tracking).info.run_id)
    (simulated,) = frame[frame["stage"] == "standalone"]["simulated_accept_length"]
    return root, spec, uri, out, simulated + 1


def report(root, spec, uri, *args: str):
    args = ["report", str(spec), "--tracking-uri", uri, "--out", str(root / "out"), *args]
    done = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert done.exit_code == 0, done.output
    return done.stdout  # stderr (a slow step's activity line) is not the report


def test_the_split_is_printed_under_the_best_trial_with_its_numbers(logged):
    root, spec, uri, out, predicted = logged
    text = report(root, spec, uri)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    head = lines.index("throughput split of live 000 (tok/s = accept length × verify cycles/s):")
    assert lines[head - 1].startswith("  ids=[1, 5, 9] steps=3")  # under the best run's settings
    said = " ".join(" ".join(lines[head + 1 : head + 4]).split())
    cycles, p = out.best["value"] / 2.8, predicted
    assert said.startswith(
        f"accept length 2.8 where the dump (stage 1) predicts {p:.3g} (floor {0.9 * p:.3g}); "
        f"{cycles:.3g} verify cycles/s, {220 / p:.3g} needed for the target's 220.0 tok/s at "
        f"{p:.3g}: the acceptance side"
    )


def test_the_json_carries_the_split(logged):
    root, spec, uri, out, predicted = logged
    split = json.loads(report(root, spec, uri, "--json"))["split"]
    assert split["side"] == "acceptance" and split["trial"] == "live 000"
    assert split["run_id"] == out.best["run_id"] and split["need"] == "the target"
    assert split["accept_length"] == pytest.approx(2.8)
    assert split["predicted_accept_length"] == pytest.approx(predicted)
    assert split["needed_tok_s"] == pytest.approx(220.0)
    assert split["cycles_s"] == pytest.approx(out.best["value"] / 2.8)
    assert split["needed_cycles_s"] == pytest.approx(220.0 / predicted)
    assert split["sentence"].endswith(": the acceptance side")
